// FaultInjector: named fault points (an RPC such as "master.PublishBatch" or an internal step)
// whose next calls can be delayed, dropped (applied but the response lost), duplicated (applied
// twice) or failed (never applied). Set from the config's `faults:` list or at run time through
// the admin service; used by the tests of A1/A2, T1 and V1.
//
// Invariants: a rule with count N fires exactly N times (count -1: until cleared); rules are
// looked up under one short lock, never held while the fault acts. A delay is a bounded,
// interruptible wait: any Clear ends the delays sleeping at that moment (the operator removed
// the fault), and Shutdown ends them for good (a stopping node never waits out a fault).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/fault_action.h"
#include "common/mutex.h"

namespace fluxon {

// kFail: not delivered (Unavailable, uncertain); kRefuse: not applied and answered with a
// definite error (Internal) — what a server-side failure or an oversized message looks like.
struct FaultRule {
  std::string point;
  FaultAction action = FaultAction::kDelay;
  std::chrono::milliseconds delay{0};
  int count = -1;
};

class FaultInjector {
 public:
  void Set(FaultRule rule);
  void Clear(absl::string_view point);  // empty: every rule
  std::vector<FaultRule> List() const;
  // Consumes one firing of the rule at `point`, if any.
  std::optional<FaultRule> Take(absl::string_view point);
  // Sleeps for a fired delay rule's delay, or until a Clear or Shutdown.
  void Sleep(const FaultRule& fired);
  // Ends every current and future delay at once.
  void Shutdown();

 private:
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<FaultRule> rules_ ABSL_GUARDED_BY(mu_);
  uint64_t clears_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fluxon
