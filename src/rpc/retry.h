// RetryUncertain: the one retry loop for master calls whose outcome may be unknown (A2/T1: a
// response that may have been applied is not a failure — retry the same identity).
//
// Calls `call()` until its status is not retryable (by default: IsUncertain — Unavailable or
// DeadlineExceeded), backing off 25 ms, 50 ms, ... up to 1 s between attempts. `on_retry(status,
// backoff)` runs before each sleep (log, count). Stops, returning the last result, when `stop`
// ends a sleep early (the owner is stopping) or after `max_attempts` (0: unbounded).
#pragma once

#include <algorithm>
#include <chrono>

#include "common/stop_signal.h"
#include "rpc/master_api.h"

namespace fluxon {

struct RetryOptions {
  std::chrono::milliseconds initial_backoff{25};
  std::chrono::milliseconds max_backoff{1000};
  int max_attempts = 0;  // 0: until the outcome is certain or `stop`
};

namespace retry_internal {
inline absl::Status StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace retry_internal

template <typename Call, typename OnRetry, typename Retryable>
auto RetryUncertain(Call&& call, StopSignal* stop, OnRetry&& on_retry, Retryable&& retryable,
                    RetryOptions options = {}) -> decltype(call()) {
  auto backoff = options.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    auto result = call();
    const absl::Status status = retry_internal::StatusOf(result);
    if (status.ok() || !retryable(status)) return result;
    if (options.max_attempts > 0 && attempt >= options.max_attempts) return result;
    on_retry(status, backoff);
    if (!stop->SleepFor(backoff)) return result;
    backoff = std::min(backoff * 2, options.max_backoff);
  }
}

template <typename Call, typename OnRetry>
auto RetryUncertain(Call&& call, StopSignal* stop, OnRetry&& on_retry, RetryOptions options = {})
    -> decltype(call()) {
  return RetryUncertain(
      std::forward<Call>(call), stop, std::forward<OnRetry>(on_retry),
      [](const absl::Status& s) { return IsUncertain(s); }, options);
}

// RetryUncertain bounded by a deadline: an uncertain outcome is retried while `deadline` (a
// time point of any clock) has not passed; then the last result is returned.
template <typename Call, typename Deadline>
auto RetryUncertainUntil(Call&& call, StopSignal* stop, Deadline deadline) -> decltype(call()) {
  using DeadlineClock = typename Deadline::clock;
  return RetryUncertain(
      std::forward<Call>(call), stop, [](const absl::Status&, std::chrono::milliseconds) {},
      [&](const absl::Status& s) { return IsUncertain(s) && DeadlineClock::now() < deadline; });
}

}  // namespace fluxon
