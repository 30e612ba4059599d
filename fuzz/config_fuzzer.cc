// Fuzzes config parsing (src/config/config.cc): ParseConfig on arbitrary YAML text, with fixed
// machine limits so that a run does not depend on the machine. Any text must give a Config or
// an error status: no crash, no uncaught exception (yaml-cpp throws; ParseConfig must catch),
// no UB. A config that is accepted must survive DumpConfig -> ParseConfig with the same dump
// (the resolved config is what `fluxond --check-config` prints and documents).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (64 << 10)) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fluxon::MachineLimits machine;
  machine.physical_memory_bytes = uint64_t{64} << 30;
  absl::StatusOr<fluxon::Config> c = fluxon::ParseConfig(text, machine);
  if (!c.ok()) return 0;
  const std::string dump = fluxon::DumpConfig(*c);
  absl::StatusOr<fluxon::Config> again = fluxon::ParseConfig(dump, machine);
  if (!again.ok()) {
    std::fprintf(stderr, "accepted config does not re-parse from its dump: %s\n--- dump:\n%s\n",
                 again.status().ToString().c_str(), dump.c_str());
    std::abort();
  }
  const std::string dump2 = fluxon::DumpConfig(*again);
  if (dump2 != dump) {
    std::fprintf(stderr, "dump is not stable:\n--- first:\n%s\n--- second:\n%s\n", dump.c_str(),
                 dump2.c_str());
    std::abort();
  }
  return 0;
}
