#include "common/fault_injector.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace fluxon {

void FaultInjector::Set(FaultRule rule) {
  MutexLock lock(&mu_);
  auto it = std::find_if(rules_.begin(), rules_.end(),
                         [&](const FaultRule& r) { return r.point == rule.point; });
  if (it != rules_.end()) {
    *it = std::move(rule);
  } else {
    rules_.push_back(std::move(rule));
  }
}

void FaultInjector::Clear(absl::string_view point) {
  MutexLock lock(&mu_);
  ++clears_;
  cv_.SignalAll();
  if (point.empty()) {
    rules_.clear();
    return;
  }
  rules_.erase(std::remove_if(rules_.begin(), rules_.end(),
                              [&](const FaultRule& r) { return r.point == point; }),
               rules_.end());
}

void FaultInjector::Sleep(const FaultRule& fired) {
  const auto deadline = std::chrono::steady_clock::now() + fired.delay;
  MutexLock lock(&mu_);
  const uint64_t clears_at_start = clears_;
  while (!shut_down_ && clears_ == clears_at_start) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;
  }
}

void FaultInjector::Shutdown() {
  MutexLock lock(&mu_);
  shut_down_ = true;
  rules_.clear();
  cv_.SignalAll();
}

std::vector<FaultRule> FaultInjector::List() const {
  MutexLock lock(&mu_);
  return rules_;
}

std::optional<FaultRule> FaultInjector::Take(absl::string_view point) {
  MutexLock lock(&mu_);
  for (auto it = rules_.begin(); it != rules_.end(); ++it) {
    if (it->point != point) continue;
    FaultRule fired = *it;
    if (it->count > 0 && --it->count == 0) rules_.erase(it);
    return fired;
  }
  return std::nullopt;
}

}  // namespace fluxon
