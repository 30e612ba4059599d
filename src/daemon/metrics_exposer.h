// MetricsExposer: serves the Prometheus text exposition (format 0.0.4) of a set of
// prometheus-cpp collectables at GET /metrics over HTTP, through prometheus-cpp's Exposer
// (civetweb, kMetricsThreads worker threads, one request per connection so that no idle
// connection holds a worker or delays Stop, a slow request dropped after 10 s, gzip when the
// scraper accepts it).
//
// Invariants:
// - Start returns either an exposer already bound to address:port (port 0: one the kernel picks;
//   port() says which) or an error Status: InvalidArgument for an address that is not an IP
//   literal, for an IPv6 one where civetweb was built without IPv6 (Debian 12's is), or for a
//   port out of range, Unavailable when the address cannot be bound (the reason
//   civetweb gave, e.g. "Address already in use"). No exception leaves this module.
// - GET /metrics (any query string) answers 200 "text/plain; charset=utf-8" with the page;
//   other paths and methods get civetweb's 404. The page also carries prometheus-cpp's own
//   scrape statistics (exposer_transferred_bytes_total, exposer_scrapes_total,
//   exposer_request_latencies).
// - Collect() of the collectables runs on a civetweb worker thread, one scrape at a time; after
//   Stop() returns it is never called again (what the collectables read may then be torn down).
//   Stop() returns once the scrapes in progress end (civetweb checks for a stop at least every
//   2 s while it waits for a slow client); Stop() and the destructor are not to be called
//   concurrently with each other.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace fluxon {

class MetricsExposer {
 public:
  static constexpr int kMetricsThreads = 4;

  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(
      const std::string& address, int port,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);
  ~MetricsExposer();
  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;

  void Stop();
  // The bound port (still answered after Stop()).
  int port() const { return port_; }

 private:
  MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer,
                 std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
                 std::string local_address, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  const std::string local_address_;  // the bound address as a connect() target
  const int port_;
};

}  // namespace fluxon
