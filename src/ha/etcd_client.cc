#include "ha/etcd_client.h"

#include <arpa/inet.h>

#include "absl/strings/numbers.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc_grpc/grpc_master.h"

namespace fluxon {
namespace {

// Consecutive transport failures after which a channel is replaced (see EtcdClient::Note).
constexpr int kFailuresBeforeNewChannel = 2;

EtcdKeyValue FromProto(const etcdserverpb::KeyValue& kv) {
  return EtcdKeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    const std::vector<std::string>& endpoints, std::chrono::milliseconds deadline,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoint");
  for (const std::string& e : endpoints) {
    const size_t colon = e.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(e.substr(colon + 1), &port) ||
        port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoint '", e, "' is not host:port"));
    }
    // Several members share one channel through gRPC's ipv4: resolver, which takes addresses
    // only (a host name there would fail every call, not this one).
    in_addr addr;
    if (endpoints.size() > 1 && inet_pton(AF_INET, e.substr(0, colon).c_str(), &addr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint '", e, "': with several endpoints each must be an IPv4 address:port"));
    }
  }
  // One channel over every member: gRPC's ipv4/dns resolvers take a comma-separated list, and
  // pick_first moves to the next member when the current one fails.
  const std::string target =
      endpoints.size() == 1 ? endpoints[0] : absl::StrCat("ipv4:", absl::StrJoin(endpoints, ","));
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  return std::unique_ptr<EtcdClient>(new EtcdClient(target, deadline, std::move(credentials)));
}

EtcdClient::EtcdClient(std::string target, std::chrono::milliseconds deadline,
                       std::shared_ptr<grpc::ChannelCredentials> credentials)
    : target_(std::move(target)), deadline_(deadline), credentials_(std::move(credentials)) {}

EtcdClient::Stubs EtcdClient::Current() {
  MutexLock lock(&mu_);
  if (stubs_.channel == nullptr) {
    // Not the control channels' arguments: gRPC takes the minimum reconnect backoff as the time
    // a connection attempt may take until the server's HTTP/2 SETTINGS arrive, and etcd can send
    // them later than the control channels' 100 ms. A local subchannel pool: a replaced channel
    // must not inherit the old one's connection attempts.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stubs_.channel = grpc::CreateCustomChannel(target_, credentials_, args);
    stubs_.kv = etcdserverpb::KV::NewStub(stubs_.channel);
    stubs_.lease = etcdserverpb::Lease::NewStub(stubs_.channel);
  }
  return stubs_;
}

absl::Status EtcdClient::Note(const grpc::Status& s) {
  MutexLock lock(&mu_);
  if (s.ok()) {
    failures_ = 0;
    return absl::OkStatus();
  }
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    if (++failures_ >= kFailuresBeforeNewChannel) {
      stubs_ = Stubs{};  // the next call builds a new channel
      failures_ = 0;
    }
  }
  return FromGrpcStatus(s);
}

void EtcdClient::Arm(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() + deadline_);
}

absl::StatusOr<EtcdClient::Lease> EtcdClient::GrantLease(int64_t ttl_s) {
  grpc::ClientContext ctx;
  Arm(&ctx);
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  if (absl::Status st = Note(Current().lease->LeaseGrant(&ctx, req, &resp)); !st.ok()) return st;
  if (!resp.error().empty()) return absl::UnavailableError("etcd lease grant: " + resp.error());
  return Lease{resp.id(), resp.ttl()};
}

absl::StatusOr<int64_t> EtcdClient::KeepAliveOnce(int64_t lease_id) {
  grpc::ClientContext ctx;
  Arm(&ctx);
  Stubs stubs = Current();
  auto stream = stubs.lease->LeaseKeepAlive(&ctx);
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease_id);
  etcdserverpb::LeaseKeepAliveResponse resp;
  const bool wrote = stream->Write(req);
  stream->WritesDone();
  const bool read = wrote && stream->Read(&resp);
  const grpc::Status s = stream->Finish();
  if (!read) {
    absl::Status st = Note(s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "no answer") : s);
    return absl::UnavailableError(absl::StrCat("etcd keep-alive: ", st.message()));
  }
  (void)Note(grpc::Status::OK);
  if (resp.ttl() <= 0)
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease_id, " is gone"));
  return resp.ttl();
}

absl::Status EtcdClient::RevokeLease(int64_t lease_id) {
  grpc::ClientContext ctx;
  Arm(&ctx);
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease_id);
  etcdserverpb::LeaseRevokeResponse resp;
  return Note(Current().lease->LeaseRevoke(&ctx, req, &resp));
}

absl::StatusOr<EtcdClient::CreateResult> EtcdClient::CreateIfAbsent(const std::string& key,
                                                                    const std::string& value,
                                                                    int64_t lease_id,
                                                                    const KeyValues& attached) {
  grpc::ClientContext ctx;
  Arm(&ctx);
  etcdserverpb::TxnRequest req;
  etcdserverpb::Compare* absent = req.add_compare();
  absent->set_key(key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);  // a key that does not exist has create_revision 0
  etcdserverpb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease_id);
  for (const auto& [k, v] : attached) {
    etcdserverpb::PutRequest* also = req.add_success()->mutable_request_put();
    also->set_key(k);
    also->set_value(v);
    also->set_lease(lease_id);
  }
  req.add_success()->mutable_request_range()->set_key(key);
  req.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse resp;
  if (absl::Status st = Note(Current().kv->Txn(&ctx, req, &resp)); !st.ok()) return st;
  CreateResult out;
  out.created = resp.succeeded();
  for (const etcdserverpb::ResponseOp& op : resp.responses()) {
    if (op.has_response_range() && op.response_range().kvs_size() > 0) {
      out.kv = FromProto(op.response_range().kvs(0));
      return out;
    }
  }
  // Not reached: a transaction is atomic, so the key its compare saw (or its put wrote) is there
  // for its range.
  return absl::UnavailableError(absl::StrCat("etcd key ", key, " vanished inside a transaction"));
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(const std::string& key) {
  grpc::ClientContext ctx;
  Arm(&ctx);
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  etcdserverpb::RangeResponse resp;
  if (absl::Status st = Note(Current().kv->Range(&ctx, req, &resp)); !st.ok()) return st;
  if (resp.kvs_size() == 0) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(FromProto(resp.kvs(0)));
}

absl::StatusOr<std::vector<std::optional<EtcdKeyValue>>> EtcdClient::GetAtOneRevision(
    const std::vector<std::string>& keys) {
  grpc::ClientContext ctx;
  Arm(&ctx);
  etcdserverpb::TxnRequest req;  // no compare: the success branch always runs, atomically
  for (const std::string& k : keys) req.add_success()->mutable_request_range()->set_key(k);
  etcdserverpb::TxnResponse resp;
  if (absl::Status st = Note(Current().kv->Txn(&ctx, req, &resp)); !st.ok()) return st;
  if (resp.responses_size() != static_cast<int>(keys.size())) {
    return absl::UnavailableError(
        absl::StrCat("etcd answered ", resp.responses_size(), " reads for ", keys.size()));
  }
  std::vector<std::optional<EtcdKeyValue>> out;
  for (const etcdserverpb::ResponseOp& op : resp.responses()) {
    if (op.response_range().kvs_size() > 0) {
      out.emplace_back(FromProto(op.response_range().kvs(0)));
    } else {
      out.emplace_back();
    }
  }
  return out;
}

absl::StatusOr<bool> EtcdClient::DeleteIfRevision(const std::string& key, int64_t mod_revision) {
  grpc::ClientContext ctx;
  Arm(&ctx);
  etcdserverpb::TxnRequest req;
  etcdserverpb::Compare* same = req.add_compare();
  same->set_key(key);
  same->set_target(etcdserverpb::Compare::MOD);
  same->set_result(etcdserverpb::Compare::EQUAL);
  same->set_mod_revision(mod_revision);
  req.add_success()->mutable_request_delete_range()->set_key(key);
  etcdserverpb::TxnResponse resp;
  if (absl::Status st = Note(Current().kv->Txn(&ctx, req, &resp)); !st.ok()) return st;
  return resp.succeeded();
}

}  // namespace fluxon
