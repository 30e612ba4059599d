// SelectingPolicy: online choice among eviction experts by miniature simulation (an experiment of
// the generalisation suite; see docs/perf.md). Every expert type replays the access stream the
// live policy sees in a simulated cache of the live capacity, with the replay's prefix
// semantics; the live cache is ranked by the expert whose simulation has had the best recent hit
// rate (a switch rebuilds it from the cohorts held, coldest first). Nothing the operator sets
// chooses the expert: only what the owner observes.
//
// What the live policy sees of a prompt: Touch(ids) of its restored prefix (tail first; the same
// ids again for the read after the probe) and Insert(id, after, refresh=true) of the pages put
// after it, chained by `after`. A prompt is rebuilt from that: a Touch of other ids, or an Insert
// that does not continue the prompt being built, starts the next one. Content is named by the
// cohorts' fingerprints (a cohort id lives one admission; its content comes back under a new id).
// The simulations count pages, each of weight 1, against the most weight the live tier has held:
// right for the replays here (every page one cohort of weight 1), not for a tier whose cohorts
// weigh their bytes (the owner would pass each prompt's weights along).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace fluxon {

struct SelectingOptions {
  // Recent hit rates: an exponentially weighted average over prompts with this half-life.
  double half_life_prompts = 256;
  // A switch needs the best simulation ahead of the live expert's by this many points...
  double switch_margin = 1.0;
  // ... judged every this many prompts.
  uint32_t judge_every = 32;
  // Every expert also ranks the live cache (following the leader's evictions), so a switch
  // keeps what the new leader learned; otherwise a switch rebuilds it from the cohorts held.
  bool followers = true;
  // Sampling: the simulations see only the pages whose fingerprint hashes into a fraction R of
  // the hash space, against R of the capacity (as miniature-cache work does), with R the largest
  // that keeps at most `sampled_pages` pages in each simulation (1: every page while the capacity
  // is at most that). 0: no sampling.
  uint64_t sampled_pages = 0;
};

namespace selecting_internal {

// The sampling hash of a fingerprint (splitmix64's finaliser): uniform over 64 bits.
inline uint64_t SampleHash(uint64_t fp) {
  fp += 0x9e3779b97f4a7c15ULL;
  fp = (fp ^ (fp >> 30)) * 0xbf58476d1ce4e5b9ULL;
  fp = (fp ^ (fp >> 27)) * 0x94d049bb133111ebULL;
  return fp ^ (fp >> 31);
}

// A cache of `capacity` weight ranked by P, fed whole prompts (content fingerprints, in order).
template <typename P>
class Sim {
 public:
  // The sample shrinks to the fingerprints hashing below `threshold`: the others leave.
  void Shrink(uint64_t threshold) {
    std::vector<uint64_t> out;
    for (const auto& [fp, id] : resident_) {
      if (SampleHash(fp) >= threshold) out.push_back(fp);
    }
    for (uint64_t fp : out) {
      const uint64_t id = resident_.at(fp);
      policy_.Erase(id);
      resident_.erase(fp);
      fp_of_.erase(id);
      --count_;
    }
  }
  void Access(const std::vector<uint64_t>& prompt, uint64_t capacity, double decay) {
    ++clock_;
    size_t prefix = 0;
    while (prefix < prompt.size() && resident_.contains(prompt[prefix])) ++prefix;
    if (prefix > 0) {
      std::vector<uint64_t> ids;
      ids.reserve(prefix);
      for (size_t i = prefix; i-- > 0;) ids.push_back(resident_.at(prompt[i]));
      policy_.Touch(ids, clock_);    // the probe
      policy_.Touch(ids, ++clock_);  // the read
    }
    hits_ = hits_ * decay + static_cast<double>(prefix);
    requested_ = requested_ * decay + static_cast<double>(prompt.size());
    uint64_t after = prefix > 0 ? resident_.at(prompt[prefix - 1]) : 0;
    ++clock_;
    for (size_t i = prefix; i < prompt.size(); ++i) {
      auto held = resident_.find(prompt[i]);
      if (held != resident_.end()) {  // stored past a missing page: kept as it is
        after = held->second;
        continue;
      }
      while (count_ + 1 > capacity) {
        std::optional<uint64_t> v = policy_.Coldest(clock_);
        if (!v) break;
        policy_.Evict(*v);
        auto f = fp_of_.find(*v);
        if (f != fp_of_.end()) {
          resident_.erase(f->second);
          fp_of_.erase(f);
        }
        --count_;
      }
      if (count_ + 1 > capacity) break;
      const uint64_t id = next_id_++;
      policy_.Insert(id, after, clock_, /*refresh=*/true, prompt[i], 1);
      resident_[prompt[i]] = id;
      fp_of_[id] = prompt[i];
      ++count_;
      after = id;
    }
  }
  double hit_rate() const { return requested_ > 0 ? 100.0 * hits_ / requested_ : 0; }

 private:
  P policy_;
  absl::flat_hash_map<uint64_t, uint64_t> resident_;  // fingerprint -> id
  absl::flat_hash_map<uint64_t, uint64_t> fp_of_;     // id -> fingerprint
  uint64_t next_id_ = 1, clock_ = 0, count_ = 0;
  double hits_ = 0, requested_ = 0;
};

}  // namespace selecting_internal

// Experts: policy types with the HotTier interface, default-constructible; the first ranks the
// live cache until a simulation says otherwise.
template <typename... Experts>
class SelectingPolicy {
 public:
  static constexpr size_t kExperts = sizeof...(Experts);

  explicit SelectingPolicy(SelectingOptions options = {})
      : options_(options), decay_(std::pow(0.5, 1.0 / options.half_life_prompts)) {
    std::get<0>(all_) = std::make_unique<std::tuple_element_t<0, std::tuple<Experts...>>>();
    if (options_.followers) {
      std::apply([](auto&... p) { ((p = p ? std::move(p) : MakeLike(p)), ...); }, all_);
    }
  }
  SelectingPolicy(const SelectingPolicy&) = delete;
  SelectingPolicy& operator=(const SelectingPolicy&) = delete;

  void Insert(uint64_t id, uint64_t after, uint64_t now, bool refresh, uint64_t fingerprint = 0,
              uint64_t weight = 1) {
    ForEach([&](auto& p) { p->Insert(id, after, now, refresh, fingerprint, weight); });
    now_ = std::max(now_, now);
    const uint64_t fp = fingerprint != 0 ? fingerprint : id;
    members_[id] = Member{fp, weight, after};
    recency_.push_back(id);
    pos_[id] = std::prev(recency_.end());
    weight_ += weight;
    capacity_ = std::max(capacity_, weight_);
    if (!refresh) return;
    if (building_ && after != 0 && after == last_id_) {
      prompt_.push_back(fp);
    } else {
      Flush();
      building_ = true;
      prompt_ = {fp};
    }
    last_id_ = id;
  }
  void Touch(const std::vector<uint64_t>& ids, uint64_t now) {
    ForEach([&](auto& p) { p->Touch(ids, now); });
    now_ = std::max(now_, now);
    for (uint64_t id : ids) {
      auto it = pos_.find(id);
      if (it != pos_.end()) recency_.splice(recency_.end(), recency_, it->second);
    }
    if (ids == last_touch_) return;  // the read after the probe: the same access
    last_touch_ = ids;
    Flush();
    building_ = true;
    prompt_.clear();
    for (size_t i = ids.size(); i-- > 0;) {
      auto m = members_.find(ids[i]);
      if (m != members_.end()) prompt_.push_back(m->second.fp);
    }
    last_id_ = ids.empty() ? 0 : ids.front();
  }
  void Erase(uint64_t id) {
    ForEach([&](auto& p) { p->Erase(id); });
    Forget(id);
  }
  void Evict(uint64_t id) {
    ForEach([&](auto& p) { p->Evict(id); });
    Forget(id);
  }
  uint64_t Predecessor(uint64_t id) const {
    uint64_t out = 0;
    OnLeader([&](const auto& p) { out = p->Predecessor(id); });
    return out;
  }
  std::optional<uint64_t> Coldest(uint64_t now) {
    std::optional<uint64_t> out;
    OnLeader([&](auto& p) { out = p->Coldest(now); });
    return out;
  }

  size_t live_expert() const { return leader_; }
  // The simulations' recent hit rates, in expert order.
  std::array<double, kExperts> simulated_hit_rates() const {
    return Rates(std::index_sequence_for<Experts...>{});
  }
  uint64_t switches() const { return switches_; }

 private:
  struct Member {
    uint64_t fp = 0;
    uint64_t weight = 0;
    uint64_t after = 0;
  };

  template <typename Ptr>
  static Ptr MakeLike(const Ptr&) {
    return std::make_unique<typename Ptr::element_type>();
  }
  template <typename F>
  void ForEach(F f) {
    std::apply([&](auto&... p) { ((p ? f(p) : void()), ...); }, all_);
  }
  template <typename F>
  void OnLeader(F f) const {
    size_t i = 0;
    std::apply([&](const auto&... p) { ((i++ == leader_ ? f(p) : void()), ...); }, all_);
  }

  void Forget(uint64_t id) {
    auto m = members_.find(id);
    if (m == members_.end()) return;
    weight_ -= m->second.weight;
    members_.erase(m);
    auto it = pos_.find(id);
    recency_.erase(it->second);
    pos_.erase(it);
  }

  void Flush() {
    if (!building_ || prompt_.empty()) return;
    building_ = false;
    const std::vector<uint64_t>* seen = &prompt_;
    uint64_t capacity = capacity_;
    if (options_.sampled_pages > 0) {
      Resample();
      if (threshold_ != ~uint64_t{0}) {
        sampled_.clear();
        for (uint64_t fp : prompt_) {
          if (selecting_internal::SampleHash(fp) < threshold_) sampled_.push_back(fp);
        }
        if (sampled_.empty()) return;
        seen = &sampled_;
        capacity = std::max<uint64_t>(1, static_cast<uint64_t>(rate_ * capacity_ + 0.5));
      }
    }
    std::apply([&](auto&... sim) { (sim.Access(*seen, capacity, decay_), ...); }, sims_);
    if (++prompts_ % options_.judge_every == 0) Judge();
  }

  // Lowers the sampling rate when the capacity has grown past twice the sample's size (so the
  // simulations hold about `sampled_pages` to twice that), dropping what leaves the sample.
  void Resample() {
    if (rate_ * static_cast<double>(capacity_) <= 2.0 * options_.sampled_pages) return;
    rate_ = static_cast<double>(options_.sampled_pages) / static_cast<double>(capacity_);
    threshold_ = static_cast<uint64_t>(rate_ * 18446744073709551615.0);
    std::apply([&](auto&... sim) { (sim.Shrink(threshold_), ...); }, sims_);
  }

  template <size_t... I>
  std::array<double, kExperts> Rates(std::index_sequence<I...>) const {
    return {std::get<I>(sims_).hit_rate()...};
  }

  void Judge() {
    const auto rates = Rates(std::index_sequence_for<Experts...>{});
    const size_t live = leader_;
    size_t best = live;
    for (size_t i = 0; i < kExperts; ++i) {
      if (rates[i] > rates[best]) best = i;
    }
    if (best == live || rates[best] < rates[live] + options_.switch_margin) return;
    if (options_.followers) {
      leader_ = best;
      ++switches_;
      return;
    }
    SwitchTo(best, std::index_sequence_for<Experts...>{});
  }

  template <size_t... I>
  void SwitchTo(size_t to, std::index_sequence<I...>) {
    ((I == to ? (Rebuild<I>(), 0) : 0), ...);
  }

  // The new expert ranks what is held: every cohort inserted coldest first, its predecessor in
  // the old ranking (when still held) before it.
  template <size_t I>
  void Rebuild() {
    using P = std::tuple_element_t<I, std::tuple<Experts...>>;
    auto fresh = std::make_unique<P>();
    absl::flat_hash_map<uint64_t, uint64_t> pred;
    for (uint64_t id : recency_) pred[id] = Predecessor(id);
    absl::flat_hash_set<uint64_t> done;
    std::vector<uint64_t> stack;
    for (uint64_t id : recency_) {
      stack.push_back(id);
      while (!stack.empty()) {
        const uint64_t top = stack.back();
        if (done.contains(top)) {
          stack.pop_back();
          continue;
        }
        const uint64_t before = pred[top];
        if (before != 0 && members_.contains(before) && !done.contains(before)) {
          stack.push_back(before);
          continue;
        }
        stack.pop_back();
        const Member& m = members_.at(top);
        fresh->Insert(top, members_.contains(before) ? before : 0, now_, /*refresh=*/false, m.fp,
                      m.weight);
        done.insert(top);
      }
    }
    std::apply([](auto&... p) { ((p.reset()), ...); }, all_);
    std::get<I>(all_) = std::move(fresh);
    leader_ = I;
    ++switches_;
  }

  SelectingOptions options_;
  double decay_;
  std::tuple<std::unique_ptr<Experts>...> all_;  // the leader's, or (followers) every one
  size_t leader_ = 0;
  std::tuple<selecting_internal::Sim<Experts>...> sims_;
  absl::flat_hash_map<uint64_t, Member> members_;
  std::list<uint64_t> recency_;  // coldest first
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> pos_;
  uint64_t weight_ = 0, capacity_ = 0;
  std::vector<uint64_t> prompt_;       // content of the prompt being rebuilt
  std::vector<uint64_t> sampled_;      // its sampled pages
  double rate_ = 1;                    // the sampling rate ...
  uint64_t threshold_ = ~uint64_t{0};  // ... as a hash threshold (all ones: every page)
  bool building_ = false;
  uint64_t last_id_ = 0;
  std::vector<uint64_t> last_touch_;
  uint64_t prompts_ = 0, switches_ = 0, now_ = 0;
};

}  // namespace fluxon
