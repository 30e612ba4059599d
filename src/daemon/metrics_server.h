// MetricsServer: a minimal HTTP/1.1 server (Boost.Beast, one I/O thread) that answers
// GET /metrics with the page its producer renders, for Prometheus to scrape.
//
// Invariants:
// - GET and HEAD of "/metrics" (any query string) answer 200 with Content-Type
//   "text/plain; version=0.0.4; charset=utf-8"; "/" answers a pointer to /metrics; other paths
//   answer 404 and other methods 405. Keep-alive is honoured; an idle or slow connection is
//   closed after 10 s.
// - The producer runs on the server's thread, one scrape at a time; after Stop() returns it is
//   never called again (the owner of what the producer reads may then be torn down).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fluxon {

class MetricsServer {
 public:
  using Producer = std::function<std::string()>;

  // Binds `address:port` (port 0: one the kernel picks; see port()).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address, int port,
                                                              Producer producer);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  void Stop();
  int port() const;

  class Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
