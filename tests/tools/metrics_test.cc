// The Prometheus endpoint end to end: an in-process fluxond with metrics on, real client traffic,
// scrapes over HTTP checked for values, histogram consistency and the exposition format (by the
// strict checker tests/tools/check_prometheus_text.py, which uses prometheus_client's parser).
// Also the pieces: the collectables of daemon/metrics.h (histogram families from LatencyHistogram
// snapshots, the counter tables) serialized by prometheus-cpp, and MetricsExposer's HTTP answers,
// port discovery, bind errors and stop.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "daemon/metrics.h"
#include "daemon/metrics_exposer.h"
#include "fluxon/version.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
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
    const absl::string_view value = line.substr(space + 1);
    double v = 0;
    if (value == "+Inf") {
      v = INFINITY;
    } else if (value == "Nan") {  // prometheus-cpp's summary quantiles before any observation
      v = NAN;
    } else {
      EXPECT_TRUE(absl::SimpleAtod(value, &v)) << line;
    }
    out[std::string(line.substr(0, space))] = v;
  }
  return out;
}

// The buckets of one histogram series, (le, cumulative count) in increasing le: the samples
// "<name>_bucket{<labels>,le=\"...\"}" (labels "" for an unlabelled series).
std::vector<std::pair<double, double>> Buckets(const std::map<std::string, double>& samples,
                                               const std::string& name, const std::string& labels) {
  const std::string prefix = name + "_bucket{" + (labels.empty() ? "" : labels + ",") + "le=\"";
  std::vector<std::pair<double, double>> out;
  for (const auto& [key, value] : samples) {
    if (!absl::StartsWith(key, prefix)) continue;
    const std::string le = key.substr(prefix.size(), key.size() - prefix.size() - 2);
    double bound = INFINITY;
    if (le != "+Inf") {
      EXPECT_TRUE(absl::SimpleAtod(le, &bound)) << key;
    }
    out.emplace_back(bound, value);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Checks one series against LatencyHistogram's bounds: every bound then +Inf, cumulative, +Inf
// equal to `count`; returns the buckets.
std::vector<std::pair<double, double>> ExpectLatencyBuckets(
    const std::map<std::string, double>& samples, const std::string& name,
    const std::string& labels, double count) {
  const auto buckets = Buckets(samples, name, labels);
  EXPECT_EQ(buckets.size(), LatencyHistogram::kNumBounds + 1) << name << "{" << labels << "}";
  if (buckets.size() != LatencyHistogram::kNumBounds + 1) return buckets;
  double previous = 0;
  for (size_t i = 0; i < LatencyHistogram::kNumBounds; ++i) {
    EXPECT_DOUBLE_EQ(buckets[i].first, LatencyHistogram::BoundSeconds(i)) << i;
    EXPECT_GE(buckets[i].second, previous) << name << "{" << labels << "} le " << buckets[i].first;
    previous = buckets[i].second;
  }
  EXPECT_TRUE(std::isinf(buckets.back().first));
  EXPECT_GE(buckets.back().second, previous);
  EXPECT_EQ(buckets.back().second, count) << name << "{" << labels << "}";
  return buckets;
}

// prometheus-cpp's text exposition of `families`.
std::string Serialize(const std::vector<prometheus::MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

const prometheus::MetricFamily* FindFamily(const std::vector<prometheus::MetricFamily>& families,
                                           const std::string& name) {
  for (const auto& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
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
    EXPECT_EQ(r.content_type, "text/plain; charset=utf-8");
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
  EXPECT_EQ(s.count("fluxon_errors_total{kind=\"claim_timeout\"}"), 1u);
  EXPECT_EQ(s.count("fluxon_build_info{node_id=\"0\",role=\"embedded\",version=\"" +
                    std::string(FLUXON_VERSION_STRING) + "\"}"),
            1u)
      << text;
  EXPECT_GT(s["fluxon_uptime_seconds"], 0);

  const std::map<std::string, int> expected_counts = {
      {"put_start", kPuts + 2}, {"put_commit", kPuts},   {"put_abort", 1},
      {"get_start", kGets + 1}, {"get_transfer", kGets}, {"cancel_get", 1},
      {"release_views", kGets}};
  for (const char* request : kRequestTypes) {
    const std::string labels = std::string("request=\"") + request + "\"";
    const std::string name = "fluxon_client_request_duration_seconds";
    const double count = s[name + "_count{" + labels + "}"];
    EXPECT_EQ(count, expected_counts.at(request)) << request;
    ExpectLatencyBuckets(s, name, labels, count);
    if (count > 0) {
      EXPECT_GT(s[name + "_sum{" + labels + "}"], 0) << request;
      EXPECT_LT(s[name + "_sum{" + labels + "}"], 10.0 * count) << request;
    }
  }

  auto [status, output] = CheckExposition(text);
  EXPECT_EQ(status, 0) << output;
}

TEST_F(MetricsEndpointTest, HttpAnswers) {
  const std::string page = HttpRequest(node_->metrics_port(), "/metrics?x=1").body;
  EXPECT_THAT(page, HasSubstr("# TYPE fluxon_client_request_duration_seconds histogram"));
  // prometheus-cpp's own scrape statistics ride along.
  EXPECT_THAT(page, HasSubstr("# TYPE exposer_scrapes_total counter"));
  EXPECT_EQ(HttpRequest(node_->metrics_port(), "/").status, 404);
  EXPECT_EQ(HttpRequest(node_->metrics_port(), "/nope").status, 404);
  // Only GET is served (civetweb answers the rest itself).
  EXPECT_NE(HttpRequest(node_->metrics_port(), "/metrics", http::verb::post).status, 200);
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
  EXPECT_TRUE(absl::IsUnavailable(node.status())) << node.status();
  EXPECT_THAT(node.status().message(), HasSubstr("cannot serve metrics on 127.0.0.1:" +
                                                 std::to_string(holder->metrics_port())));
  EXPECT_THAT(node.status().message(), HasSubstr("Address already in use"));
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
  LatencyHistogram h;
  h.Record(std::chrono::microseconds(30));
  h.Record(std::chrono::milliseconds(3));
  prometheus::Registry registry;
  prometheus::BuildCounter()
      .Name("fluxon_things_total")
      .Help("Things.")
      .Register(registry)
      .Add({})
      .Increment(3);
  std::vector<prometheus::MetricFamily> families = {HistogramFamily(
      "fluxon_test_seconds", "A test histogram.", {{{{"request", "x"}}, h.Read()}})};
  for (auto& f : registry.Collect()) families.push_back(std::move(f));
  const std::string text = Serialize(families);
  ASSERT_EQ(CheckExposition(text).first, 0) << CheckExposition(text).second;

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
  // A name without the fluxon_ prefix that is not one of prometheus-cpp's own families.
  EXPECT_NE(
      CheckExposition("# HELP other_total o\n# TYPE other_total counter\nother_total 1\n").first,
      0);
  // Non-monotone buckets.
  std::string bumped = std::regex_replace(
      text, std::regex("fluxon_test_seconds_bucket\\{request=\"x\",le=\"0.005\"\\} 2"),
      "fluxon_test_seconds_bucket{request=\"x\",le=\"0.005\"} 0");
  ASSERT_NE(bumped, text);
  EXPECT_NE(CheckExposition(bumped).first, 0);
}

TEST(HistogramFamily, IsCumulativeWithInfEqualToCount) {
  LatencyHistogram h;
  h.Record(std::chrono::microseconds(1));  // <= 5us
  h.Record(std::chrono::microseconds(5));  // <= 5us (bound is inclusive)
  h.Record(std::chrono::microseconds(6));  // <= 10us
  h.Record(std::chrono::seconds(60));      // +Inf only
  const prometheus::MetricFamily f = HistogramFamily("fluxon_h_seconds", "h", {{{}, h.Read()}});
  EXPECT_EQ(f.type, prometheus::MetricType::Histogram);
  ASSERT_EQ(f.metric.size(), 1u);
  const auto& hist = f.metric[0].histogram;
  ASSERT_EQ(hist.bucket.size(), LatencyHistogram::kNumBounds + 1);
  EXPECT_TRUE(std::isinf(hist.bucket.back().upper_bound));
  EXPECT_EQ(hist.bucket.back().cumulative_count, 4u);
  EXPECT_EQ(hist.sample_count, 4u);

  const std::string text = Serialize({f});
  // One +Inf bucket: the family ends with its own, prometheus-cpp adds none.
  EXPECT_EQ(text.find("le=\"+Inf\""), text.rfind("le=\"+Inf\"")) << text;
  EXPECT_NE(text.find("le=\"+Inf\""), std::string::npos) << text;
  std::map<std::string, double> s = Samples(text);
  const auto buckets = ExpectLatencyBuckets(s, "fluxon_h_seconds", "", 4);
  ASSERT_EQ(buckets.size(), LatencyHistogram::kNumBounds + 1);
  EXPECT_EQ(buckets[0].second, 2);                                 // le 5 µs
  EXPECT_EQ(buckets[1].second, 3);                                 // le 10 µs
  EXPECT_EQ(buckets[LatencyHistogram::kNumBounds - 1].second, 3);  // le 10 s
  EXPECT_EQ(s["fluxon_h_seconds_count"], 4);
  EXPECT_DOUBLE_EQ(s["fluxon_h_seconds_sum"], 60.000012);
  auto [status, output] = CheckExposition(text);
  EXPECT_EQ(status, 0) << output;
}

TEST(HistogramFamily, LabelledSeriesAndEmptyCollectable) {
  LatencyHistogram a, b;
  a.Record(std::chrono::milliseconds(1));
  const std::string text = Serialize({HistogramFamily(
      "fluxon_l_seconds", "l", {{{{"k", "a\"1"}}, a.Read()}, {{{"k", "b"}}, b.Read()}})});
  std::map<std::string, double> s = Samples(text);
  EXPECT_EQ(s["fluxon_l_seconds_count{k=\"a\\\"1\"}"], 1) << text;
  EXPECT_EQ(s["fluxon_l_seconds_count{k=\"b\"}"], 0) << text;
  ExpectLatencyBuckets(s, "fluxon_l_seconds", "k=\"b\"", 0);

  int reads = 0;
  LatencyHistogramCollectable none("fluxon_none_seconds", "n", [&] {
    ++reads;
    return HistogramSeries{};
  });
  EXPECT_TRUE(none.Collect().empty());
  LatencyHistogramCollectable one("fluxon_one_seconds", "o", [&] {
    ++reads;
    return HistogramSeries{{{}, a.Read()}};
  });
  const auto families = one.Collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].name, "fluxon_one_seconds");
  EXPECT_EQ(families[0].help, "o");
  EXPECT_EQ(reads, 2);  // read at collect time, once each
}

TEST(CounterCollectables, OwnerTableOneFamilyPerMetricMicrosInSeconds) {
  OwnerCounters counters;
  counters.put_batches = 42;
  counters.remote_claim_us = 1'500'000;
  counters.remote_read_us = 250;
  counters.live_handles = 3;
  counters.put_no_space = 5;
  int64_t claim_timeouts = 7;
  OwnerCountersCollectable collectable(&counters, [&] { return claim_timeouts; });
  std::vector<prometheus::MetricFamily> families = collectable.Collect();

  // Every metric of the table is one family, of its kind, with its first member's help.
  std::set<std::string> names;
  for (const auto& f : families) {
    EXPECT_TRUE(names.insert(f.name).second) << "family twice: " << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
  }
  for (const OwnerCounterDef& d : kOwnerCounterDefs) {
    const prometheus::MetricFamily* f = FindFamily(families, d.metric);
    ASSERT_NE(f, nullptr) << d.metric;
    EXPECT_EQ(f->type, d.kind == CounterKind::kGauge ? prometheus::MetricType::Gauge
                                                     : prometheus::MetricType::Counter)
        << d.metric;
    if (d.help[0] != '\0') {
      EXPECT_EQ(f->help, d.help) << d.metric;
    }
  }
  EXPECT_EQ(names.size(), families.size());

  const std::string text = Serialize(families);
  std::map<std::string, double> s = Samples(text);
  EXPECT_THAT(text, HasSubstr("\nfluxon_put_batches_total 42\n"));
  EXPECT_EQ(s["fluxon_remote_get_seconds_total{part=\"claim\"}"], 1.5);
  EXPECT_EQ(s["fluxon_remote_get_seconds_total{part=\"read\"}"], 0.00025);
  EXPECT_EQ(s["fluxon_live_get_handles"], 3);
  EXPECT_THAT(text, HasSubstr("# TYPE fluxon_live_get_handles gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE fluxon_get_keys_by_path_total counter\n"));

  // fluxon_errors_total: the table's kinds, then the pool's claim timeouts.
  const prometheus::MetricFamily* errors = FindFamily(families, "fluxon_errors_total");
  ASSERT_NE(errors, nullptr);
  std::vector<std::string> kinds;
  for (const auto& m : errors->metric) {
    ASSERT_EQ(m.label.size(), 1u);
    EXPECT_EQ(m.label[0].name, "kind");
    kinds.push_back(m.label[0].value);
  }
  EXPECT_THAT(kinds, ::testing::ElementsAre("put_conflict", "put_no_space", "publish_failure",
                                            "claim_timeout"));
  EXPECT_EQ(s["fluxon_errors_total{kind=\"put_no_space\"}"], 5);
  EXPECT_EQ(s["fluxon_errors_total{kind=\"claim_timeout\"}"], 7);

  // Values are read at collect time.
  counters.put_batches = 43;
  claim_timeouts = 8;
  s = Samples(Serialize(collectable.Collect()));
  EXPECT_EQ(s["fluxon_put_batches_total"], 43);
  EXPECT_EQ(s["fluxon_errors_total{kind=\"claim_timeout\"}"], 8);

  auto [status, output] = CheckExposition(text);
  EXPECT_EQ(status, 0) << output;
}

TEST(CounterCollectables, MasterTable) {
  MasterCounters counters;
  counters.published_items = 12;
  MasterCountersCollectable collectable(&counters);
  const std::vector<prometheus::MetricFamily> families = collectable.Collect();
  ASSERT_EQ(families.size(), std::size(kMasterCounterDefs));
  for (size_t i = 0; i < families.size(); ++i) {
    EXPECT_EQ(families[i].name, kMasterCounterDefs[i].metric);
    EXPECT_EQ(families[i].help, kMasterCounterDefs[i].help);
    EXPECT_EQ(families[i].type, prometheus::MetricType::Counter);
    ASSERT_EQ(families[i].metric.size(), 1u);
    EXPECT_TRUE(families[i].metric[0].label.empty());
  }
  const std::string text = Serialize(families);
  EXPECT_THAT(text, HasSubstr("\nfluxon_master_published_items_total 12\n"));
  auto [status, output] = CheckExposition(text);
  EXPECT_EQ(status, 0) << output;
}

// Counts its collections; exposes them as a gauge.
class CountingCollectable : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily f;
    f.name = "fluxon_n";
    f.help = "n";
    f.type = prometheus::MetricType::Gauge;
    prometheus::ClientMetric m;
    m.gauge.value = static_cast<double>(++calls);
    f.metric.push_back(m);
    return {f};
  }
  mutable std::atomic<int> calls{0};
};

TEST(MetricsExposer, ServesCollectablesOnAnEphemeralPort) {
  auto counting = std::make_shared<CountingCollectable>();
  auto exposer = MetricsExposer::Start("127.0.0.1", 0, {counting});
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  const int port = (*exposer)->port();
  ASSERT_NE(port, 0);
  EXPECT_THAT(HttpRequest(port, "/metrics").body, HasSubstr("fluxon_n 1\n"));
  EXPECT_THAT(HttpRequest(port, "/metrics").body, HasSubstr("fluxon_n 2\n"));
  const auto stop_start = std::chrono::steady_clock::now();
  (*exposer)->Stop();
  // Without its waker civetweb would notice the stop only after its 2 s poll.
  EXPECT_LT(std::chrono::steady_clock::now() - stop_start, std::chrono::milliseconds(1500));
  EXPECT_EQ(counting->calls.load(), 2);
  EXPECT_EQ((*exposer)->port(), port);
  EXPECT_FALSE(HttpRequest(port, "/metrics").error.empty());
  (*exposer)->Stop();  // twice is fine
}

TEST(MetricsExposer, BadAddressesAndBindFailuresAreStatuses) {
  auto not_ip = MetricsExposer::Start("not-an-ip", 0, {std::make_shared<CountingCollectable>()});
  ASSERT_FALSE(not_ip.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(not_ip.status())) << not_ip.status();
  EXPECT_THAT(not_ip.status().message(), HasSubstr("'not-an-ip' is not an IP address"));
  EXPECT_TRUE(absl::IsInvalidArgument(
      MetricsExposer::Start("127.0.0.1", 65536, {std::make_shared<CountingCollectable>()})
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      MetricsExposer::Start("127.0.0.1:0", 0, {std::make_shared<CountingCollectable>()}).status()));
  // IPv6 works where civetweb was built with it, and is a clear error where it was not.
  auto v6 = MetricsExposer::Start("::1", 0, {std::make_shared<CountingCollectable>()});
  if (!v6.ok()) {
    EXPECT_TRUE(absl::IsInvalidArgument(v6.status())) << v6.status();
    EXPECT_THAT(v6.status().message(), HasSubstr("IPv6"));
  }

  auto first = MetricsExposer::Start("127.0.0.1", 0, {std::make_shared<CountingCollectable>()});
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  auto second = MetricsExposer::Start("127.0.0.1", port, {std::make_shared<CountingCollectable>()});
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr("cannot serve metrics on 127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(second.status().message(), HasSubstr("Address already in use"));
  // The first one still serves.
  EXPECT_THAT(HttpRequest(port, "/metrics").body, HasSubstr("fluxon_n 1\n"));
}

TEST(MetricsExposer, NoCollectAfterStopWhileScrapersRun) {
  auto counting = std::make_shared<CountingCollectable>();
  auto exposer = MetricsExposer::Start("127.0.0.1", 0, {counting});
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  const int port = (*exposer)->port();
  std::atomic<bool> done{false};
  std::vector<std::thread> scrapers;
  for (int i = 0; i < 3; ++i) {
    scrapers.emplace_back([&] {
      // Bounded: civetweb may leave a connection it accepted just before the stop unanswered.
      while (!done) {
        HttpRequest(port, "/metrics", boost::beast::http::verb::get, std::chrono::seconds(2));
      }
    });
  }
  while (counting->calls < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  (*exposer)->Stop();
  const int after_stop = counting->calls;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  done = true;
  for (auto& t : scrapers) t.join();
  EXPECT_EQ(counting->calls.load(), after_stop);
}

}  // namespace
}  // namespace fluxon
