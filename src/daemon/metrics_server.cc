#include "daemon/metrics_server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kIdleTimeout = std::chrono::seconds(10);
constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

http::response<http::string_body> Answer(const http::request<http::string_body>& req,
                                         const MetricsServer::Producer& producer) {
  http::response<http::string_body> res;
  res.version(req.version());
  res.set(http::field::server, "fluxond");
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    res.result(http::status::method_not_allowed);
    res.set(http::field::allow, "GET, HEAD");
    res.set(http::field::content_type, "text/plain; charset=utf-8");
    res.body() = "only GET and HEAD are served\n";
  } else if (path == "/metrics") {
    res.result(http::status::ok);
    res.set(http::field::content_type, kExpositionContentType);
    res.body() = producer();
  } else if (path == "/") {
    res.result(http::status::ok);
    res.set(http::field::content_type, "text/plain; charset=utf-8");
    res.body() = "fluxond: Prometheus metrics are at /metrics\n";
  } else {
    res.result(http::status::not_found);
    res.set(http::field::content_type, "text/plain; charset=utf-8");
    res.body() = "not found; metrics are at /metrics\n";
  }
  res.keep_alive(req.keep_alive());
  res.prepare_payload();
  if (req.method() == http::verb::head) res.body().clear();  // Content-Length stays
  return res;
}

// One connection: read a request, write its answer, repeat while the client keeps it alive.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket socket, const MetricsServer::Producer* producer)
      : stream_(std::move(socket)), producer_(producer) {}

  void Read() {
    request_ = {};
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, request_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->Close();
                       self->Write();
                     });
  }

 private:
  void Write() {
    response_ = Answer(request_, *producer_);
    // HEAD: the body was cleared but the headers announce its length; write headers only.
    const bool head = request_.method() == http::verb::head;
    auto done = [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || !self->response_.keep_alive()) return self->Close();
      self->Read();
    };
    if (head) {
      serializer_.emplace(response_);
      http::async_write_header(stream_, *serializer_, std::move(done));
    } else {
      http::async_write(stream_, response_, std::move(done));
    }
  }
  void Close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  beast::tcp_stream stream_;
  const MetricsServer::Producer* const producer_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
  std::optional<http::response_serializer<http::string_body>> serializer_;
};

}  // namespace

class MetricsServer::Impl {
 public:
  explicit Impl(Producer producer) : producer_(std::move(producer)), acceptor_(io_) {}

  absl::Status Listen(const std::string& address, int port) {
    beast::error_code ec;
    const asio::ip::address ip = asio::ip::make_address(address, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrFormat("metrics address '%s' is not an IP address", address));
    }
    const tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrFormat("cannot serve metrics on %s:%d: %s", address, port, ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    return absl::OkStatus();
  }

  void Run() {
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    io_.stop();  // pending sessions are dropped; their handlers never run again
    if (thread_.joinable()) thread_.join();
    // No thread runs the io_context now: close the listening socket so new connections are
    // refused rather than left waiting in the backlog.
    beast::error_code ec;
    acceptor_.close(ec);
  }

  int port() const { return port_; }

 private:
  void Accept() {
    acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code ec, tcp::socket s) {
      if (ec) {
        if (ec == asio::error::operation_aborted || stopped_) return;
        spdlog::warn("metrics accept failed: {}", ec.message());
      } else {
        std::make_shared<HttpSession>(std::move(s), &producer_)->Read();
      }
      Accept();
    });
  }

  const Producer producer_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  int port_ = 0;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    int port, Producer producer) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat("metrics port %d out of range", port));
  }
  auto impl = std::make_unique<Impl>(std::move(producer));
  absl::Status st = impl->Listen(address, port);
  if (!st.ok()) return st;
  impl->Run();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() { Stop(); }
void MetricsServer::Stop() { impl_->Stop(); }
int MetricsServer::port() const { return impl_->port(); }

}  // namespace fluxon
