// A master candidate as its own process, for the election tests: campaigns through
// MasterElection and writes what it believes into a state file every 20 ms (written to a
// temporary name and renamed, so a reader sees whole lines):
//   seq=<n> leader_now=<0|1> epoch=<LeaderEpoch()> observed=<value>@<epoch>
// It publishes "<VALUE>-admin" as its admin address (ha/leader_record.h).
// SIGTERM: Stop() (the lease is revoked) and exit 0.
//
// Usage: election_candidate ENDPOINTS(comma-separated) KEY VALUE TTL_S STATE_FILE
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_split.h"
#include "ha/master_election.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnTerm(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s ENDPOINTS KEY VALUE TTL_S STATE_FILE\n", argv[0]);
    return 2;
  }
  std::signal(SIGTERM, OnTerm);
  fluxon::ElectionOptions o;
  o.endpoints = absl::StrSplit(argv[1], ',');
  o.key = argv[2];
  o.value = argv[3];
  o.admin_address = std::string(argv[3]) + "-admin";
  o.ttl_s = std::atoi(argv[4]);
  o.poll_interval = std::chrono::milliseconds(100);
  const std::string state = argv[5];
  auto election = fluxon::MasterElection::Start(o);
  if (!election.ok()) {
    std::fprintf(stderr, "%s\n", election.status().ToString().c_str());
    return 1;
  }
  for (uint64_t seq = 1; !g_stop; ++seq) {
    const fluxon::Leadership seen = (*election)->Observed();
    {
      std::ofstream f(state + ".tmp", std::ios::trunc);
      f << "seq=" << seq << " leader_now=" << ((*election)->IsLeaderNow() ? 1 : 0)
        << " epoch=" << (*election)->LeaderEpoch() << " observed=" << seen.value << "@"
        << seen.epoch << "\n";
    }
    std::rename((state + ".tmp").c_str(), state.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  (*election)->Stop();
  return 0;
}
