// LeadershipTerm: whether a master candidate leads now, judged by the local monotonic clock
// only. The candidate's lease is valid until (the time the last answered keep-alive was sent) +
// (the TTL etcd returned) - margin; etcd starts that TTL later than the send, so the estimate is
// early, never late.
//
// Invariants:
// - A term ends for good the first moment its lease estimate runs out: Leads() never turns true
//   again within one term. A keep-alive answered after that moment (sent before it, answered
//   late; or etcd back from an outage with the lease still alive) does not revive it — the
//   elected master dropped its route table when it saw the term end, and the owners only
//   republish to a leadership of a new epoch, so a revived term would serve an empty table
//   under an epoch they already filled. The candidate gives the lease up instead and campaigns
//   again: the next term is a new key, a larger create_revision, a new epoch.
// - The owner of a LeadershipTerm serialises its calls (MasterElection holds its mutex).
#pragma once

#include <chrono>
#include <cstdint>

namespace fluxon {

class LeadershipTerm {
 public:
  using Clock = std::chrono::steady_clock;

  // A lease was granted (a request sent at `sent`, answered with `ttl`): the campaign's lease,
  // not yet a term.
  void Granted(Clock::time_point sent, std::chrono::seconds ttl, std::chrono::milliseconds margin) {
    leading_ = false;
    ended_ = false;
    valid_until_ = sent + ttl - margin;
  }

  // A keep-alive sent at `sent` was answered at `now` with `ttl`. False when the term had
  // already ended by the local clock before the answer came: it stays ended (see above).
  bool Renewed(Clock::time_point sent, std::chrono::seconds ttl, std::chrono::milliseconds margin,
               Clock::time_point now) {
    if (leading_ && now >= valid_until_) ended_ = true;
    if (ended_) {
      leading_ = false;
      return false;
    }
    valid_until_ = sent + ttl - margin;
    return true;
  }

  // The key names this candidate's lease: a term of `epoch` begins, unless the lease estimate
  // has already run out (false: the lease must be given up, not led with).
  bool Begin(int64_t epoch, Clock::time_point now) {
    if (ended_ || now >= valid_until_) {
      ended_ = true;
      return false;
    }
    leading_ = true;
    epoch_ = epoch;
    return true;
  }

  // The term (or the campaign's lease) is given up.
  void End() {
    leading_ = false;
    ended_ = true;
  }

  // True when the lease estimate has run out (the caller gives the lease up).
  bool Expired(Clock::time_point now) const { return now >= valid_until_; }
  bool Leads(Clock::time_point now) const { return leading_ && !ended_ && now < valid_until_; }
  // True once Begin succeeded within this lease, whether or not it still leads.
  bool leading() const { return leading_; }
  int64_t epoch() const { return epoch_; }

 private:
  bool leading_ = false;  // a term began on this lease
  bool ended_ = false;    // ... and ended: the lease is no longer led with
  Clock::time_point valid_until_{};
  int64_t epoch_ = 0;
};

}  // namespace fluxon
