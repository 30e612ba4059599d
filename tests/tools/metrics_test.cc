// The Prometheus endpoint end to end: an in-process fluxond with metrics on, real client traffic,
// scrapes over HTTP checked for values, histogram consistency and the exposition format (by the
// strict checker tests/tools/check_prometheus_text.py, which uses prometheus_client's parser).
// Also the pieces: LatencyHistogram-backed PrometheusText output and the HTTP server's answers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "daemon/metrics_server.h"
#include "daemon/prometheus_text.h"
#include "tests/integration/test_node.h"
#include "tests/tools/tool_test_util.h"

namespace fluxon {
namespace {

using ::fluxon::testing::Connect;
using ::fluxon::testing::FreeTcpPort;
using ::fluxon::testing::GetAndRelease;
using ::fluxon::testing::HttpReply;
using ::fluxon::testing::HttpRequest;
using ::fluxon::testing::NumberedKeys;
using ::fluxon::testing::PutAndWait;
using ::fluxon::testing::RunCommand;
using ::fluxon::testing::TestConfig;
using ::testing::HasSubstr;
namespace http = boost::beast::http;

constexpr int64_t kValueLen = 64 * 1024;
const char* const kRequestTypes[] = {"put_start",    "put_commit", "put_abort",    "get_start",
                                     "get_transfer", "cancel_get", "release_views"};

// Starts a node with metrics on a free port (retrying if another process took the port first).
std::unique_ptr<FluxonNode> StartWithMetrics(Config& c) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    c.admin.metrics_port = FreeTcpPort();
    auto node = FluxonNode::Start(c);
    if (node.ok()) return std::move(*node);
    if (!absl::IsUnavailable(node.status())) {
      ADD_FAILURE() << node.status();
      return nullptr;
    }
  }
  ADD_FAILURE() << "no free metrics port";
  return nullptr;
}

// Sample lines "name{labels} value" keyed by "name{labels}" exactly as exposed.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double v = 0;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &v) || line.substr(space + 1) == "+Inf")
        << line;
    out[std::string(line.substr(0, space))] = v;
  }
  return out;
}

// Runs the strict exposition checker on `text`; returns its exit status and output.
std::pair<int, std::string> CheckExposition(const std::string& text) {
  static int n = 0;
  const std::string path =
      "/tmp/fluxon-test/metrics-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".txt";
  std::ofstream(path) << text;
  const char* python = std::getenv("PYTHON");
  auto r =
      RunCommand({python != nullptr ? python : "python3",
                  std::string(FLUXON_SOURCE_DIR) + "/tests/tools/check_prometheus_text.py", path});
  std::remove(path.c_str());
  return {r.exit_code, r.out + r.err};
}

class MetricsEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TestConfig();
    node_ = StartWithMetrics(config_);
    ASSERT_NE(node_, nullptr);
    ASSERT_NE(node_->metrics_port(), 0);
    client_ = Connect(config_);
  }
  std::string Scrape() {
    HttpReply r = HttpRequest(node_->metrics_port(), "/metrics");
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
    return r.body;
  }

  Config config_;
  std::unique_ptr<FluxonNode> node_;
  std::unique_ptr<KvClient> client_;
};

TEST_F(MetricsEndpointTest, CountersAndHistogramsFollowTheTraffic) {
  constexpr int kPuts = 6;
  for (int i = 0; i < kPuts; ++i) {
    ASSERT_TRUE(
        PutAndWait(*client_, NumberedKeys("m" + std::to_string(i) + "/", 2), kValueLen).ok());
  }
  constexpr int kGets = 4;
  for (int i = 0; i < kGets; ++i) {
    auto got = GetAndRelease(*client_, NumberedKeys("m" + std::to_string(i) + "/", 2));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, 2u);
  }
  auto aborted = client_->LocalFastPutStart({"aborted"}, kValueLen, PutOptions{});
  ASSERT_TRUE(aborted.ok());
  ASSERT_TRUE(client_->PutAbort(*aborted).ok());
  auto cancelled = client_->GetStart({"m0/0"});
  ASSERT_TRUE(cancelled.ok());
  ASSERT_TRUE(client_->CancelGetTransfer(*cancelled).ok());
  // A conflicting put (the key exists) is an error the metrics count.
  EXPECT_FALSE(client_->LocalFastPutStart({"m0/0"}, kValueLen, PutOptions{}).ok());

  const std::string text = Scrape();
  std::map<std::string, double> s = Samples(text);
  EXPECT_EQ(s["fluxon_put_batches_total"], kPuts + 1);
  EXPECT_EQ(s["fluxon_put_pages_total"], 2 * kPuts + 1);
  EXPECT_EQ(s["fluxon_put_commits_total"], kPuts);
  EXPECT_EQ(s["fluxon_put_aborts_total"], 1);
  EXPECT_EQ(s["fluxon_get_batches_total"], kGets + 1);
  EXPECT_EQ(s["fluxon_get_pages_total"], 2 * kGets + 1);
  EXPECT_EQ(s["fluxon_hits_total"], 2 * kGets + 1);
  EXPECT_EQ(s["fluxon_misses_total"], 0);
  EXPECT_EQ(s["fluxon_errors_total{kind=\"put_conflict\"}"], 1);
  EXPECT_EQ(s["fluxon_errors_total{kind=\"put_no_space\"}"], 0);
  EXPECT_EQ(s["fluxon_keys"], 2 * kPuts);
  EXPECT_EQ(s["fluxon_slots{state=\"Committed\"}"], 2 * kPuts);
  EXPECT_EQ(s["fluxon_slots{state=\"Prepared\"}"], 0);
  const SlotPoolStats pool = node_->owner()->memory().pool().Stats();
  EXPECT_EQ(s["fluxon_slots{state=\"Free\"}"], pool.slots_by_state[0]);
  EXPECT_EQ(s["fluxon_grants"], pool.grants);
  EXPECT_EQ(s["fluxon_grant_capacity"], pool.grant_capacity);
  EXPECT_EQ(s["fluxon_slot_class_free_slots{slot_size=\"65536\"}"], pool.classes[0].free_slots);
  EXPECT_EQ(s["fluxon_client_sessions"], 1);
  EXPECT_EQ(s["fluxon_master_routes"], 2 * kPuts);
  EXPECT_EQ(s["fluxon_master_published_items_total"], 2 * kPuts);
  EXPECT_EQ(s["fluxon_publish_batches_total"], kPuts);
  EXPECT_EQ(s["fluxon_live_get_handles"], 0);
  EXPECT_EQ(s["fluxon_prepared_puts"], 0);

  const std::map<std::string, int> expected_counts = {
      {"put_start", kPuts + 2}, {"put_commit", kPuts},   {"put_abort", 1},
      {"get_start", kGets + 1}, {"get_transfer", kGets}, {"cancel_get", 1},
      {"release_views", kGets}};
  for (const char* request : kRequestTypes) {
    const std::string labels = std::string("request=\"") + request + "\"";
    const std::string name = "fluxon_client_request_duration_seconds";
    const double count = s[name + "_count{" + labels + "}"];
    EXPECT_EQ(count, expected_counts.at(request)) << request;
    double previous = 0;
    for (size_t i = 0; i < LatencyHistogram::kNumBounds; ++i) {
      const std::string key = name + "_bucket{" + labels + ",le=\"" +
                              PrometheusText::FormatValue(LatencyHistogram::BoundSeconds(i)) +
                              "\"}";
      ASSERT_TRUE(s.count(key)) << key;
      EXPECT_GE(s[key], previous) << key;
      previous = s[key];
    }
    EXPECT_EQ(s[name + "_bucket{" + labels + ",le=\"+Inf\"}"], count) << request;
    EXPECT_GE(s[name + "_bucket{" + labels + ",le=\"+Inf\"}"], previous);
    if (count > 0) {
      EXPECT_GT(s[name + "_sum{" + labels + "}"], 0) << request;
      EXPECT_LT(s[name + "_sum{" + labels + "}"], 10.0 * count) << request;
    }
  }

  auto [status, output] = CheckExposition(text);
  EXPECT_EQ(status, 0) << output;
}

TEST_F(MetricsEndpointTest, HttpAnswers) {
  EXPECT_THAT(HttpRequest(node_->metrics_port(), "/metrics?x=1").body,
              HasSubstr("# TYPE fluxon_client_request_duration_seconds histogram"));
  EXPECT_EQ(HttpRequest(node_->metrics_port(), "/").status, 200);
  EXPECT_EQ(HttpRequest(node_->metrics_port(), "/nope").status, 404);
  EXPECT_EQ(HttpRequest(node_->metrics_port(), "/metrics", http::verb::post).status, 405);
  HttpReply head = HttpRequest(node_->metrics_port(), "/metrics", http::verb::head);
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
  EXPECT_THAT(node_->StatusText(),
              HasSubstr("metrics: http://127.0.0.1:" + std::to_string(node_->metrics_port())));
}

TEST_F(MetricsEndpointTest, StopsWithTheNode) {
  const int port = node_->metrics_port();
  client_.reset();
  node_->Stop();
  EXPECT_FALSE(HttpRequest(port, "/metrics").error.empty());
}

TEST(MetricsConfig, PortZeroDisablesTheEndpoint) {
  Config c = TestConfig();
  c.admin.metrics_port = 0;
  auto node = fluxon::testing::StartNode(c);
  EXPECT_EQ(node->metrics_port(), 0);
  EXPECT_THAT(node->StatusText(), ::testing::Not(HasSubstr("metrics:")));
}

TEST(MetricsConfig, PortInUseFailsTheStart) {
  Config first = TestConfig();
  auto holder = StartWithMetrics(first);
  ASSERT_NE(holder, nullptr);
  Config second = TestConfig();
  second.admin.metrics_port = holder->metrics_port();
  auto node = FluxonNode::Start(second);
  ASSERT_FALSE(node.ok());
  EXPECT_THAT(node.status().message(), HasSubstr("cannot serve metrics on 127.0.0.1"));
}

TEST(MetricsConfig, MasterOnlyNodeExposesMasterFamiliesOnly) {
  Config c = TestConfig();
  c.role = Role::kMaster;
  c.owner.reset();
  auto node = StartWithMetrics(c);
  ASSERT_NE(node, nullptr);
  const std::string text = HttpRequest(node->metrics_port(), "/metrics").body;
  EXPECT_THAT(text, HasSubstr("fluxon_master_routes 0"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("fluxon_slots")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("fluxon_client_request_duration_seconds")));
  auto [status, output] = CheckExposition(text);
  EXPECT_EQ(status, 0) << output;
}

TEST(ExpositionChecker, RejectsBrokenPages) {
  PrometheusText good;
  LatencyHistogram h;
  h.Record(std::chrono::microseconds(30));
  h.Record(std::chrono::milliseconds(3));
  good.Histogram("fluxon_test_seconds", "A test histogram.", {{{{"request", "x"}}, h.Read()}});
  good.Counter("fluxon_things_total", "Things.", 3);
  ASSERT_EQ(CheckExposition(good.text()).first, 0) << CheckExposition(good.text()).second;

  const std::string text = good.text();
  // +Inf bucket removed.
  std::string no_inf = std::regex_replace(text, std::regex(".*le=\"\\+Inf\".*\n"), "");
  EXPECT_NE(CheckExposition(no_inf).first, 0);
  // A counter not ending in _total.
  EXPECT_NE(CheckExposition("# HELP fluxon_x x\n# TYPE fluxon_x counter\nfluxon_x 1\n").first, 0);
  // Samples without HELP/TYPE.
  EXPECT_NE(CheckExposition("fluxon_y 1\n").first, 0);
  // A malformed label.
  EXPECT_NE(CheckExposition("# HELP fluxon_z z\n# TYPE fluxon_z gauge\nfluxon_z{a=b} 1\n").first,
            0);
  // Non-monotone buckets.
  std::string bumped = std::regex_replace(
      text, std::regex("fluxon_test_seconds_bucket\\{request=\"x\",le=\"0.005\"\\} 2"),
      "fluxon_test_seconds_bucket{request=\"x\",le=\"0.005\"} 0");
  ASSERT_NE(bumped, text);
  EXPECT_NE(CheckExposition(bumped).first, 0);
}

TEST(PrometheusText, FormatsValuesAndEscapesLabels) {
  EXPECT_EQ(PrometheusText::FormatValue(42), "42");
  EXPECT_EQ(PrometheusText::FormatValue(0.000005), "0.000005");
  EXPECT_EQ(PrometheusText::FormatValue(1.25), "1.25");
  EXPECT_EQ(PrometheusText::FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(PrometheusText::EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  PrometheusText t;
  t.Family("fluxon_g", "gauge", "Help with \\ and\nnewline.");
  t.Sample("fluxon_g", {{"k", "v\"1"}}, 7);
  EXPECT_EQ(t.text(),
            "# HELP fluxon_g Help with \\\\ and\\nnewline.\n# TYPE fluxon_g gauge\n"
            "fluxon_g{k=\"v\\\"1\"} 7\n");
}

TEST(PrometheusText, HistogramIsCumulativeWithInfEqualToCount) {
  LatencyHistogram h;
  h.Record(std::chrono::microseconds(1));  // <= 5us
  h.Record(std::chrono::microseconds(5));  // <= 5us (bound is inclusive)
  h.Record(std::chrono::microseconds(6));  // <= 10us
  h.Record(std::chrono::seconds(60));      // +Inf only
  PrometheusText t;
  t.Histogram("fluxon_h_seconds", "h", {{{}, h.Read()}});
  std::map<std::string, double> s = Samples(t.text());
  EXPECT_EQ(s["fluxon_h_seconds_bucket{le=\"0.000005\"}"], 2);
  EXPECT_EQ(s["fluxon_h_seconds_bucket{le=\"0.00001\"}"], 3);
  EXPECT_EQ(s["fluxon_h_seconds_bucket{le=\"10\"}"], 3);
  EXPECT_EQ(s["fluxon_h_seconds_bucket{le=\"+Inf\"}"], 4);
  EXPECT_EQ(s["fluxon_h_seconds_count"], 4);
  EXPECT_DOUBLE_EQ(s["fluxon_h_seconds_sum"], 60.000012);
}

TEST(MetricsServer, ServesTheProducerOnAnEphemeralPort) {
  std::atomic<int> calls{0};
  auto server = MetricsServer::Start("127.0.0.1", 0, [&] {
    return "# HELP fluxon_n n\n# TYPE fluxon_n gauge\nfluxon_n " + std::to_string(++calls) + "\n";
  });
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_NE((*server)->port(), 0);
  EXPECT_THAT(HttpRequest((*server)->port(), "/metrics").body, HasSubstr("fluxon_n 1"));
  EXPECT_THAT(HttpRequest((*server)->port(), "/metrics").body, HasSubstr("fluxon_n 2"));
  (*server)->Stop();
  EXPECT_EQ(calls.load(), 2);
  EXPECT_FALSE(MetricsServer::Start("not-an-ip", 0, [] { return std::string(); }).ok());
}

}  // namespace
}  // namespace fluxon
