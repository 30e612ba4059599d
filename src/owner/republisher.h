// Republisher: the owner's soft-state route recovery. Routes live only in the master's memory;
// when a master restarts (a new epoch in its answers) or expires this owner (a new generation),
// the routes it held for this owner are gone while the values are still here. The republisher
// offers every Committed value to the master again, batched and rate-bounded, while the owner
// keeps serving local hits.
//
// Invariants:
// - Idempotent by identity: each value is published as (key, put_id, this node, the current
//   generation, offset, len) — a retry or a second round is a republish (T1). A value another
//   version of the key has superseded at the master meanwhile is dropped here (its bytes are
//   no longer what the key names) even while a reader holds it: it leaves the index at once,
//   so no new reader gets it, and its slot is freed when the last reader releases its view;
//   a copy of the routed version joins the route as a copy.
// - Never resurrects: only values Committed in the key index are offered, each pinned while its
//   publish is in flight (so eviction cannot mark it meanwhile); a value deleted or evicted
//   before the scan is not in the index, one being evicted is not pinnable and is skipped.
// - Bounded: at most Options::batch_keys values per PublishBatch, at most
//   Options::values_per_second values a second; every master call is retried while uncertain
//   with backoff and abandoned when the owner stops (the round is then due again).
// - A round that could not finish (master unreachable again, generation refused) leaves the
//   republish due, so it runs again; registered() tells the operator the state meanwhile.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/stop_signal.h"
#include "owner/evictor.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "rpc/master_api.h"

namespace fluxon {

class Republisher {
 public:
  struct Options {
    size_t batch_keys = 4096;
    uint64_t values_per_second = 500'000;
  };
  Republisher(Options options, MasterRegistration* registration, MasterApi* master, KeyIndex* keys,
              Evictor* evictor, OwnerCounters* counters, StopSignal* stop)
      : options_(options),
        registration_(registration),
        master_(master),
        keys_(keys),
        evictor_(evictor),
        counters_(counters),
        stop_(stop) {}

  // The actor: runs a round whenever one is due, until stopping.
  void Run();
  // One round over every Committed value; false when it could not finish.
  bool RunRound();

 private:
  struct Offered {
    std::string key;
    uint64_t put_id = 0;
    uint64_t version = 0;
    bool copy = false;
    uint64_t offset = 0;
    uint64_t len = 0;
  };
  struct Tally {
    uint64_t published = 0, dropped = 0, skipped = 0;
  };
  // One PublishBatch of `chunk` (each value pinned for the call); false when the round must stop
  // (the master refused or stayed uncertain, or the generation was renewed meanwhile).
  bool RepublishChunk(std::span<const Offered> chunk, Tally* tally);
  const Options options_;
  MasterRegistration* const registration_;
  MasterApi* const master_;
  KeyIndex* const keys_;
  Evictor* const evictor_;
  OwnerCounters* const counters_;
  StopSignal* const stop_;
};

}  // namespace fluxon
