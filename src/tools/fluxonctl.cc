// fluxonctl: the admin CLI of fluxond. Talks to one daemon's AdminService over gRPC and prints
// aligned tables (or JSON with --json).
//
// Commands, flags and help are CLI11's; the global flags (--admin, --json, --timeout-ms) may stand
// before or after the command. --etcd ENDPOINTS instead of --admin sends the command to the
// master that leads the election in etcd (at the admin address it publishes beside the key). --json
// prints the reply messages through protobuf's JSON printer (proto field names, every field), with
// 64-bit integers as JSON numbers.
//
// Exit status: 0 on success, 1 when the RPC fails (daemon unreachable, or it refused the
// request), 2 on a usage error (unknown command or flag, missing or malformed argument).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/fault_injector.h"
#include "fluxon/v1/admin.grpc.pb.h"
#include "fluxon/v1/peer.grpc.pb.h"
#include "ha/etcd_client.h"
#include "ha/leader_record.h"
#include "nlohmann/json.hpp"
#include "rpc_grpc/grpc_master.h"
#include "rpc_grpc/grpc_security.h"
#include "security/security_files.h"

namespace fluxon {
namespace {

using nlohmann::json;

constexpr int kExitRpcError = 1;
constexpr int kExitUsage = 2;

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

// Proto3 JSON prints 64-bit integers (int64, uint64, sint64, fixed64, sfixed64) as strings.
// Turns every such value in `j`, the JSON of a message of type `d`, back into a JSON number:
// singular, repeated and map-valued fields, in nested messages too (and the Int64Value and
// UInt64Value wrappers, whose JSON is their value).
void Int64StringsToNumbers(const google::protobuf::Descriptor& d, json& j) {
  using google::protobuf::Descriptor;
  using google::protobuf::FieldDescriptor;
  const std::function<void(const FieldDescriptor&, json&)> value = [&](const FieldDescriptor& f,
                                                                       json& v) {
    if (f.cpp_type() == FieldDescriptor::CPPTYPE_INT64 && v.is_string()) {
      if (int64_t n; absl::SimpleAtoi(v.get_ref<const std::string&>(), &n)) v = n;
    } else if (f.cpp_type() == FieldDescriptor::CPPTYPE_UINT64 && v.is_string()) {
      if (uint64_t n; absl::SimpleAtoi(v.get_ref<const std::string&>(), &n)) v = n;
    } else if (f.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      const Descriptor& m = *f.message_type();
      if (v.is_object()) {
        Int64StringsToNumbers(m, v);
      } else if (m.well_known_type() == Descriptor::WELLKNOWNTYPE_INT64VALUE ||
                 m.well_known_type() == Descriptor::WELLKNOWNTYPE_UINT64VALUE) {
        value(*m.field(0), v);
      }
    }
  };
  if (!j.is_object()) return;
  for (int i = 0; i < d.field_count(); ++i) {
    const FieldDescriptor& f = *d.field(i);
    const auto it = j.find(f.name());
    if (it == j.end()) continue;
    if (f.is_map() && it->is_object()) {
      for (auto& [map_key, v] : it->items()) value(*f.message_type()->map_value(), v);
    } else if (f.is_repeated() && it->is_array()) {
      for (json& v : *it) value(f, v);
    } else {
      value(f, *it);
    }
  }
}

// `m` as JSON: proto field names, every field (defaults and empty lists too), 64-bit integers as
// numbers.
json ProtoJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  if (auto s = google::protobuf::util::MessageToJsonString(m, &text, options); !s.ok()) {
    throw std::runtime_error(
        absl::StrCat("cannot print ", m.GetTypeName(), " as JSON: ", std::string(s.message())));
  }
  json j = json::parse(text);
  Int64StringsToNumbers(*m.GetDescriptor(), j);
  return j;
}

// Runs one admin call and prints its reply; each returns the error message of a failed RPC.
class Command {
 public:
  Command(const std::shared_ptr<grpc::Channel>& channel, std::string address,
          std::chrono::milliseconds timeout, bool as_json)
      : stub_(v1::AdminService::NewStub(channel)),
        peer_(v1::PeerService::NewStub(channel)),
        address_(std::move(address)),
        timeout_(timeout),
        as_json_(as_json) {}

  std::optional<std::string> Status() {
    v1::StatusReply r;
    if (grpc::Status s = stub_->Status(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("status", s);
    }
    if (as_json_) {
      Print(ProtoJson(r));
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
    if (!r.election().empty()) {
      t.AddRow({"election", r.election()});
      t.AddRow(
          {"leader", r.leader_address().empty()
                         ? std::string("none known")
                         : absl::StrFormat("%s (epoch %d)", r.leader_address(), r.leader_epoch())});
    }
    std::cout << t.Render();
    return std::nullopt;
  }

  std::optional<std::string> Owners() {
    v1::ListOwnersReply r;
    if (grpc::Status s = stub_->Owners(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("owners", s);
    }
    if (as_json_) {
      Print(ProtoJson(r));
      return std::nullopt;
    }
    Table t({"NODE", "GENERATION", "ROLE", "CAPACITY_BYTES", "ROUTES", "ADDRESS", "TRANSPORTS",
             "HEARD_MS_AGO", "LEASE_MS_LEFT", "INFLIGHT_GETS", "SOURCE_PINS", "FREE_BYTES",
             "COMMITTED_BYTES", "EVICTABLE_BYTES", "ROUTED_BYTES", "SOLE_BYTES"});
    for (const v1::OwnerInfo& o : r.owners()) {
      t.AddRow({Num(uint64_t{o.node_id()}), Num(o.generation()), o.role(), Num(o.capacity_bytes()),
                Num(o.routes()), o.address().empty() ? "-" : o.address(),
                o.transports().empty() ? "-" : absl::StrJoin(o.transports(), ","),
                Num(o.last_heard_ms_ago()), Num(o.lease_ms_left()), Num(o.inflight_gets()),
                Num(o.source_pins()), Num(o.capacity().free_bytes()),
                Num(o.capacity().committed_bytes()), Num(o.capacity().evictable_bytes()),
                Num(o.routed_bytes()), Num(o.sole_bytes())});
    }
    std::cout << t.Render();
    const v1::ClusterUsage& c = r.cluster();
    std::cout << absl::StrFormat("cluster: %d values at %d locations; logical %s, physical %s\n",
                                 c.routes(), c.locations(), Bytes(c.logical_bytes()),
                                 Bytes(c.physical_bytes()));
    return std::nullopt;
  }

  std::optional<std::string> Slots() {
    v1::SlotsReply r;
    if (grpc::Status s = stub_->Slots(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("slots", s);
    }
    if (as_json_) {
      json j = ProtoJson(r);
      for (int i = 0; i < r.classes_size(); ++i) {  // plus each class's used slots
        const v1::SlotClass& c = r.classes(i);
        j["classes"][i]["used"] = c.grants() * c.slots_per_grant() - c.free();
      }
      Print(j);
      return std::nullopt;
    }
    // Slot states in lifecycle order, then any the daemon reports that this tool does not know.
    std::vector<std::string> states = {"Free",    "Prepared",  "PendingLocalVisible",
                                       "Pending", "Committed", "Releasing"};
    std::map<std::string, int64_t> by_state(r.by_state().begin(), r.by_state().end());
    for (const auto& [state, n] : by_state) {
      if (std::find(states.begin(), states.end(), state) == states.end()) states.push_back(state);
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

  std::optional<std::string> Stats() {
    v1::CountersReply r;
    if (grpc::Status s = stub_->Stats(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("stats", s);
    }
    if (as_json_) {
      Print(ProtoJson(r)["counters"]);  // flat: counter name -> value
      return std::nullopt;
    }
    const std::map<std::string, int64_t> counters(r.counters().begin(), r.counters().end());
    Table t({"COUNTER", "VALUE"});
    for (const auto& [name, value] : counters) t.AddRow({name, Num(value)});
    std::cout << t.Render();
    return std::nullopt;
  }

  std::optional<std::string> Route(const std::string& key) {
    v1::RouteRequest req;
    req.set_key(key);
    v1::RouteReply r;
    if (grpc::Status s = stub_->GetRoute(Context().get(), req, &r); !s.ok()) {
      return RpcFailure("route", s);
    }
    if (as_json_) {
      json j = ProtoJson(r);
      j["key"] = key;
      j["route"] = r.found() ? ProtoJson(r.route()) : json(nullptr);
      Print(j);
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

  // Pages through the master's listing (one page is bounded by count and key bytes) until
  // `limit` keys or the last one.
  std::optional<std::string> Keys(const std::string& prefix, uint32_t limit) {
    v1::ListKeysReply r;
    v1::ListKeysRequest req;
    req.set_prefix(prefix);
    while (static_cast<uint32_t>(r.routes_size()) < limit) {
      req.set_limit(limit - static_cast<uint32_t>(r.routes_size()));
      v1::ListKeysReply page;
      if (grpc::Status s = stub_->Keys(Context().get(), req, &page); !s.ok()) {
        return RpcFailure("keys", s);
      }
      if (page.routes_size() == 0) break;
      req.set_start_after(page.routes(page.routes_size() - 1).key());
      for (v1::Route& route : *page.mutable_routes()) *r.add_routes() = std::move(route);
      if (!page.more()) break;
    }
    if (as_json_) {
      Print(json{{"keys", ProtoJson(r)["routes"]}});
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

  // Asks the owner at the admin address to pull a copy of each key's routed identity into its
  // own memory (replicas by pull, docs/replicas.md), on behalf of node `as_node`.
  std::optional<std::string> Pull(const std::vector<std::string>& keys, uint32_t as_node) {
    v1::PullReplicasRequest req;
    req.set_requester_node_id(as_node);
    std::vector<std::string> unrouted;
    for (const std::string& key : keys) {
      v1::RouteRequest rr;
      rr.set_key(key);
      v1::RouteReply route;
      if (grpc::Status s = stub_->GetRoute(Context().get(), rr, &route); !s.ok()) {
        return RpcFailure("route", s);
      }
      if (!route.found()) {
        unrouted.push_back(key);
        continue;
      }
      v1::PullItem* item = req.add_items();
      item->set_key(key);
      item->set_put_id(route.route().put_id());
      item->set_version(route.route().version());
      item->set_len(route.route().len());
    }
    v1::PullReplicasReply r;
    if (req.items_size() > 0) {
      if (grpc::Status s = peer_->PullReplicas(Context().get(), req, &r); !s.ok()) {
        return RpcFailure("pull", s);
      }
    }
    json outcomes = json::array();
    Table t({"KEY", "OUTCOME"});
    for (int i = 0; i < req.items_size(); ++i) {
      const std::string o = i < r.outcomes_size() ? v1::PullOutcome_Name(r.outcomes(i)) : "?";
      outcomes.push_back(json{{"key", req.items(i).key()}, {"outcome", o}});
      t.AddRow({req.items(i).key(), o});
    }
    for (const std::string& key : unrouted) {
      outcomes.push_back(json{{"key", key}, {"outcome", "NO_ROUTE"}});
      t.AddRow({key, "NO_ROUTE"});
    }
    if (as_json_) {
      Print(json{{"outcomes", outcomes}});
    } else {
      std::cout << t.Render();
    }
    return std::nullopt;
  }

  std::optional<std::string> Placement(uint32_t source, const std::vector<uint64_t>& groups) {
    v1::PlaceReplicasRequest req;
    req.set_source_node_id(source);
    for (uint64_t g : groups) req.add_group_bytes(g);
    v1::PlaceReplicasReply r;
    if (grpc::Status s = stub_->Placement(Context().get(), req, &r); !s.ok()) {
      return RpcFailure("placement", s);
    }
    if (as_json_) {
      Print(ProtoJson(r));
      return std::nullopt;
    }
    Table t({"GROUP", "BYTES", "TARGET", "ROLE", "ADDRESS", "REASON"});
    for (int i = 0; i < r.groups_size(); ++i) {
      const v1::PlacedGroup& g = r.groups(i);
      t.AddRow({Num(uint64_t(i)), Num(groups[i]), g.placed() ? Num(uint64_t{g.node_id()}) : "-",
                g.placed() ? g.role() : "-", g.placed() ? g.address() : "-",
                g.placed() ? "" : g.reason()});
    }
    std::cout << t.Render();
    return std::nullopt;
  }

  std::optional<std::string> FaultSet(const std::string& point, const std::string& action,
                                      uint32_t delay_ms, int32_t count) {
    v1::SetFaultRequest req;
    v1::FaultRule* rule = req.mutable_rule();
    rule->set_point(point);
    rule->set_action(action);
    rule->set_delay_ms(delay_ms);
    rule->set_count(count);
    v1::Empty r;
    if (grpc::Status s = stub_->SetFault(Context().get(), req, &r); !s.ok()) {
      return RpcFailure("fault set", s);
    }
    if (as_json_) {
      Print(json{{"ok", true}, {"rule", ProtoJson(*rule)}});
    } else {
      std::cout << absl::StrFormat("fault set: %s %s delay=%dms count=%s\n", point, action,
                                   rule->delay_ms(), CountText(count));
    }
    return std::nullopt;
  }

  std::optional<std::string> FaultClear(const std::string& point) {
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

  std::optional<std::string> FaultList() {
    v1::ListFaultsReply r;
    if (grpc::Status s = stub_->ListFaults(Context().get(), {}, &r); !s.ok()) {
      return RpcFailure("fault list", s);
    }
    if (as_json_) {
      Print(ProtoJson(r));
      return std::nullopt;
    }
    Table t({"POINT", "ACTION", "DELAY_MS", "REMAINING"});
    for (const v1::FaultRule& f : r.rules()) {
      t.AddRow({f.point(), f.action(), Num(uint64_t{f.delay_ms()}), CountText(f.count())});
    }
    std::cout << t.Render();
    return std::nullopt;
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + timeout_);
    return ctx;
  }

  std::string RpcFailure(const char* what, const grpc::Status& s) const {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::StrFormat("cannot reach fluxond admin at %s: %s", address_, s.error_message());
    }
    return absl::StrFormat("%s failed: %s (%s)", what, s.error_message(),
                           absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())));
  }

  void Print(const json& j) const { std::cout << j.dump(2) << "\n"; }

  static std::string CountText(int32_t count) {
    return count < 0 ? "until-cleared" : std::to_string(count);
  }

  std::unique_ptr<v1::AdminService::Stub> stub_;
  std::unique_ptr<v1::PeerService::Stub> peer_;  // an owner's peer service, on its admin port
  const std::string address_;
  const std::chrono::milliseconds timeout_;
  const bool as_json_;
};

// An integer option's check: the value must be a decimal integer for which `ok` holds, else the
// error is "--name: <requirement>". The value is rewritten in canonical decimal, so CLI11's
// conversion (which also reads 0x.. and leading-zero octal) sees what was checked.
CLI::Validator DecimalWhere(std::function<bool(int64_t)> ok, std::string requirement) {
  return CLI::Validator(
      [ok = std::move(ok), requirement = std::move(requirement)](std::string& value) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(value, &v)) return absl::StrCat("'", value, "' is not an integer");
        if (!ok(v)) return requirement;
        value = std::to_string(v);
        return std::string();
      },
      /*validator_desc=*/"");
}

// The help's list of commands: every leaf command with its words, arguments and options
// ("fault set POINT ACTION [--delay-ms N] [--count N]"), then its description.
class Formatter : public CLI::Formatter {
 public:
  std::string make_subcommand(const CLI::App* sub) const override {
    std::string out;
    for (const CLI::App* leaf : sub->get_subcommands({})) out += make_subcommand(leaf);
    if (!sub->get_subcommands({}).empty()) return out;
    std::stringstream line;
    CLI::detail::format_help(line, Synopsis(*sub), sub->get_description(), column_width_);
    return line.str();
  }

 private:
  static std::string Synopsis(const CLI::App& command) {
    std::string words = command.get_name();
    for (const CLI::App* p = command.get_parent(); p->get_parent() != nullptr;
         p = p->get_parent()) {
      words = absl::StrCat(p->get_name(), " ", words);
    }
    for (const CLI::Option* o : command.get_options()) {
      if (o == command.get_help_ptr()) continue;
      if (!o->get_positional()) {
        absl::StrAppend(&words, " [", o->get_name(), " ", o->get_type_name(), "]");
      } else if (o->get_required()) {
        absl::StrAppend(&words, " ", o->get_name());
      } else {
        absl::StrAppend(&words, " [", o->get_name(), "]");
      }
    }
    return words;
  }
};

// The message of a usage error. CLI11's "A subcommand is required" names neither the word it did
// not know nor the commands there are: "unknown command 'fault bogus' (set, clear, list)".
std::string UsageMessage(const CLI::App& app, const CLI::ParseError& e) {
  const CLI::App* at = &app;
  while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
  const std::vector<const CLI::App*> commands = at->get_subcommands({});
  if (commands.empty() || dynamic_cast<const CLI::RequiredError*>(&e) == nullptr) return e.what();
  std::vector<std::string> names;
  for (const CLI::App* c : commands) names.push_back(c->get_name());
  std::vector<std::string> path;
  for (const CLI::App* p = at; p->get_parent() != nullptr; p = p->get_parent()) {
    path.insert(path.begin(), p->get_name());
  }
  for (const std::string& word : app.remaining(/*recurse=*/true)) {
    if (word.empty() || word[0] == '-') continue;
    path.push_back(word);
    return absl::StrCat("unknown command '", absl::StrJoin(path, " "), "' (",
                        absl::StrJoin(names, ", "), ")");
  }
  if (path.empty()) return absl::StrCat("a command is required: ", absl::StrJoin(names, ", "));
  return absl::StrCat(absl::StrJoin(path, " "), " needs a command: ", absl::StrJoin(names, ", "));
}

// The flags every command takes.
struct GlobalFlags {
  std::string address = "127.0.0.1:50152";
  std::vector<std::string> etcd_endpoints;  // set: the command goes to the leading master
  std::string etcd_key = "/fluxon/default/master/leader";
  bool as_json = false;
  int32_t timeout_ms = 5000;
  TlsConfig tls;  // mutual TLS (the node's security.tls): all three files or none
  std::string tls_name;
};

void AddGlobalFlags(CLI::App& app, GlobalFlags* g) {
  CLI::Option* admin = app.add_option("--admin", g->address, "fluxond admin service")
                           ->type_name("ADDRESS")
                           ->capture_default_str();
  CLI::Option* etcd =
      app.add_option("--etcd", g->etcd_endpoints,
                     "etcd members (host:port, comma-separated): the command goes to the master "
                     "that leads the election there, at the admin address it publishes")
          ->type_name("ENDPOINTS")
          ->delimiter(',')
          ->excludes(admin);
  app.add_option("--etcd-key", g->etcd_key, "the leadership key (the masters' election.key)")
      ->type_name("KEY")
      ->capture_default_str()
      ->needs(etcd);
  app.add_option("--tls-cert", g->tls.cert_file, "client certificate (PEM) for a TLS admin service")
      ->type_name("FILE")
      ->envname("FLUXON_TLS_CERT");
  app.add_option("--tls-key", g->tls.key_file, "its private key (PEM)")
      ->type_name("FILE")
      ->envname("FLUXON_TLS_KEY");
  app.add_option("--tls-ca", g->tls.ca_file,
                 "CA certificate the node's certificate chains to (PEM)")
      ->type_name("FILE")
      ->envname("FLUXON_TLS_CA");
  app.add_option("--tls-name", g->tls_name,
                 "name to verify the node's certificate against (default: the --admin host)")
      ->type_name("NAME");
  app.add_flag("--json", g->as_json, "print JSON instead of tables");
  app.add_option("--timeout-ms", g->timeout_ms, "deadline of each RPC in milliseconds")
      ->type_name("N")
      ->capture_default_str()
      ->check(DecimalWhere([](int64_t v) { return v > 0; }, "must be positive"));
}

// The arguments of the commands (CLI11 writes them while parsing; the runs read them after).
struct CommandArgs {
  std::string key;
  std::string prefix;
  uint32_t limit = 100;
  std::string point, action;
  uint32_t delay_ms = 0;
  int32_t count = -1;
  std::string clear_point;
  uint32_t source = 0;
  std::vector<uint64_t> group_bytes;
  std::vector<std::string> pull_keys;
  uint32_t as_node = 0;
};
// Each command's run, by the (leaf) subcommand that selects it.
using Runs = std::map<const CLI::App*, std::function<std::optional<std::string>(Command&)>>;

void AddInspectCommands(CLI::App& app, CommandArgs* a, Runs* runs) {
  (*runs)[app.add_subcommand("status", "role, version, uptime, segment, grants, keys, clients")] =
      [](Command& c) { return c.Status(); };
  (*runs)[app.add_subcommand("owners", "owners registered with the master")] = [](Command& c) {
    return c.Owners();
  };
  (*runs)[app.add_subcommand("slots", "slots by state and per size class")] = [](Command& c) {
    return c.Slots();
  };
  CLI::App* route =
      app.add_subcommand("route", "the master's route of KEY and the owner's local state of it");
  route->add_option("KEY", a->key, "the key")->required();
  (*runs)[route] = [a](Command& c) { return c.Route(a->key); };
  CLI::App* pull = app.add_subcommand(
      "pull", "the owner at --admin pulls a copy of each KEY's routed value into its memory");
  pull->add_option("KEY", a->pull_keys, "the keys")->required();
  pull->add_option("--as-node", a->as_node,
                   "the node asking (with node-bound certificates: the certificate's)")
      ->type_name("N")
      ->capture_default_str();
  (*runs)[pull] = [a](Command& c) { return c.Pull(a->pull_keys, a->as_node); };
  CLI::App* keys = app.add_subcommand("keys", "published keys (sorted; default limit 100)");
  keys->add_option("--prefix", a->prefix, "list only keys starting with P")->type_name("P");
  keys->add_option("--limit", a->limit, "list at most N keys")
      ->type_name("N")
      ->capture_default_str()
      ->check(DecimalWhere([](int64_t v) { return v > 0; }, "must be positive"));
  (*runs)[keys] = [a](Command& c) { return c.Keys(a->prefix, a->limit); };
  CLI::App* placement = app.add_subcommand(
      "placement", "where the master would place replicas of a source's groups (reserves nothing)");
  placement->add_option("--source", a->source, "the source owner's node_id")
      ->required()
      ->type_name("NODE");
  placement->add_option("--group-bytes", a->group_bytes, "slot bytes of each atomic group")
      ->required()
      ->delimiter(',')
      ->type_name("B,B,...")
      ->check(CLI::PositiveNumber);
  (*runs)[placement] = [a](Command& c) { return c.Placement(a->source, a->group_bytes); };
  (*runs)[app.add_subcommand("stats", "every owner and master counter")] = [](Command& c) {
    return c.Stats();
  };
}

CLI::App* AddFaultCommands(CLI::App& app, CommandArgs* a, Runs* runs) {
  CLI::App* fault = app.add_subcommand("fault", "fault injection: set, clear or list rules");
  fault->require_subcommand(1);
  const std::string actions = FaultActionList();
  CLI::App* fault_set = fault->add_subcommand(
      "set", absl::StrCat("inject a fault at POINT (e.g. master.PublishBatch); ACTION: ",
                          absl::StrReplaceAll(actions, {{", ", "|"}}),
                          "; --count -1 (default): until cleared"));
  fault_set->add_option("POINT", a->point, "where the fault fires, e.g. master.PublishBatch")
      ->required();
  fault_set->add_option("ACTION", a->action, actions)
      ->required()
      ->check(CLI::Validator(
          [actions](const std::string& name) {
            return ParseFaultAction(name).ok()
                       ? std::string()
                       : absl::StrCat("unknown fault action '", name, "' (", actions, ")");
          },
          /*validator_desc=*/""));
  fault_set->add_option("--delay-ms", a->delay_ms, "delay of a delay rule in milliseconds")
      ->type_name("N")
      ->check(DecimalWhere([](int64_t v) { return v >= 0; }, "must not be negative"));
  fault_set->add_option("--count", a->count, "how many times the rule fires (-1: until cleared)")
      ->type_name("N")
      ->check(DecimalWhere([](int64_t v) { return v > 0 || v == -1; }, "must be positive or -1"));
  (*runs)[fault_set] = [a](Command& c) {
    return c.FaultSet(a->point, a->action, a->delay_ms, a->count);
  };
  CLI::App* fault_clear =
      fault->add_subcommand("clear", "remove the rules of POINT (all rules without POINT)");
  fault_clear->add_option("POINT", a->clear_point, "the fault point");
  (*runs)[fault_clear] = [a](Command& c) { return c.FaultClear(a->clear_point); };
  (*runs)[fault->add_subcommand("list", "the active fault rules")] = [](Command& c) {
    return c.FaultList();
  };
  return fault;
}

// The channel security the TLS flags ask for, or the usage error that says why not.
absl::StatusOr<GrpcSecurity> SecurityFromFlags(const GlobalFlags& g) {
  const int tls_files = !g.tls.cert_file.empty() + !g.tls.key_file.empty() + !g.tls.ca_file.empty();
  if (tls_files == 0) {
    if (!g.tls_name.empty()) {
      return absl::InvalidArgumentError("--tls-name needs --tls-cert, --tls-key and --tls-ca");
    }
    return GrpcSecurity::Plaintext();
  }
  if (tls_files != 3) {
    return absl::InvalidArgumentError(
        "--tls-cert, --tls-key and --tls-ca go together (mutual TLS)\nrun fluxonctl --help");
  }
  absl::StatusOr<security::TlsMaterial> material = security::LoadTlsMaterial(g.tls);
  if (!material.ok()) return absl::InvalidArgumentError(material.status().message());
  return GrpcSecurity::MutualTls(std::move(*material));
}

// The admin address of the master that leads the election in etcd (ha/leader_record.h), reached
// with the same certificate as the admin service when TLS is on.
absl::StatusOr<std::string> LeaderAdminAddress(const GlobalFlags& g, const GrpcSecurity& security) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd =
      EtcdClient::Connect(g.etcd_endpoints, std::chrono::milliseconds(g.timeout_ms),
                          security.tls() ? security.ChannelCredentials() : nullptr);
  if (!etcd.ok()) return etcd.status();
  absl::StatusOr<LeaderRecord> leader = ReadLeaderRecord(**etcd, g.etcd_key);
  if (!leader.ok()) {
    return absl::Status(
        leader.status().code(),
        absl::StrFormat("cannot find the leading master in etcd (%s): %s",
                        absl::StrJoin(g.etcd_endpoints, ","), leader.status().message()));
  }
  return leader->admin_address;
}

// "fluxonctl help" and the single-dash "-help" ask for the help too.
std::vector<std::string> NormalizeHelpWords(int argc, char** argv) {
  std::vector<std::string> words(argv, argv + argc);
  for (size_t i = 1; i < words.size() && words[i] != "--"; ++i) {
    if (words[i] == "-help" || (i == 1 && words[i] == "help")) words[i] = "--help";
  }
  return words;
}

int Main(int argc, char** argv) {
  std::vector<std::string> words = NormalizeHelpWords(argc, argv);
  std::vector<char*> args;
  for (std::string& w : words) args.push_back(w.data());

  CLI::App app("fluxonctl: the admin CLI of fluxond (its AdminService over gRPC)", "fluxonctl");
  app.formatter(std::make_shared<Formatter>());
  app.get_formatter()->column_width(34);
  app.footer("Exit status: 0 ok, 1 RPC failure, 2 usage error.");
  app.fallthrough();  // subcommands hand the global flags up: fluxonctl route KEY --json
  app.require_subcommand(1);
  GlobalFlags flags;
  AddGlobalFlags(app, &flags);
  CommandArgs command_args;
  Runs runs;
  AddInspectCommands(app, &command_args, &runs);
  CLI::App* fault = AddFaultCommands(app, &command_args, &runs);
  for (CLI::App* sub : app.get_subcommands({})) sub->group("Commands");
  for (CLI::App* sub : fault->get_subcommands({})) sub->group("Commands");

  if (argc == 1) {
    std::cerr << app.help();
    return kExitUsage;
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::cerr << "fluxonctl: " << UsageMessage(app, e) << "\nrun fluxonctl --help\n";
    return kExitUsage;
  }
  const CLI::App* selected = &app;
  while (!selected->get_subcommands().empty()) selected = selected->get_subcommands().front();
  absl::StatusOr<GrpcSecurity> security = SecurityFromFlags(flags);
  if (!security.ok()) {
    std::cerr << "fluxonctl: " << security.status().message() << "\n";
    return kExitUsage;
  }
  std::string address = flags.address;
  if (!flags.etcd_endpoints.empty()) {
    absl::StatusOr<std::string> leader = LeaderAdminAddress(flags, *security);
    if (!leader.ok()) {
      std::cerr << "fluxonctl: " << leader.status().message() << "\n";
      return leader.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                          : kExitRpcError;
    }
    address = *leader;
  }
  // The daemon's message limits, not gRPC's 4 MiB default: every admin answer the daemon may
  // send (a page of keys, a large owner listing) is readable. Not the control channels' short
  // reconnect backoff: its minimum is also the connect (and TLS handshake) deadline, which one
  // fluxonctl call on a busy machine can outlast.
  grpc::ChannelArguments limits;
  limits.SetMaxReceiveMessageSize(kGrpcMaxMessageBytes);
  limits.SetMaxSendMessageSize(kGrpcMaxMessageBytes);
  Command command(security->Channel(address, limits, flags.tls_name), address,
                  std::chrono::milliseconds(flags.timeout_ms), flags.as_json);
  try {
    if (std::optional<std::string> error = runs.at(selected)(command)) {
      std::cerr << "fluxonctl: " << *error << "\n";
      return kExitRpcError;
    }
  } catch (const std::exception& e) {
    std::cerr << "fluxonctl: " << e.what() << "\n";
    return kExitRpcError;
  }
  return 0;
}

}  // namespace
}  // namespace fluxon

int main(int argc, char** argv) { return fluxon::Main(argc, argv); }
