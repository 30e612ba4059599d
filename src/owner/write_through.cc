#include "owner/write_through.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

absl::Status CopyError(ReplicaGroupEnd end, size_t members) {
  switch (end) {
    case ReplicaGroupEnd::kCopied:
      return absl::OkStatus();
    case ReplicaGroupEnd::kNoSpace:
      return absl::ResourceExhaustedError(absl::StrFormat(
          "write_through: no other node had room for a copy of %d values; the local copy stays "
          "routed",
          members));
    case ReplicaGroupEnd::kGone:
      return absl::AbortedError(absl::StrFormat(
          "write_through: %d values were deleted, evicted or put again before their copy was "
          "made",
          members));
    case ReplicaGroupEnd::kFailed:
      break;
  }
  return absl::UnavailableError(absl::StrFormat(
      "write_through: the remote copy of %d values failed (queue full, the target or the master "
      "unreachable); the local copy stays routed",
      members));
}

}  // namespace

void WriteThroughPut::GroupEnded(ReplicaGroupEnd end, size_t members) {
  {
    MutexLock lock(&mu_);
    ++ended_;
    if (end == ReplicaGroupEnd::kCopied) copied_ += members;
    if (end != ReplicaGroupEnd::kCopied && copy_error_.ok()) copy_error_ = CopyError(end, members);
  }
  MaybeFinish();
}

void WriteThroughPut::Queued(size_t groups) {
  {
    MutexLock lock(&mu_);
    expected_ = groups;
  }
  MaybeFinish();
}

void WriteThroughPut::Published(absl::Status outcome, WriteThroughDone done) {
  tracker_->Register(shared_from_this());  // before it can complete: Forget follows Register
  {
    MutexLock lock(&mu_);
    // A publish that failed before anything was queued (the owner stopping): nothing to wait for.
    if (!expected_ && !outcome.ok()) expected_ = 0;
    published_ = std::move(outcome);
    done_ = std::move(done);
  }
  MaybeFinish();
}

void WriteThroughPut::MaybeFinish() {
  absl::Status own;
  {
    MutexLock lock(&mu_);
    if (finishing_ || !published_ || !expected_ || ended_ < *expected_) return;
    finishing_ = true;
    own = !published_->ok() ? *published_ : copy_error_;
    // A member the replica queue dropped before asking (no longer held) ends no group: every
    // value of the put must have been copied.
    if (own.ok() && copied_ < keys_.size()) {
      own = CopyError(ReplicaGroupEnd::kGone, keys_.size() - copied_);
    }
  }
  if (!own.ok() || parent_key_.empty()) {
    Finish(std::move(own));
    return;
  }
  // The parent rule: follow a parent still in flight here, else ask the master.
  if (std::shared_ptr<WriteThroughPut> parent = tracker_->InFlight(parent_key_);
      parent != nullptr && parent.get() != this) {
    parent->AddDependent(shared_from_this());
    return;
  }
  ParentFinished(tracker_->BackedElsewhere(parent_key_)
                     ? absl::OkStatus()
                     : absl::FailedPreconditionError("the parent is not backed on another node"));
}

void WriteThroughPut::AddDependent(std::shared_ptr<WriteThroughPut> child) {
  std::optional<absl::Status> done;
  {
    MutexLock lock(&mu_);
    if (result_) {
      done = *result_;
    } else {
      dependents_.push_back(std::move(child));
      return;
    }
  }
  child->ParentFinished(*done);
}

void WriteThroughPut::ParentFinished(const absl::Status& parent) {
  if (parent.ok()) {
    Finish(absl::OkStatus());
    return;
  }
  Finish(absl::FailedPreconditionError(absl::StrFormat(
      "write_through: parent_key '%s' is not backed on another node (%s): this batch's copies "
      "are made but it is not reported backed",
      parent_key_, parent.message())));
}

void WriteThroughPut::Finish(absl::Status status) {
  WriteThroughDone done;
  std::vector<std::shared_ptr<WriteThroughPut>> dependents;
  {
    MutexLock lock(&mu_);
    if (result_) return;
    result_ = status;
    done = std::move(done_);
    dependents.swap(dependents_);
  }
  tracker_->Forget(*this);
  if (!status.ok()) spdlog::warn("{}", status.ToString());
  if (done) done(status);
  for (const std::shared_ptr<WriteThroughPut>& d : dependents) d->ParentFinished(status);
}

std::shared_ptr<WriteThroughPut> WriteThroughTracker::Start(std::vector<std::string> keys,
                                                            std::string parent_key) {
  return std::make_shared<WriteThroughPut>(this, std::move(keys), std::move(parent_key));
}

void WriteThroughTracker::Register(const std::shared_ptr<WriteThroughPut>& put) {
  MutexLock lock(&mu_);
  ++puts_;
  for (const std::string& k : put->keys_) by_key_[k] = put;
}

void WriteThroughTracker::Forget(const WriteThroughPut& put) {
  MutexLock lock(&mu_);
  for (const std::string& k : put.keys_) {
    auto it = by_key_.find(k);
    if (it == by_key_.end()) continue;
    std::shared_ptr<WriteThroughPut> p = it->second.lock();
    if (p == nullptr || p.get() == &put) by_key_.erase(it);
  }
  if (puts_ > 0) --puts_;
}

size_t WriteThroughTracker::in_flight() const {
  MutexLock lock(&mu_);
  return puts_;
}

std::shared_ptr<WriteThroughPut> WriteThroughTracker::InFlight(const std::string& key) const {
  MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second.lock();
}

bool WriteThroughTracker::BackedElsewhere(const std::string& key) const {
  v1::LookupRequest req;
  req.add_keys(key);
  req.set_with_liveness(true);
  absl::StatusOr<v1::LookupReply> r = master_->Lookup(req);
  if (!r.ok() || r->found_size() != 1 || !r->found(0)) return false;
  const uint32_t me = registration_->identity().node_id;
  // Backed: a location on another node whose owner could serve it now (a dead owner's location
  // is still routed until its lease and grace pass, but backs nothing).
  for (const auto& l : r->routes(0).locations()) {
    if (l.node_id() != me && l.live()) return true;
  }
  return false;
}

}  // namespace fluxon
