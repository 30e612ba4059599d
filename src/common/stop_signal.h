// StopSignal: a component's "stopping" flag that sleeping loops observe. SleepFor returns early
// (false) once Stop was called, so retry backoffs and periodic actors end at once on shutdown.
#pragma once

#include <atomic>
#include <chrono>

#include "common/mutex.h"

namespace fluxon {

class StopSignal {
 public:
  void Stop() {
    MutexLock lock(&mu_);
    stopped_.store(true, std::memory_order_release);
    cv_.SignalAll();
  }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  // Sleeps up to `d`; false when stopping (at once if already stopped).
  bool SleepFor(std::chrono::milliseconds d) {
    const auto deadline = std::chrono::steady_clock::now() + d;
    MutexLock lock(&mu_);
    while (!stopped()) {
      if (!cv_.WaitUntil(&mu_, deadline)) break;
    }
    return !stopped();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::atomic<bool> stopped_{false};
};

}  // namespace fluxon
