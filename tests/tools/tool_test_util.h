// Helpers for the operator-tooling tests: running a command line, picking a free TCP port,
// scraping an HTTP endpoint, and putting/getting values through the real client.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fluxon/client.h"
#include "fluxon/plan_blob_abi.h"

namespace fluxon::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

// Runs argv (no shell interpretation of its words) and collects stdout, stderr and exit status.
inline CommandResult RunCommand(const std::vector<std::string>& argv) {
  static std::atomic<int> n{0};
  const std::string err_path =
      "/tmp/fluxon-test/cmd-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".err";
  std::string cmd;
  for (const std::string& a : argv) cmd += ShellQuote(a) + " ";
  cmd += "2>" + ShellQuote(err_path);
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, got);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::stringstream ss;
  ss << err.rdbuf();
  r.err = ss.str();
  std::remove(err_path.c_str());
  return r;
}

// A TCP port on 127.0.0.1 that nothing listened on a moment ago (the kernel's pick for port 0).
inline int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

struct HttpReply {
  int status = 0;
  std::string content_type;
  std::string body;
  std::string error;  // non-empty when the request failed
};

// One HTTP/1.1 request to 127.0.0.1:port, bounded by `timeout` (then error "timed out"): a
// server that accepted the connection and never answers cannot hang the test.
inline HttpReply HttpRequest(int port, const std::string& target,
                             boost::beast::http::verb verb = boost::beast::http::verb::get,
                             std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  HttpReply out;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  http::request<http::empty_body> req(verb, target, 11);
  req.set(http::field::host, "127.0.0.1");
  boost::beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  if (verb == http::verb::head) parser.skip(true);
  boost::system::error_code result = asio::error::would_block;
  socket.async_connect(
      {asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)},
      [&](const boost::system::error_code& ec) {
        if (ec) {
          result = ec;
          return;
        }
        http::async_write(socket, req, [&](const boost::system::error_code& wec, size_t) {
          if (wec) {
            result = wec;
            return;
          }
          http::async_read(socket, buffer, parser,
                           [&](const boost::system::error_code& rec, size_t) { result = rec; });
        });
      });
  io.run_for(timeout);
  if (result == asio::error::would_block) {
    boost::system::error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();  // the aborted handlers
    out.error = "timed out";
    return out;
  }
  if (result) {
    out.error = result.message();
    return out;
  }
  const auto& res = parser.get();
  out.status = res.result_int();
  out.content_type = std::string(res[http::field::content_type]);
  out.body = res.body();
  return out;
}

// Puts `keys` (one batch, values of `value_len` bytes) and waits until their routes are published.
inline absl::Status PutAndWait(KvClient& c, const std::vector<std::string>& keys,
                               int64_t value_len) {
  absl::StatusOr<uint64_t> plan = c.LocalFastPutStart(keys, value_len, PutOptions{});
  if (!plan.ok()) return plan.status();
  const auto* header = reinterpret_cast<const PlanBlobHeader*>(*plan);
  const uint64_t* ptrs = PlanValuePtrs(reinterpret_cast<const void*>(*plan));
  for (uint32_t i = 0; i < header->count; ++i) {
    std::memset(reinterpret_cast<void*>(ptrs[i]), static_cast<int>(i), value_len);
  }
  absl::StatusOr<KvFuture> fut = c.LocalFastPutCommit(*plan);
  if (!fut.ok()) return fut.status();
  return fut->Wait(std::chrono::milliseconds(10'000));
}

// GetStart + GetTransfer + ReleaseViews of `keys`; returns how many keys were transferable.
inline absl::StatusOr<uint32_t> GetAndRelease(KvClient& c, const std::vector<std::string>& keys) {
  absl::StatusOr<GetStartHandle> h = c.GetStart(keys);
  if (!h.ok()) return h.status();
  absl::StatusOr<uint64_t> plan = c.GetTransfer(*h);
  if (!plan.ok()) return plan.status();
  absl::Status released = c.ReleaseViews(*plan);
  if (!released.ok()) return released;
  return h->result.transferable_len;
}

inline std::vector<std::string> NumberedKeys(const std::string& prefix, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

}  // namespace fluxon::testing
