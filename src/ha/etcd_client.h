// EtcdClient: the few etcd v3 calls the master election needs (proto/etcd/etcd_rpc.proto), over
// one gRPC channel to the cluster's endpoints (the channel fails over between them).
//
// Invariants: every call has a deadline; a transport failure is Unavailable or
// DeadlineExceeded (the caller decides whether to retry); nothing here retries on its own.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "etcd/etcd_rpc.grpc.pb.h"

namespace fluxon {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

class EtcdClient {
 public:
  // `endpoints`: host:port of each member (IPv4 literals when there are several). `deadline`
  // bounds every call. `credentials`: TLS to etcd (null: plaintext).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      const std::vector<std::string>& endpoints,
      std::chrono::milliseconds deadline = std::chrono::seconds(2),
      std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  struct Lease {
    int64_t id = 0;
    int64_t ttl_s = 0;
  };
  absl::StatusOr<Lease> GrantLease(int64_t ttl_s);
  // Refreshes the lease once; its remaining TTL in seconds (NotFound: the lease is gone).
  absl::StatusOr<int64_t> KeepAliveOnce(int64_t lease_id);
  absl::Status RevokeLease(int64_t lease_id);

  // Creates `key` = `value` attached to `lease` if the key does not exist, and in the same
  // transaction each of `attached` (key, value) on the same lease: they appear, and go with the
  // lease, together. Returns whether this call created the key and the key as it is afterwards
  // (this call's or the existing holder's).
  struct CreateResult {
    bool created = false;
    EtcdKeyValue kv;
  };
  using KeyValues = std::vector<std::pair<std::string, std::string>>;
  absl::StatusOr<CreateResult> CreateIfAbsent(const std::string& key, const std::string& value,
                                              int64_t lease_id, const KeyValues& attached = {});
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key);
  // Reads several keys at one revision (one transaction): a consistent snapshot of them.
  absl::StatusOr<std::vector<std::optional<EtcdKeyValue>>> GetAtOneRevision(
      const std::vector<std::string>& keys);
  // Deletes `key` only while its mod_revision is `mod_revision` (a holder giving up what it
  // holds, never a successor's key); true when deleted.
  absl::StatusOr<bool> DeleteIfRevision(const std::string& key, int64_t mod_revision);

 private:
  struct Stubs {
    std::shared_ptr<grpc::Channel> channel;
    std::shared_ptr<etcdserverpb::KV::Stub> kv;
    std::shared_ptr<etcdserverpb::Lease::Stub> lease;
  };
  EtcdClient(std::string target, std::chrono::milliseconds deadline,
             std::shared_ptr<grpc::ChannelCredentials> credentials);
  void Arm(grpc::ClientContext* ctx) const;
  // The current channel's stubs (a new channel after failures: see Note).
  Stubs Current();
  // Notes a call's outcome. A channel whose calls keep failing is replaced: a gRPC channel that
  // lost its etcd member (restart, kill) was seen never to finish another connection to it
  // (every attempt waits for etcd's HTTP/2 SETTINGS until it times out), while a new one
  // connects at once.
  absl::Status Note(const grpc::Status& s);

  const std::string target_;
  const std::chrono::milliseconds deadline_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  Mutex mu_;
  Stubs stubs_ ABSL_GUARDED_BY(mu_);
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fluxon
