// Error conventions. Every fallible call returns absl::Status / absl::StatusOr; no exception
// crosses a module boundary. Errors that callers must tell apart carry a small typed payload so
// the Python layer can map them to exception classes without parsing messages.
#pragma once

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"

namespace fluxon {

// Payload URL naming the stage at which a local-reserve claim gave up: "claim_turn" (waiting
// behind earlier claims) or "refill" (our turn, but no free slot appeared in time).
inline constexpr absl::string_view kClaimStagePayload = "type.fluxon.io/claim_stage";

inline absl::Status WithPayload(absl::Status status, absl::string_view url,
                                absl::string_view value) {
  status.SetPayload(url, absl::Cord(value));
  return status;
}

inline std::optional<std::string> PayloadOf(const absl::Status& status, absl::string_view url) {
  auto cord = status.GetPayload(url);
  if (!cord) return std::nullopt;
  return std::string(*cord);
}

}  // namespace fluxon

#define FLUXON_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status fluxon_status_ = (expr);          \
    if (!fluxon_status_.ok()) return fluxon_status_; \
  } while (0)

#define FLUXON_CONCAT_INNER(a, b) a##b
#define FLUXON_CONCAT(a, b) FLUXON_CONCAT_INNER(a, b)
#define FLUXON_ASSIGN_OR_RETURN(lhs, expr) \
  FLUXON_ASSIGN_OR_RETURN_IMPL(FLUXON_CONCAT(fluxon_statusor_, __LINE__), lhs, expr)
#define FLUXON_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(*tmp)
