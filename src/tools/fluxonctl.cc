// fluxonctl: the admin CLI of fluxond. Talks to one daemon's AdminService over gRPC and prints
// aligned tables (or JSON with --json).
//
// Exit status: 0 on success, 1 when the RPC fails (daemon unreachable, or it refused the
// request), 2 on a usage error (unknown command or flag, missing or malformed argument).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cli_flags.h"
#include "common/fault_injector.h"
#include "fluxon/v1/admin.grpc.pb.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, admin, "127.0.0.1:50152", "address of fluxond's admin service");
ABSL_FLAG(bool, json, false, "print JSON instead of tables");
ABSL_FLAG(int32_t, timeout_ms, 5000, "deadline of each RPC in milliseconds");
ABSL_FLAG(std::string, prefix, "", "keys: list only keys starting with this prefix");
ABSL_FLAG(uint32_t, limit, 100, "keys: list at most this many keys");
ABSL_FLAG(uint32_t, delay_ms, 0, "fault set: delay of a delay rule in milliseconds");
ABSL_FLAG(int32_t, count, -1, "fault set: how many times the rule fires (-1: until cleared)");

namespace fluxon {
namespace {

using nlohmann::json;

constexpr int kExitRpcError = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    R"(usage: fluxonctl [--admin ADDRESS] [--json] [--timeout-ms N] COMMAND [ARGS]

Commands:
  status                          role, version, uptime, segment, grants, keys, clients
  owners                          owners registered with the master
  slots                           slots by state and per size class
  route KEY                       the master's route of KEY and the owner's local state of it
  keys [--prefix P] [--limit N]   published keys (sorted; default limit 100)
  stats                           every owner and master counter
  fault set POINT ACTION [--delay-ms N] [--count N]
                                  inject a fault: ACTION is delay|drop|duplicate|fail, POINT e.g.
                                  master.PublishBatch; --count -1 (default) fires until cleared
  fault clear [POINT]             remove the rules of POINT (all rules without POINT)
  fault list                      the active fault rules

Flags:
  --admin ADDRESS    fluxond admin service (default 127.0.0.1:50152)
  --json             print JSON instead of tables
  --timeout-ms N     deadline of each RPC (default 5000)
  --help             this text

Exit status: 0 ok, 1 RPC failure, 2 usage error.
)";

// A usage error (exit 2) or an RPC error (exit 1), with the message to print.
struct Failure {
  int exit_code;
  std::string message;
};

// Left-aligned text columns, right-aligned numeric ones, two spaces apart.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  std::string Render() const {
    const size_t columns = rows_.front().size();
    std::vector<size_t> width(columns, 0);
    std::vector<bool> numeric(columns, true);
    for (size_t r = 0; r < rows_.size(); ++r) {
      for (size_t c = 0; c < columns; ++c) {
        width[c] = std::max(width[c], rows_[r][c].size());
        if (r > 0 && !IsNumber(rows_[r][c])) numeric[c] = false;
      }
    }
    std::string out;
    for (const std::vector<std::string>& row : rows_) {
      std::string line;
      for (size_t c = 0; c < columns; ++c) {
        const size_t pad = width[c] - row[c].size();
        if (c > 0) line += "  ";
        if (numeric[c]) line += std::string(pad, ' ');
        line += row[c];
        if (!numeric[c] && c + 1 < columns) line += std::string(pad, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      absl::StrAppend(&out, line, "\n");
    }
    return out;
  }

 private:
  static bool IsNumber(const std::string& s) {
    if (s.empty()) return false;
    const size_t start = s[0] == '-' ? 1 : 0;
    return start < s.size() &&
           std::all_of(s.begin() + start, s.end(), [](char c) { return absl::ascii_isdigit(c); });
  }
  std::vector<std::vector<std::string>> rows_;
};

std::string Num(uint64_t v) { return std::to_string(v); }
std::string Num(int64_t v) { return std::to_string(v); }

// "4294967296 (4.00 GiB)"
std::string Bytes(uint64_t v) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = static_cast<double>(v);
  int unit = 0;
  while (x >= 1024 && unit < 4) {
    x /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(v, " B");
  return absl::StrFormat("%d (%.2f %s)", v, x, kUnits[unit]);
}

json RouteJson(const v1::Route& r) {
  json locations = json::array();
  for (const v1::RouteLocation& l : r.locations()) {
    locations.push_back(json{{"node_id", l.node_id()},
                             {"generation", l.generation()},
                             {"put_id", l.put_id()},
                             {"offset", l.offset()},
                             {"len", l.len()}});
  }
  return json{{"key", r.key()},        {"node_id", r.node_id()}, {"generation", r.generation()},
              {"put_id", r.put_id()},  {"offset", r.offset()},   {"len", r.len()},
              {"locations", locations}};
}

class Command {
 public:
  Command(std::unique_ptr<v1::AdminService::Stub> stub, std::string address,
          std::chrono::milliseconds timeout, bool as_json)
      : stub_(std::move(stub)),
        address_(std::move(address)),
        timeout_(timeout),
        as_json_(as_json) {}

  // Runs args[0] with args[1..]; prints the result to stdout.
  std::optional<Failure> Run(const std::vector<std::string>& args) {
    const std::string& name = args[0];
    if (name == "status") return Expect(args, 1, "status", [&] { return Status(); });
    if (name == "owners") return Expect(args, 1, "owners", [&] { return Owners(); });
    if (name == "slots") return Expect(args, 1, "slots", [&] { return Slots(); });
    if (name == "stats") return Expect(args, 1, "stats", [&] { return Stats(); });
    if (name == "keys") {
      return Expect(args, 1, "keys [--prefix P] [--limit N]", [&] { return Keys(); });
    }
    if (name == "route") return Expect(args, 2, "route KEY", [&] { return Route(args[1]); });
    if (name == "fault") {
      if (args.size() < 2) return Usage("fault needs a subcommand: set, clear or list");
      const std::string& sub = args[1];
      if (sub == "set") {
        if (args.size() != 4) {
          return Usage("usage: fluxonctl fault set POINT ACTION [--delay-ms N] [--count N]");
        }
        return FaultSet(args[2], args[3]);
      }
      if (sub == "clear") {
        if (args.size() > 3) return Usage("usage: fluxonctl fault clear [POINT]");
        return FaultClear(args.size() == 3 ? args[2] : "");
      }
      if (sub == "list") return Expect(args, 2, "fault list", [&] { return FaultList(); });
      return Usage(absl::StrCat("unknown fault subcommand '", sub, "' (set, clear, list)"));
    }
    return Usage(absl::StrCat("unknown command '", name, "'"));
  }

 private:
  static std::optional<Failure> Usage(std::string message) {
    return Failure{kExitUsage, std::move(message)};
  }

  // Runs `run` when the command has exactly `n` words, else reports its usage.
  static std::optional<Failure> Expect(const std::vector<std::string>& args, size_t n,
                                       const char* usage,
                                       const std::function<std::optional<Failure>()>& run) {
    if (args.size() != n) return Usage(absl::StrCat("usage: fluxonctl ", usage));
    return run();
  }

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + timeout_);
    return ctx;
  }

  std::optional<Failure> RpcFailure(const char* what, const grpc::Status& s) const {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return Failure{kExitRpcError, absl::StrFormat("cannot reach fluxond admin at %s: %s",
                                                    address_, s.error_message())};
    }
    return Failure{
        kExitRpcError,
        absl::StrFormat("%s failed: %s (%s)", what, s.error_message(),
                        absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())))};
  }

  void Print(const json& j) const { std::cout << j.dump(2) << "\n"; }

  std::optional<Failure> Status() {
    v1::StatusReply r;
    if (grpc::Status s = stub_->Status(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("status", s);
    }
    if (as_json_) {
      Print(json{{"version", r.version()},
                 {"role", r.role()},
                 {"node_id", r.node_id()},
                 {"generation", r.generation()},
                 {"uptime_ms", r.uptime_ms()},
                 {"segment_bytes", r.segment_bytes()},
                 {"grants", r.grants()},
                 {"grant_capacity", r.grant_capacity()},
                 {"keys", r.keys()},
                 {"clients", r.clients()}});
      return std::nullopt;
    }
    Table t({"FIELD", "VALUE"});
    t.AddRow({"version", r.version()});
    t.AddRow({"role", r.role()});
    t.AddRow({"node_id", Num(uint64_t{r.node_id()})});
    t.AddRow({"generation", Num(r.generation())});
    t.AddRow({"uptime", absl::StrFormat("%.1fs", r.uptime_ms() / 1000.0)});
    t.AddRow({"segment", Bytes(r.segment_bytes())});
    t.AddRow({"grants", absl::StrFormat("%d / %d", r.grants(), r.grant_capacity())});
    t.AddRow({"keys", Num(r.keys())});
    t.AddRow({"clients", Num(r.clients())});
    std::cout << t.Render();
    return std::nullopt;
  }

  std::optional<Failure> Owners() {
    v1::ListOwnersReply r;
    if (grpc::Status s = stub_->Owners(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("owners", s);
    }
    if (as_json_) {
      json owners = json::array();
      for (const v1::OwnerInfo& o : r.owners()) {
        owners.push_back(
            {{"node_id", o.node_id()},
             {"generation", o.generation()},
             {"role", o.role()},
             {"capacity_bytes", o.capacity_bytes()},
             {"address", o.address()},
             {"transports", std::vector<std::string>(o.transports().begin(), o.transports().end())},
             {"last_heard_ms_ago", o.last_heard_ms_ago()},
             {"lease_ms_left", o.lease_ms_left()},
             {"inflight_gets", o.inflight_gets()},
             {"source_pins", o.source_pins()},
             {"routes", o.routes()}});
      }
      Print(json{{"owners", owners}});
      return std::nullopt;
    }
    Table t({"NODE", "GENERATION", "ROLE", "CAPACITY_BYTES", "ROUTES", "ADDRESS", "TRANSPORTS",
             "HEARD_MS_AGO", "LEASE_MS_LEFT", "INFLIGHT_GETS", "SOURCE_PINS"});
    for (const v1::OwnerInfo& o : r.owners()) {
      t.AddRow({Num(uint64_t{o.node_id()}), Num(o.generation()), o.role(), Num(o.capacity_bytes()),
                Num(o.routes()), o.address().empty() ? "-" : o.address(),
                o.transports().empty() ? "-" : absl::StrJoin(o.transports(), ","),
                Num(o.last_heard_ms_ago()), Num(o.lease_ms_left()), Num(o.inflight_gets()),
                Num(o.source_pins())});
    }
    std::cout << t.Render();
    return std::nullopt;
  }

  std::optional<Failure> Slots() {
    v1::SlotsReply r;
    if (grpc::Status s = stub_->Slots(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("slots", s);
    }
    // Slot states in lifecycle order, then any the daemon reports that this tool does not know.
    std::vector<std::string> states = {"Free",    "Prepared",  "PendingLocalVisible",
                                       "Pending", "Committed", "Releasing"};
    std::map<std::string, int64_t> by_state(r.by_state().begin(), r.by_state().end());
    for (const auto& [state, n] : by_state) {
      if (std::find(states.begin(), states.end(), state) == states.end()) states.push_back(state);
    }
    if (as_json_) {
      json classes = json::array();
      for (const v1::SlotClass& c : r.classes()) {
        classes.push_back({{"slot_size", c.slot_size()},
                           {"slots_per_grant", c.slots_per_grant()},
                           {"grants", c.grants()},
                           {"free", c.free()},
                           {"used", c.grants() * c.slots_per_grant() - c.free()},
                           {"waiting_claims", c.waiting_claims()}});
      }
      Print(json{{"by_state", by_state}, {"classes", classes}});
      return std::nullopt;
    }
    Table t({"STATE", "SLOTS"});
    for (const std::string& state : states) t.AddRow({state, Num(by_state[state])});
    std::cout << t.Render() << "\n";
    Table c({"SLOT_SIZE", "SLOTS_PER_GRANT", "GRANTS", "USED", "FREE", "WAITING_CLAIMS"});
    for (const v1::SlotClass& sc : r.classes()) {
      c.AddRow({Num(sc.slot_size()), Num(sc.slots_per_grant()), Num(sc.grants()),
                Num(sc.grants() * sc.slots_per_grant() - sc.free()), Num(sc.free()),
                Num(sc.waiting_claims())});
    }
    std::cout << c.Render();
    return std::nullopt;
  }

  std::optional<Failure> Stats() {
    v1::CountersReply r;
    if (grpc::Status s = stub_->Stats(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("stats", s);
    }
    const std::map<std::string, int64_t> counters(r.counters().begin(), r.counters().end());
    if (as_json_) {
      Print(json(counters));
      return std::nullopt;
    }
    Table t({"COUNTER", "VALUE"});
    for (const auto& [name, value] : counters) t.AddRow({name, Num(value)});
    std::cout << t.Render();
    return std::nullopt;
  }

  std::optional<Failure> Route(const std::string& key) {
    v1::RouteRequest req;
    req.set_key(key);
    v1::RouteReply r;
    if (grpc::Status s = stub_->GetRoute(Context().get(), req, &r); !s.ok()) {
      return RpcFailure("route", s);
    }
    if (as_json_) {
      Print(json{{"key", key},
                 {"found", r.found()},
                 {"route", r.found() ? RouteJson(r.route()) : json(nullptr)},
                 {"local_state", r.local_state()}});
      return std::nullopt;
    }
    Table t({"FIELD", "VALUE"});
    t.AddRow({"key", key});
    t.AddRow({"found", r.found() ? "yes" : "no"});
    if (r.found()) {
      t.AddRow({"node_id", Num(uint64_t{r.route().node_id()})});
      t.AddRow({"generation", Num(r.route().generation())});
      t.AddRow({"put_id", Num(r.route().put_id())});
      t.AddRow({"offset", Num(r.route().offset())});
      t.AddRow({"len", Num(r.route().len())});
      for (int i = 0; i < r.route().locations_size(); ++i) {
        const v1::RouteLocation& l = r.route().locations(i);
        t.AddRow({i == 0 ? "location (primary)" : "location (copy)",
                  absl::StrFormat("node %d gen %d put %d offset %d len %d", l.node_id(),
                                  l.generation(), l.put_id(), l.offset(), l.len())});
      }
    }
    t.AddRow({"local_state", r.local_state().empty() ? "-" : r.local_state()});
    std::cout << t.Render();
    return std::nullopt;
  }

  std::optional<Failure> Keys() {
    v1::ListKeysRequest req;
    req.set_prefix(absl::GetFlag(FLAGS_prefix));
    req.set_limit(absl::GetFlag(FLAGS_limit));
    if (req.limit() == 0) return Usage("--limit must be positive");
    v1::ListKeysReply r;
    if (grpc::Status s = stub_->Keys(Context().get(), req, &r); !s.ok()) {
      return RpcFailure("keys", s);
    }
    if (as_json_) {
      json keys = json::array();
      for (const v1::Route& route : r.routes()) keys.push_back(RouteJson(route));
      Print(json{{"keys", keys}});
      return std::nullopt;
    }
    Table t({"KEY", "NODE", "GENERATION", "PUT_ID", "OFFSET", "LEN"});
    for (const v1::Route& route : r.routes()) {
      t.AddRow({route.key(), Num(uint64_t{route.node_id()}), Num(route.generation()),
                Num(route.put_id()), Num(route.offset()), Num(route.len())});
    }
    std::cout << t.Render();
    return std::nullopt;
  }

  std::optional<Failure> FaultSet(const std::string& point, const std::string& action) {
    if (absl::StatusOr<FaultAction> a = ParseFaultAction(action); !a.ok()) {
      return Usage(
          absl::StrCat("unknown fault action '", action, "' (delay, drop, duplicate or fail)"));
    }
    const int32_t count = absl::GetFlag(FLAGS_count);
    if (count == 0 || count < -1) return Usage("--count must be positive or -1");
    v1::SetFaultRequest req;
    v1::FaultRule* rule = req.mutable_rule();
    rule->set_point(point);
    rule->set_action(action);
    rule->set_delay_ms(absl::GetFlag(FLAGS_delay_ms));
    rule->set_count(count);
    v1::Empty r;
    if (grpc::Status s = stub_->SetFault(Context().get(), req, &r); !s.ok()) {
      return RpcFailure("fault set", s);
    }
    if (as_json_) {
      Print(json{{"ok", true}, {"rule", RuleJson(*rule)}});
    } else {
      std::cout << absl::StrFormat("fault set: %s %s delay=%dms count=%s\n", point, action,
                                   rule->delay_ms(), CountText(count));
    }
    return std::nullopt;
  }

  std::optional<Failure> FaultClear(const std::string& point) {
    v1::ClearFaultsRequest req;
    req.set_point(point);
    v1::Empty r;
    if (grpc::Status s = stub_->ClearFaults(Context().get(), req, &r); !s.ok()) {
      return RpcFailure("fault clear", s);
    }
    if (as_json_) {
      Print(json{{"ok", true}, {"cleared", point.empty() ? "all" : point}});
    } else {
      std::cout << "faults cleared: " << (point.empty() ? "all" : point) << "\n";
    }
    return std::nullopt;
  }

  std::optional<Failure> FaultList() {
    v1::ListFaultsReply r;
    if (grpc::Status s = stub_->ListFaults(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("fault list", s);
    }
    if (as_json_) {
      json rules = json::array();
      for (const v1::FaultRule& f : r.rules()) rules.push_back(RuleJson(f));
      Print(json{{"rules", rules}});
      return std::nullopt;
    }
    Table t({"POINT", "ACTION", "DELAY_MS", "REMAINING"});
    for (const v1::FaultRule& f : r.rules()) {
      t.AddRow({f.point(), f.action(), Num(uint64_t{f.delay_ms()}), CountText(f.count())});
    }
    std::cout << t.Render();
    return std::nullopt;
  }

  static json RuleJson(const v1::FaultRule& f) {
    return json{{"point", f.point()},
                {"action", f.action()},
                {"delay_ms", f.delay_ms()},
                {"count", f.count()}};
  }
  static std::string CountText(int32_t count) {
    return count < 0 ? "until-cleared" : std::to_string(count);
  }

  std::unique_ptr<v1::AdminService::Stub> stub_;
  const std::string address_;
  const std::chrono::milliseconds timeout_;
  const bool as_json_;
};

int Main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h" || arg == "-help" || (i == 1 && arg == "help")) {
      std::cout << kUsage;
      return 0;
    }
  }
  absl::StatusOr<std::vector<std::string>> args = ParseFlagsOrUsageError(argc, argv);
  if (!args.ok()) {
    std::cerr << "fluxonctl: " << args.status().message() << "\n"
              << "run fluxonctl --help\n";
    return kExitUsage;
  }
  if (args->empty()) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  const int32_t timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  if (timeout_ms <= 0) {
    std::cerr << "fluxonctl: --timeout-ms must be positive\n";
    return kExitUsage;
  }
  const std::string address = absl::GetFlag(FLAGS_admin);
  Command command(
      v1::AdminService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
      address, std::chrono::milliseconds(timeout_ms), absl::GetFlag(FLAGS_json));
  if (std::optional<Failure> f = command.Run(*args)) {
    std::cerr << "fluxonctl: " << f->message << "\n";
    if (f->exit_code == kExitUsage) std::cerr << "run fluxonctl --help\n";
    return f->exit_code;
  }
  return 0;
}

}  // namespace
}  // namespace fluxon

int main(int argc, char** argv) { return fluxon::Main(argc, argv); }
