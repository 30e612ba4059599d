// SystemdNotifier: fluxond's side of the systemd service notify protocol (sd_notify(3),
// sd_watchdog_enabled(3)), through libsystemd. The units in systemd/ are Type=notify with
// WatchdogSec=; this is what they talk to.
//
// Invariants:
// - Outside a notify unit (no NOTIFY_SOCKET in the environment) every call is a no-op and no
//   thread starts: the daemon behaves as it does without systemd. The environment is read, never
//   unset, so later messages (STOPPING=1, WATCHDOG=1) still find the socket.
// - READY=1 is sent at most once, by NotifyReady; fluxond calls it only after FluxonNode::Start
//   returned, when every listener (client socket, gRPC, metrics) already accepts connections.
// - The watchdog thread runs only when the manager asked for one (sd_watchdog_enabled() > 0:
//   WATCHDOG_USEC is set and WATCHDOG_PID is unset or this process). It sends WATCHDOG=1 every
//   half of that interval (watchdog_period()), and each ping follows a health probe of the same
//   round that passed. A probe that fails or overruns withholds the ping, so a wedged node misses
//   the manager's deadline and is restarted (Restart=on-failure). The probe is given a deadline
//   (probe_deadline(): half the period, at most kMaxProbeDeadline) and must return within it.
// - StopWatchdog (also called by NotifyStopping and the destructor) wakes the thread at once and
//   joins it within a bound: the probe deadline plus kJoinSlack (one datagram send). A thread not
//   done by then is detached and logged; everything it touches is shared with it, so that stays
//   memory-safe. No ping is sent once a stop was requested (the ping is sent under the mutex).
// - NotifyStopping first ends the pings (no WATCHDOG=1 follows STOPPING=1), then sends
//   STOPPING=1 at once, then joins the thread: systemd stops enforcing the watchdog once the
//   service is stopping, so a long shutdown is bounded by TimeoutStopSec= instead.
// - One thread (fluxond's main thread) calls the public methods; the watchdog thread shares only
//   the state behind its mutex. Threads inherit the caller's signal mask: fluxond blocks
//   SIGTERM/SIGINT before constructing this, so the watchdog thread never takes them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"

namespace fluxon {

class SystemdNotifier {
 public:
  // Checks the node's health within `deadline`; OK means "ping".
  using HealthProbe = std::function<absl::Status(std::chrono::milliseconds deadline)>;

  static constexpr std::chrono::milliseconds kMaxProbeDeadline{5000};
  static constexpr std::chrono::milliseconds kJoinSlack{1000};

  // Reads NOTIFY_SOCKET and the watchdog settings once.
  SystemdNotifier();
  ~SystemdNotifier();
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // True when NOTIFY_SOCKET is set (a service manager listens).
  bool enabled() const { return enabled_; }
  // Half the interval sd_watchdog_enabled reported; zero when no watchdog was asked for.
  std::chrono::microseconds watchdog_period() const { return period_; }
  // The deadline each probe gets: half the period, at most kMaxProbeDeadline.
  std::chrono::milliseconds probe_deadline() const;

  // READY=1 with STATUS=<status> (once; later calls send only the status).
  void NotifyReady(std::string_view status);
  // STATUS=<status>.
  void NotifyStatus(std::string_view status);
  // STOPPING=1 with STATUS=<status>, then StopWatchdog().
  void NotifyStopping(std::string_view status);

  // Starts the watchdog thread when watchdog_period() is non-zero; returns whether it started.
  // `ready_status` is re-sent as STATUS= when the node is healthy again after a failed probe.
  bool StartWatchdog(HealthProbe probe, std::string ready_status);
  void StopWatchdog();

  struct WatchdogState;

 private:
  void Send(const std::string& message);
  // Sets the thread's stop flag (it sends no ping after this returns); does not wait.
  void RequestWatchdogStop();

  bool enabled_ = false;
  bool ready_sent_ = false;
  std::chrono::microseconds period_{0};
  std::shared_ptr<WatchdogState> watchdog_;
  std::thread thread_;
};

}  // namespace fluxon
