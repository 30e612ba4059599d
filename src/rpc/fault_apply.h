// ApplyFault: the one place an RPC's fault rule acts, for every fault-injecting decorator
// (FaultInjectingMaster, FaultInjectingPeers). At `point`: drop = the call is applied but its
// response is lost (Unavailable); duplicate = applied twice; fail = never applied (Unavailable);
// refuse = never applied, a definite error (Internal); delay = applied after a sleep that ends
// early when the rule is cleared or the injector shuts down. No rule: the call as is.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/fault_injector.h"

namespace fluxon {

template <typename Call>
auto ApplyFault(FaultInjector* faults, const char* point, Call call) -> decltype(call()) {
  std::optional<FaultRule> rule = faults->Take(point);
  if (!rule) return call();
  switch (rule->action) {
    case FaultAction::kDelay:
      faults->Sleep(*rule);
      return call();
    case FaultAction::kDrop: {
      auto applied = call();
      (void)applied;
      return absl::UnavailableError(std::string("injected fault: response of ") + point +
                                    " dropped");
    }
    case FaultAction::kDuplicate: {
      auto first = call();
      (void)first;
      return call();
    }
    case FaultAction::kFail:
      return absl::UnavailableError(std::string("injected fault: ") + point + " not delivered");
    case FaultAction::kRefuse:
      return absl::InternalError(std::string("injected fault: ") + point + " refused");
  }
  return call();
}

}  // namespace fluxon
