// The seam between the verbs transport and libibverbs: exactly the verbs calls the transport uses.
// Two implementations: MakeIbverbsApi() (libibverbs; compiled here, never run: no machine we have
// has an RDMA device) and EmulatedFabric (verbs_emulator.h: in-process, enforces the semantics).
//
// Handles are opaque non-zero integers. Every call returns a Status; none throws.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fluxon::transport::verbs {

using Handle = uint64_t;

enum Access : uint32_t {
  kLocalWrite = 1,
  kRemoteWrite = 2,
  kRemoteRead = 4,
};

enum class WrOpcode : uint8_t { kRdmaWrite, kRdmaRead };
enum class QpState : uint8_t { kReset, kInit, kRtr, kRts, kError };
enum class WcStatus : uint8_t {
  kSuccess,
  kLocalProtectionError,
  kRemoteAccessError,
  kRetryExceeded,  // the responder did not answer (dead or unreachable peer)
  kFlushError,     // the QP was in the error state: the WR was not executed
  kGeneralError,
};
const char* WcStatusName(WcStatus s);

struct MrInfo {
  Handle mr = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

// What a peer needs to connect its RC QP to ours.
struct QpAddress {
  uint32_t qp_num = 0;
  uint16_t lid = 0;
  std::array<uint8_t, 16> gid{};
  uint32_t psn = 0;
};

struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kRdmaRead;
  uint64_t local_addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  bool signaled = false;
};

struct WorkCompletion {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  uint32_t qp_num = 0;
};

class VerbsApi {
 public:
  virtual ~VerbsApi() = default;
  virtual absl::StatusOr<std::vector<std::string>> ListDevices() = 0;
  // Opens `name` (empty: the first device).
  virtual absl::StatusOr<Handle> OpenDevice(const std::string& name) = 0;
  virtual absl::Status CloseDevice(Handle context) = 0;
  virtual absl::StatusOr<Handle> AllocPd(Handle context) = 0;
  virtual absl::Status DeallocPd(Handle pd) = 0;
  virtual absl::StatusOr<MrInfo> RegisterMr(Handle pd, void* addr, uint64_t len,
                                            uint32_t access) = 0;
  virtual absl::Status DeregisterMr(Handle mr) = 0;
  virtual absl::StatusOr<Handle> CreateCq(Handle context, int depth) = 0;
  virtual absl::Status DestroyCq(Handle cq) = 0;
  virtual absl::StatusOr<Handle> CreateRcQp(Handle pd, Handle send_cq, uint32_t max_send_wr) = 0;
  virtual absl::Status DestroyQp(Handle qp) = 0;
  virtual absl::StatusOr<QpAddress> LocalAddress(Handle qp) = 0;
  virtual absl::Status ModifyQpToInit(Handle qp, uint32_t access) = 0;
  virtual absl::Status ModifyQpToRtr(Handle qp, const QpAddress& remote) = 0;
  virtual absl::Status ModifyQpToRts(Handle qp, uint32_t psn) = 0;
  virtual absl::Status ModifyQpToError(Handle qp) = 0;
  // One ibv_post_send of the whole list (linked work requests).
  virtual absl::Status PostSend(Handle qp, std::span<const SendWr> list) = 0;
  // Returns how many completions were written to `out` (0: none ready).
  virtual absl::StatusOr<int> PollCq(Handle cq, std::span<WorkCompletion> out) = 0;
};

// libibverbs behind the seam.
std::unique_ptr<VerbsApi> MakeIbverbsApi();

}  // namespace fluxon::transport::verbs
