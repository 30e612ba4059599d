// The fault actions of the fault injector (common/fault_injector.h) and their names: the one list
// the config's `faults:` entries, fluxonctl's `fault set` and the admin service check against.
// Header-only, so the config parser and fluxonctl use it without linking the injector.
#pragma once

#include <array>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace fluxon {

// delay: applied after a sleep; drop: applied, the response lost (Unavailable); duplicate:
// applied twice; fail: never applied (Unavailable); refuse: never applied, a definite error.
enum class FaultAction { kDelay, kDrop, kDuplicate, kFail, kRefuse };

inline constexpr std::array<FaultAction, 5> kFaultActions = {
    FaultAction::kDelay, FaultAction::kDrop, FaultAction::kDuplicate, FaultAction::kFail,
    FaultAction::kRefuse};

inline const char* FaultActionName(FaultAction a) {
  switch (a) {
    case FaultAction::kDelay:
      return "delay";
    case FaultAction::kDrop:
      return "drop";
    case FaultAction::kDuplicate:
      return "duplicate";
    case FaultAction::kFail:
      return "fail";
    case FaultAction::kRefuse:
      return "refuse";
  }
  return "unknown";
}

// "delay, drop, duplicate, fail, refuse".
inline std::string FaultActionList() {
  return absl::StrJoin(kFaultActions, ", ",
                       [](std::string* out, FaultAction a) { out->append(FaultActionName(a)); });
}

inline absl::StatusOr<FaultAction> ParseFaultAction(absl::string_view name) {
  for (FaultAction a : kFaultActions) {
    if (name == FaultActionName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("fault action '", name, "' is not one of ", FaultActionList()));
}

}  // namespace fluxon
