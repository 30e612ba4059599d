#include "transport/batch.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace fluxon::transport {

Clock::time_point DeadlineAfter(absl::Duration timeout) {
  timeout = std::clamp(timeout, absl::Milliseconds(1), absl::Hours(24));
  return Clock::now() + absl::ToChronoNanoseconds(timeout);
}

BatchState::BatchState(uint64_t id, PeerId peer, OpKind op, std::span<const Descriptor> descriptors,
                       Clock::time_point deadline)
    : id_(id),
      peer_(std::move(peer)),
      op_(op),
      descriptors_(descriptors.begin(), descriptors.end()),
      deadline_(deadline),
      bytes_done_(descriptors.size(), 0),
      errors_(descriptors.size()) {}

void BatchState::RecordPiece(uint32_t index, uint64_t bytes, const absl::Status& status) {
  MutexLock lock(&mu_);
  if (index >= errors_.size()) return;
  if (!status.ok()) {
    if (errors_[index].ok()) errors_[index] = status;
    return;
  }
  bytes_done_[index] += bytes;
}

void BatchState::FinishUnit() {
  {
    MutexLock lock(&mu_);
    if (done_ || units_remaining_ == 0) {
      spdlog::critical("transport: batch {} finished more units than it has", id_);
      std::abort();  // a transport bug: completion bookkeeping is the safety net of every buffer
    }
    if (--units_remaining_ > 0) return;
    result_.descriptors.resize(descriptors_.size());
    result_.bytes_ok = 0;
    size_t failed = 0;
    absl::Status first_error;
    for (size_t i = 0; i < descriptors_.size(); ++i) {
      absl::Status s = errors_[i];
      if (s.ok() && bytes_done_[i] != descriptors_[i].len) {
        s = aborted_ ? abort_status_
                     : absl::InternalError(absl::StrCat("descriptor ", i, " moved ", bytes_done_[i],
                                                        " of ", descriptors_[i].len, " bytes"));
      }
      if (s.ok()) {
        result_.bytes_ok += descriptors_[i].len;
      } else {
        if (failed++ == 0) first_error = s;
      }
      result_.descriptors[i] = std::move(s);
    }
    if (aborted_) {
      result_.status = abort_status_;
    } else if (failed > 0) {
      result_.status = absl::Status(
          first_error.code(), absl::StrCat(failed, " of ", descriptors_.size(),
                                           " descriptors failed; first: ", first_error.message()));
    }
    done_ = true;
    done_cv_.SignalAll();
  }
  if (completion_hook_) completion_hook_();
}

bool BatchState::Abort(absl::Status status) {
  {
    MutexLock lock(&mu_);
    if (done_ || aborted_) return false;
    aborted_ = true;
    abort_status_ = std::move(status);
  }
  if (abort_hook_) abort_hook_();
  return true;
}

bool BatchState::aborted() const {
  MutexLock lock(&mu_);
  return aborted_;
}

absl::Status BatchState::abort_status() const {
  MutexLock lock(&mu_);
  return abort_status_;
}

bool BatchState::Done() const {
  MutexLock lock(&mu_);
  return done_;
}

bool BatchState::WaitFor(absl::Duration timeout) {
  const auto until = Clock::now() + absl::ToChronoNanoseconds(std::min(timeout, absl::Hours(24)));
  MutexLock lock(&mu_);
  while (!done_) {
    if (!done_cv_.WaitUntil(&mu_, until) && Clock::now() >= until) return done_;
  }
  return true;
}

const BatchResult& BatchState::Wait() {
  MutexLock lock(&mu_);
  while (!done_) done_cv_.WaitUntil(&mu_, Clock::now() + std::chrono::seconds(1));
  return result_;
}

// ---------------------------------------------------------------------------------------------

BatchRegistry::BatchRegistry() : reaper_([this] { ReaperLoop(); }) {}

BatchRegistry::~BatchRegistry() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    if (!live_.empty()) {
      spdlog::critical("transport: {} batches still live at registry destruction", live_.size());
      std::abort();
    }
    cv_.SignalAll();
  }
  reaper_.join();
}

std::shared_ptr<BatchState> BatchRegistry::Create(const PeerId& peer, OpKind op,
                                                  std::span<const Descriptor> descriptors,
                                                  absl::Duration timeout) {
  const Clock::time_point deadline = DeadlineAfter(timeout);
  uint64_t id;
  {
    MutexLock lock(&mu_);
    id = next_id_++;
  }
  auto batch = std::make_shared<BatchState>(id, peer, op, descriptors, deadline);
  batch->SetCompletionHook([this, id, deadline] { OnComplete(id, deadline); });
  return batch;
}

void BatchRegistry::Arm(const std::shared_ptr<BatchState>& batch) {
  MutexLock lock(&mu_);
  live_.emplace(batch->id(), batch);
  deadlines_.emplace(batch->deadline(), batch->id());
  cv_.SignalAll();
}

void BatchRegistry::OnComplete(uint64_t id, Clock::time_point deadline) {
  std::shared_ptr<BatchState> last_ref;  // dropped outside the lock
  MutexLock lock(&mu_);
  auto it = live_.find(id);
  if (it != live_.end()) {
    last_ref = std::move(it->second);
    live_.erase(it);
  }
  deadlines_.erase({deadline, id});
  completed_.fetch_add(1, std::memory_order_relaxed);
  cv_.SignalAll();
}

void BatchRegistry::AbortAll(const absl::Status& status) {
  std::vector<std::shared_ptr<BatchState>> batches;
  {
    MutexLock lock(&mu_);
    for (auto& [id, b] : live_) batches.push_back(b);
  }
  for (auto& b : batches) b->Abort(status);
}

bool BatchRegistry::WaitAllDone(absl::Duration timeout) {
  const auto until = Clock::now() + absl::ToChronoNanoseconds(timeout);
  MutexLock lock(&mu_);
  while (!live_.empty()) {
    if (Clock::now() >= until) return false;
    cv_.WaitUntil(&mu_, until);
  }
  return true;
}

uint64_t BatchRegistry::outstanding() const {
  MutexLock lock(&mu_);
  return live_.size();
}

void BatchRegistry::ReaperLoop() {
  for (;;) {
    std::vector<std::shared_ptr<BatchState>> expired;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      auto wake = Clock::now() + std::chrono::seconds(1);
      if (!deadlines_.empty()) wake = std::min(wake, deadlines_.begin()->first);
      cv_.WaitUntil(&mu_, wake);
      if (stopping_) return;
      const auto now = Clock::now();
      while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
        auto it = live_.find(deadlines_.begin()->second);
        if (it != live_.end()) expired.push_back(it->second);
        deadlines_.erase(deadlines_.begin());
      }
    }
    for (auto& b : expired) {
      b->Abort(absl::DeadlineExceededError(
          absl::StrCat("batch ", b->id(), " to ", b->peer().address, " passed its deadline")));
    }
  }
}

// ---------------------------------------------------------------------------------------------

uint64_t BatchHandle::id() const { return state_ ? state_->id() : 0; }
bool BatchHandle::Done() const { return !state_ || state_->Done(); }
bool BatchHandle::WaitFor(absl::Duration timeout) const {
  return !state_ || state_->WaitFor(timeout);
}
const BatchResult& BatchHandle::Wait() const {
  static const BatchResult* const kEmpty =
      new BatchResult{absl::FailedPreconditionError("empty BatchHandle"), {}, 0};
  return state_ ? state_->Wait() : *kEmpty;
}
void BatchHandle::Cancel() const {
  if (state_)
    state_->Abort(absl::CancelledError(absl::StrCat("batch ", state_->id(), " cancelled")));
}

absl::StatusOr<BatchHandle> Transport::Submit(const PeerId& peer, OpKind op,
                                              std::span<const Descriptor> descriptors,
                                              absl::Duration timeout) {
  if (closing_.load()) return absl::CancelledError("transport shutting down");
  if (op != OpKind::kRead && op != OpKind::kWrite) return absl::InvalidArgumentError("bad op");
  if (descriptors.empty()) return absl::InvalidArgumentError("empty batch");
  if (descriptors.size() > kMaxDescriptorsPerBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat(descriptors.size(), " descriptors, at most ", kMaxDescriptorsPerBatch));
  }
  if (!region_.registered()) {
    return absl::FailedPreconditionError("register a local region before submitting");
  }
  for (size_t i = 0; i < descriptors.size(); ++i) {
    const Descriptor& d = descriptors[i];
    if (d.len == 0 || d.len > kMaxDescriptorBytes) {
      return absl::InvalidArgumentError(absl::StrCat("descriptor ", i, ": length ", d.len,
                                                     " outside [1, ", kMaxDescriptorBytes, "]"));
    }
    absl::Status s = region_.CheckLocal(d.local_addr, d.len);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("descriptor ", i, ": ", s.message()));
    }
  }
  return DoSubmit(peer, op, descriptors, timeout);
}

TransportStats Transport::stats() const {
  TransportStats s;
  const RegionView v = region_.view();
  s.region_registered = region_.registered();
  s.region_generation = v.generation;
  s.serving_active_requests = region_.active_leases();
  AddStats(&s);
  return s;
}

absl::StatusOr<std::string> ChooseTransport(std::span<const std::string> local,
                                            std::span<const std::string> remote) {
  for (const std::string& name : local) {
    if (std::find(remote.begin(), remote.end(), name) != remote.end()) return name;
  }
  return absl::NotFoundError(absl::StrCat("no common transport: local offers {",
                                          absl::StrJoin(local, ", "), "}, peer offers {",
                                          absl::StrJoin(remote, ", "), "}"));
}

}  // namespace fluxon::transport
