// FaultInjectingPeers: a PeerApi decorator that applies the FaultInjector's rules at the fault
// points "peer.<Method>" (rpc/fault_apply.h says what each action does): a dropped
// PullReplicas answer is the lost answer of a pull the target did run.
#pragma once

#include "rpc/fault_apply.h"
#include "rpc/peer_api.h"

namespace fluxon {

class FaultInjectingPeers final : public PeerApi {
 public:
  FaultInjectingPeers(PeerApi* inner, FaultInjector* faults) : inner_(inner), faults_(faults) {}

  absl::StatusOr<v1::PullReplicasReply> PullReplicas(const std::string& peer_address,
                                                     const v1::PullReplicasRequest& r,
                                                     std::chrono::milliseconds timeout) override {
    return ApplyFault(faults_, "peer.PullReplicas",
                      [&] { return inner_->PullReplicas(peer_address, r, timeout); });
  }
  absl::StatusOr<v1::DropCopiesReply> DropCopies(const std::string& peer_address,
                                                 const v1::DropCopiesRequest& r,
                                                 std::chrono::milliseconds timeout) override {
    return ApplyFault(faults_, "peer.DropCopies",
                      [&] { return inner_->DropCopies(peer_address, r, timeout); });
  }
  void Cancel() override { inner_->Cancel(); }

 private:
  PeerApi* const inner_;
  FaultInjector* const faults_;
};

}  // namespace fluxon
