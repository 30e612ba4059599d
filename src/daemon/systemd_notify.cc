#include "daemon/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/mutex.h"
#include "spdlog/spdlog.h"

namespace fluxon {

namespace {

using Clock = std::chrono::steady_clock;

// One notify message; a failed send is logged (it cannot be retried usefully: the manager reads
// the socket or it does not) and never fatal.
void SendNotify(const std::string& message) {
  const int r = sd_notify(/*unset_environment=*/0, message.c_str());
  if (r < 0) spdlog::warn("sd_notify({}) failed: {}", message, std::strerror(-r));
}

// A STATUS= value on one line: the protocol separates fields with newlines.
std::string OneLine(std::string_view text) {
  std::string out(text);
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

}  // namespace

struct SystemdNotifier::WatchdogState {
  Mutex mu;
  CondVar cv;
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool exited ABSL_GUARDED_BY(mu) = false;
  uint64_t pings ABSL_GUARDED_BY(mu) = 0;
  HealthProbe probe;
  std::string ready_status;
  std::chrono::microseconds period{0};
  std::chrono::milliseconds probe_deadline{0};
};

namespace {

void WatchdogLoop(std::shared_ptr<SystemdNotifier::WatchdogState> s) {
  bool healthy = true;
  Clock::time_point next = Clock::now();
  for (;;) {
    {
      MutexLock lock(&s->mu);
      while (!s->stop && Clock::now() < next) s->cv.WaitUntil(&s->mu, next);
      if (s->stop) break;
    }
    const Clock::time_point round = Clock::now();
    const absl::Status health = s->probe(s->probe_deadline);
    const bool overran = Clock::now() - round > s->probe_deadline + std::chrono::milliseconds(50);
    // Every message is sent under the mutex: once a stop is requested (under it), none follows.
    MutexLock lock(&s->mu);
    if (s->stop) break;
    if (health.ok() && !overran) {
      if (!healthy) {
        spdlog::warn("watchdog: node healthy again, pinging");
        SendNotify("STATUS=" + s->ready_status);
      }
      healthy = true;
      SendNotify("WATCHDOG=1");
      ++s->pings;
    } else {
      if (healthy) {
        const std::string why =
            health.ok() ? "health probe overran its deadline" : std::string(health.message());
        spdlog::error("watchdog: node unhealthy ({}); withholding WATCHDOG=1", why);
        SendNotify("STATUS=unhealthy: " + OneLine(why));
      }
      healthy = false;
    }
    next += s->period;
    // Behind schedule (a slow probe): the next round starts one period from now, not at once.
    if (next <= Clock::now()) next = Clock::now() + s->period;
  }
  MutexLock lock(&s->mu);
  s->exited = true;
  s->cv.SignalAll();
}

}  // namespace

SystemdNotifier::SystemdNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  enabled_ = socket != nullptr && socket[0] != '\0';
  if (!enabled_) return;
  uint64_t usec = 0;
  const int r = sd_watchdog_enabled(/*unset_environment=*/0, &usec);
  if (r < 0) {
    spdlog::warn("sd_watchdog_enabled: {}; running without the watchdog", std::strerror(-r));
  } else if (r > 0 && usec > 0) {
    period_ = std::chrono::microseconds(usec / 2);
  }
}

SystemdNotifier::~SystemdNotifier() { StopWatchdog(); }

std::chrono::milliseconds SystemdNotifier::probe_deadline() const {
  const auto half = std::chrono::duration_cast<std::chrono::milliseconds>(period_ / 2);
  return std::clamp(half, std::chrono::milliseconds(1), kMaxProbeDeadline);
}

void SystemdNotifier::Send(const std::string& message) {
  if (enabled_) SendNotify(message);
}

void SystemdNotifier::NotifyReady(std::string_view status) {
  if (!enabled_) return;
  if (ready_sent_) {
    NotifyStatus(status);
    return;
  }
  ready_sent_ = true;
  Send("READY=1\nSTATUS=" + OneLine(status));
}

void SystemdNotifier::NotifyStatus(std::string_view status) { Send("STATUS=" + OneLine(status)); }

void SystemdNotifier::NotifyStopping(std::string_view status) {
  // No WATCHDOG=1 after STOPPING=1: the stop is requested first (at once), joined after.
  RequestWatchdogStop();
  Send("STOPPING=1\nSTATUS=" + OneLine(status));
  StopWatchdog();
}

void SystemdNotifier::RequestWatchdogStop() {
  if (!watchdog_) return;
  MutexLock lock(&watchdog_->mu);
  watchdog_->stop = true;
  watchdog_->cv.SignalAll();
}

bool SystemdNotifier::StartWatchdog(HealthProbe probe, std::string ready_status) {
  if (!enabled_ || period_.count() == 0 || watchdog_) return false;
  watchdog_ = std::make_shared<WatchdogState>();
  watchdog_->probe = std::move(probe);
  watchdog_->ready_status = OneLine(ready_status);
  watchdog_->period = period_;
  watchdog_->probe_deadline = probe_deadline();
  thread_ = std::thread(WatchdogLoop, watchdog_);
  spdlog::info("watchdog: WATCHDOG=1 every {} ms while the node is healthy (probe deadline {} ms)",
               period_.count() / 1000, watchdog_->probe_deadline.count());
  return true;
}

void SystemdNotifier::StopWatchdog() {
  if (!watchdog_) return;
  RequestWatchdogStop();
  std::shared_ptr<WatchdogState> s = std::move(watchdog_);
  bool exited = false;
  uint64_t pings = 0;
  {
    MutexLock lock(&s->mu);
    const Clock::time_point deadline = Clock::now() + s->probe_deadline + kJoinSlack;
    while (!s->exited) {
      if (!s->cv.WaitUntil(&s->mu, deadline)) break;
    }
    exited = s->exited;
    pings = s->pings;
  }
  if (exited) {
    thread_.join();
    spdlog::info("watchdog stopped after {} pings", pings);
  } else {
    spdlog::error("watchdog thread did not stop within {} ms; detached",
                  (s->probe_deadline + kJoinSlack).count());
    thread_.detach();
  }
}

}  // namespace fluxon
