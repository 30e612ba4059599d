#include "config/config.h"

#include <arpa/inet.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/fault_action.h"
#include "fluxon/status.h"
#include "fluxon/units.h"

namespace fluxon {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kEmbedded:
      return "embedded";
    case Role::kMaster:
      return "master";
    case Role::kOwner:
      return "owner";
    case Role::kRemoteCache:
      return "remote_cache";
    case Role::kClient:
      return "client";
  }
  return "unknown";
}

Config DefaultEmbeddedConfig() {
  Config c;
  c.role = Role::kEmbedded;
  c.master = MasterConfig{};
  c.owner = OwnerConfig{};
  return c;
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  std::string s(absl::StripAsciiWhitespace(text));
  static const std::pair<const char*, double> kUnits[] = {{"TiB", 1024.0 * 1024 * 1024 * 1024},
                                                          {"GiB", 1024.0 * 1024 * 1024},
                                                          {"MiB", 1024.0 * 1024},
                                                          {"KiB", 1024.0},
                                                          {"TB", 1e12},
                                                          {"GB", 1e9},
                                                          {"MB", 1e6},
                                                          {"KB", 1e3},
                                                          {"B", 1.0}};
  double mult = 1.0;
  for (const auto& [suffix, m] : kUnits) {
    const std::string suf(suffix);
    if (s.size() > suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0) {
      s = std::string(absl::StripAsciiWhitespace(s.substr(0, s.size() - suf.size())));
      mult = m;
      break;
    }
  }
  double value = 0;
  if (s.empty() || !absl::SimpleAtod(s, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a byte size", text));
  }
  const double bytes = value * mult;
  if (bytes < 0 || bytes > 1.8e19 || std::floor(bytes) != bytes) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a whole number of bytes", text));
  }
  return static_cast<uint64_t>(bytes);
}

namespace config_internal {
FLUXON_SETTINGS_OF(Config, FLUXON_TOP_SETTINGS)
FLUXON_SETTINGS_OF(SegmentConfig, FLUXON_SEGMENT_SETTINGS)
FLUXON_SETTINGS_OF(ExpectedCapacityConfig, FLUXON_EXPECTED_CAPACITY_SETTINGS)
FLUXON_SETTINGS_OF(LocalReserveConfig, FLUXON_LOCAL_RESERVE_SETTINGS)
FLUXON_SETTINGS_OF(DemotionConfig, FLUXON_DEMOTION_SETTINGS)
FLUXON_SETTINGS_OF(OwnerConfig, FLUXON_OWNER_SETTINGS)
FLUXON_SETTINGS_OF(MasterConfig, FLUXON_MASTER_SETTINGS)
FLUXON_SETTINGS_OF(ReplicaPlacementConfig, FLUXON_REPLICA_PLACEMENT_SETTINGS)
FLUXON_SETTINGS_OF(ClientConfig, FLUXON_CLIENT_SETTINGS)
FLUXON_SETTINGS_OF(ElectionConfig, FLUXON_ELECTION_SETTINGS)
FLUXON_SETTINGS_OF(AdminConfig, FLUXON_ADMIN_SETTINGS)
FLUXON_SETTINGS_OF(TlsConfig, FLUXON_TLS_SETTINGS)
FLUXON_SETTINGS_OF(SecurityConfig, FLUXON_SECURITY_SETTINGS)
}  // namespace config_internal

namespace {

// [+-]?[0-9]+ (surrounding blanks allowed): what SimpleAtoi would take if the value fit.
bool IsDecimalInteger(absl::string_view s) {
  s = absl::StripAsciiWhitespace(s);
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (s.empty()) return false;
  for (char ch : s) {
    if (!absl::ascii_isdigit(ch)) return false;
  }
  return true;
}

bool IsIpv4(absl::string_view s) {
  in_addr a;
  return inet_pton(AF_INET, std::string(s).c_str(), &a) == 1;
}

// An IPv6 literal, optionally with a %scope suffix (fe80::1%eth0).
bool IsIpv6(absl::string_view s) {
  const size_t pct = s.find('%');
  if (pct != absl::string_view::npos) {
    if (pct + 1 == s.size()) return false;
    s = s.substr(0, pct);
  }
  in6_addr a;
  return inet_pton(AF_INET6, std::string(s).c_str(), &a) == 1;
}

// An RFC 1123 host name: dot-separated labels of 1..63 letters, digits and '-', neither first nor
// last '-', 253 bytes at most. All-numeric labels are an IPv4 address or nothing.
bool IsHostname(absl::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  bool all_numeric = true;
  for (absl::string_view label : absl::StrSplit(s, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char ch : label) {
      if (!absl::ascii_isalnum(ch) && ch != '-') return false;
      if (!absl::ascii_isdigit(ch)) all_numeric = false;
    }
  }
  return !all_numeric;
}

// Why `address` is not host:port (empty when it is). The host is a hostname, an IPv4 address or
// a bracketed IPv6 address; the port a decimal in [0, 65535], 0 only when allow_port_zero.
std::string HostPortProblem(absl::string_view address, bool allow_port_zero) {
  absl::string_view host, port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return "'[' without a closing ']'";
    host = address.substr(1, close - 1);
    absl::string_view rest = address.substr(close + 1);
    if (!absl::ConsumePrefix(&rest, ":")) return "no :port after the bracketed host";
    port = rest;
    if (!IsIpv6(host)) return absl::StrFormat("host '[%s]' is not an IPv6 address", host);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return "no :port";
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.empty()) return "empty host";
    if (absl::StrContains(host, ':')) {
      return "an IPv6 host must be bracketed, e.g. [::1]:50151";
    }
    if (!IsIpv4(host) && !IsHostname(host)) {
      return absl::StrFormat("host '%s' is not a hostname, IPv4 or bracketed IPv6 address", host);
    }
  }
  bool digits = !port.empty();
  for (char ch : port) digits = digits && absl::ascii_isdigit(ch);
  if (!digits) return absl::StrFormat("port '%s' is not a number in [0, 65535]", port);
  int p = 0;
  if (port.size() > 5 || !absl::SimpleAtoi(port, &p) || p > 65535) {
    return absl::StrFormat("port %s is not in [0, 65535]", port);
  }
  if (p == 0 && !allow_port_zero) {
    return "port 0 is only for listen addresses (the kernel picks); name the peer's port";
  }
  return "";
}

// Human-readable size for messages: "4.0 GiB".
std::string HumanGiB(uint64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / kGiB);
}

// Reads one mapping, remembering which keys were consumed so leftovers can be reported.
class Section {
 public:
  Section(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  std::string Key(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }
  bool Has(const std::string& k) {
    seen_.insert(k);
    return node_[k].IsDefined() && !node_[k].IsNull();
  }
  YAML::Node Get(const std::string& k) {
    seen_.insert(k);
    return node_[k];
  }

  absl::Status Str(const std::string& k, std::string* out) {
    if (!Has(k)) return absl::OkStatus();
    const YAML::Node n = Get(k);
    if (!n.IsScalar()) return Bad(k, "must be a string");
    *out = n.Scalar();
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& k, bool* out) {
    if (!Has(k)) return absl::OkStatus();
    try {
      *out = Get(k).as<bool>();
    } catch (const YAML::Exception&) {
      return Bad(k, "must be true or false");
    }
    return absl::OkStatus();
  }
  absl::Status Int(const std::string& k, int64_t* out) {
    if (!Has(k)) return absl::OkStatus();
    const YAML::Node n = Get(k);
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), out)) return Bad(k, "must be an integer");
    return absl::OkStatus();
  }
  // A millisecond setting in (0, kMaxSettingMs].
  absl::Status PositiveMs(const std::string& k, std::chrono::milliseconds* out) {
    return BoundedMs(k, 1, out);
  }
  // A millisecond setting in [min_ms, kMaxSettingMs] (min_ms is 0 or 1). The bound keeps every
  // deadline (now() + setting, in any clock's ticks) far from overflow; a decimal integer too
  // large for int64 is reported against the same bound rather than as "not an integer".
  absl::Status BoundedMs(const std::string& k, int64_t min_ms, std::chrono::milliseconds* out) {
    if (!Has(k)) return absl::OkStatus();
    const YAML::Node n = Get(k);
    if (!n.IsScalar()) return Bad(k, "must be an integer");
    const std::string& s = n.Scalar();
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) {
      if (!IsDecimalInteger(s)) return Bad(k, "must be an integer");
      v = absl::StartsWith(absl::StripAsciiWhitespace(s), "-")
              ? std::numeric_limits<int64_t>::min()
              : std::numeric_limits<int64_t>::max();
    }
    if (v < min_ms) {
      return Bad(k, min_ms > 0 ? absl::StrFormat("must be > 0 ms, got %s", s)
                               : absl::StrFormat("must be >= 0 ms, got %s", s));
    }
    if (v > kMaxSettingMs) {
      return Bad(k, absl::StrFormat("must be at most %d ms (%d h), got %s", kMaxSettingMs,
                                    kMaxSettingMs / 3'600'000, s));
    }
    *out = std::chrono::milliseconds(v);
    return absl::OkStatus();
  }
  absl::Status PositiveBytes(const std::string& k, uint64_t* out, bool zero_ok = false) {
    if (!Has(k)) return absl::OkStatus();
    const YAML::Node n = Get(k);
    if (!n.IsScalar()) return Bad(k, "must be a byte size");
    const std::string& s = n.Scalar();
    if (!s.empty() && s[0] == '-') return Bad(k, "must be > 0, got " + s);
    absl::StatusOr<uint64_t> v = ParseByteSize(s);
    if (!v.ok()) return Bad(k, std::string(v.status().message()));
    if (*v == 0 && !zero_ok) return Bad(k, "must be > 0");
    *out = *v;
    return absl::OkStatus();
  }
  absl::Status Ratio(const std::string& k, double* out) {
    if (!Has(k)) return absl::OkStatus();
    const YAML::Node n = Get(k);
    double v = 0;
    if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v)) return Bad(k, "must be a number");
    if (!(v > 0.0 && v < 1.0)) return Bad(k, absl::StrFormat("must lie in (0, 1), got %g", v));
    *out = v;
    return absl::OkStatus();
  }
  // Rejects a host:port value (see HostPortProblem); an unset key keeps its default.
  absl::Status CheckHostPort(const std::string& k, const std::string& value,
                             bool allow_port_zero) const {
    if (value.empty()) return Bad(k, "must not be empty (host:port)");
    const std::string why = HostPortProblem(value, allow_port_zero);
    if (why.empty()) return absl::OkStatus();
    return Bad(k, absl::StrFormat("'%s' is not host:port (%s)", value, why));
  }
  // A Unix socket path must fit sockaddr_un::sun_path with its terminating NUL, or bind/connect
  // fail at run time.
  absl::Status CheckSocketPath(const std::string& k, const std::string& value) const {
    if (value.empty()) return Bad(k, "must not be empty");
    constexpr size_t kSunPath = sizeof(sockaddr_un{}.sun_path);
    if (value.size() >= kSunPath) {
      return Bad(k, absl::StrFormat("is %d bytes; a Unix socket path must be shorter than %d bytes "
                                    "(sun_path, including the NUL)",
                                    value.size(), kSunPath));
    }
    return absl::OkStatus();
  }
  // One reader per setting kind (config/settings.h): an unset key keeps the field's default.
  absl::Status Read(const std::string& k, config_internal::Millis kind,
                    std::chrono::milliseconds* out) {
    return BoundedMs(k, kind.min_ms, out);
  }
  absl::Status Read(const std::string& k, config_internal::Bytes, uint64_t* out) {
    return PositiveBytes(k, out);
  }
  absl::Status Read(const std::string& k, config_internal::BytesOrZero, uint64_t* out) {
    return PositiveBytes(k, out, /*zero_ok=*/true);
  }
  absl::Status Read(const std::string& k, config_internal::Ratio, double* out) {
    return Ratio(k, out);
  }
  absl::Status Read(const std::string& k, config_internal::Text, std::string* out) {
    return Str(k, out);
  }
  absl::Status Read(const std::string& k, config_internal::NonEmptyText, std::string* out) {
    if (!Has(k)) return absl::OkStatus();
    FLUXON_RETURN_IF_ERROR(Str(k, out));
    if (out->empty()) return Bad(k, "must not be empty (omit it for none)");
    return absl::OkStatus();
  }
  absl::Status Read(const std::string& k, config_internal::Flag, bool* out) { return Bool(k, out); }
  template <typename T>
  absl::Status Read(const std::string& k, config_internal::IntIn<T> kind, T* out) {
    int64_t v = static_cast<int64_t>(*out);
    FLUXON_RETURN_IF_ERROR(Int(k, &v));
    if (v < kind.lo || v > kind.hi) {
      return Bad(k, absl::StrFormat("must be in [%d, %d], got %d", kind.lo, kind.hi, v));
    }
    *out = static_cast<T>(v);
    return absl::OkStatus();
  }
  absl::Status Read(const std::string& k, config_internal::SocketPath, std::string* out) {
    FLUXON_RETURN_IF_ERROR(Str(k, out));
    return CheckSocketPath(k, *out);
  }
  absl::Status Read(const std::string& k, config_internal::ListenAddress, std::string* out) {
    FLUXON_RETURN_IF_ERROR(Str(k, out));
    return CheckHostPort(k, *out, /*allow_port_zero=*/true);
  }
  absl::Status Read(const std::string& k, config_internal::PeerAddress, std::string* out) {
    FLUXON_RETURN_IF_ERROR(Str(k, out));
    return out->empty() ? absl::OkStatus() : CheckHostPort(k, *out, /*allow_port_zero=*/false);
  }
  absl::Status Read(const std::string& k, config_internal::OptionalListen, std::string* out) {
    FLUXON_RETURN_IF_ERROR(Str(k, out));
    return out->empty() ? absl::OkStatus() : CheckHostPort(k, *out, /*allow_port_zero=*/true);
  }
  absl::Status Read(const std::string& k, config_internal::IpLiteral, std::string* out) {
    FLUXON_RETURN_IF_ERROR(Str(k, out));
    if (out->empty()) return Bad(k, "must not be empty");
    // The metrics exposer (prometheus-cpp's civetweb) binds an IP literal: no port, no brackets,
    // no name lookup. An IPv6 literal passes here; a civetweb built without IPv6 (Debian 12's)
    // refuses it when the node starts, with that reason.
    if (!IsIpv4(*out) && !IsIpv6(*out)) {
      return Bad(k, absl::StrFormat("'%s' is not an IP address (IPv4 or unbracketed IPv6, no "
                                    "port; host names are not resolved)",
                                    *out));
    }
    return absl::OkStatus();
  }
  absl::Status Read(const std::string& k, const config_internal::OneOf& kind, std::string* out) {
    FLUXON_RETURN_IF_ERROR(Str(k, out));
    for (const char* w : kind.words) {
      if (*out == w) return absl::OkStatus();
    }
    return Bad(k, "must be one of " + absl::StrJoin(kind.words, ", "));
  }
  // Every setting of T's X-list (config/settings.h); the first problem is returned.
  template <typename T>
  absl::Status ReadSettings(T* obj) {
    absl::Status status;
    config_internal::Settings<T>::Visit(
        *obj, [&](const char* key, const auto& kind, auto& field, const char*) {
          if (status.ok()) status = Read(key, kind, &field);
        });
    return status;
  }
  absl::StatusOr<Section> Child(const std::string& k) {
    const YAML::Node n = Get(k);
    if (!n.IsMap()) return Bad(k, "must be a mapping");
    return Section(n, Key(k));
  }
  // Rejects keys that no reader asked for.
  absl::Status Finish() const {
    for (const auto& kv : node_) {
      const std::string k = kv.first.Scalar();
      if (!seen_.contains(k)) {
        return absl::InvalidArgumentError(absl::StrFormat("%s: unknown key", Key(k)));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Bad(const std::string& k, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", Key(k), why));
  }

 private:
  YAML::Node node_;
  std::string path_;
  std::set<std::string> seen_;
};

absl::StatusOr<Role> ParseRole(const std::string& s) {
  for (Role r : {Role::kEmbedded, Role::kMaster, Role::kOwner, Role::kRemoteCache, Role::kClient}) {
    if (s == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("role: '%s' is not one of embedded, master, owner, remote_cache, client", s));
}

// Every map in the document has each key once, recursively (fault entries included). yaml-cpp
// keeps both copies of a repeated key and node[k] reads only the first, so a later override
// would be silently ignored.
absl::Status CheckNoDuplicateKeys(const YAML::Node& node, const std::string& path) {
  if (node.IsMap()) {
    std::set<std::string> keys;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) {
        return absl::InvalidArgumentError(absl::StrFormat("config: a key under %s is not a string",
                                                          path.empty() ? "the top level" : path));
      }
      const std::string& k = kv.first.Scalar();
      const std::string full = path.empty() ? k : path + "." + k;
      if (!keys.insert(k).second) {
        return absl::InvalidArgumentError(absl::StrFormat("config: key %s appears twice", full));
      }
    }
    for (const auto& kv : node) {
      const std::string& k = kv.first.Scalar();
      FLUXON_RETURN_IF_ERROR(CheckNoDuplicateKeys(kv.second, path.empty() ? k : path + "." + k));
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      FLUXON_RETURN_IF_ERROR(CheckNoDuplicateKeys(node[i], absl::StrFormat("%s[%d]", path, i)));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseLocalReserve(Section& lr, LocalReserveConfig* l) {
  if (lr.Has("expected_capacity")) {
    FLUXON_ASSIGN_OR_RETURN(Section ec, lr.Child("expected_capacity"));
    ExpectedCapacityConfig e;
    if (!ec.Has("value_len")) return ec.Bad("value_len", "is required");
    if (!ec.Has("payload_capacity_bytes")) return ec.Bad("payload_capacity_bytes", "is required");
    FLUXON_RETURN_IF_ERROR(ec.ReadSettings(&e));
    if (e.value_len > kMaxValueBytes) {
      return ec.Bad("value_len",
                    absl::StrFormat("%d bytes exceeds the 512 MiB slot limit", e.value_len));
    }
    FLUXON_RETURN_IF_ERROR(ec.Finish());
    l->expected_capacity = e;
  }
  FLUXON_RETURN_IF_ERROR(lr.ReadSettings(l));
  if (l->claim_hard_timeout <= l->claim_soft_timeout) {
    return lr.Bad("claim_hard_timeout_ms",
                  absl::StrFormat("must be greater than claim_soft_timeout_ms (%d), got %d",
                                  l->claim_soft_timeout.count(), l->claim_hard_timeout.count()));
  }
  return lr.Finish();
}

absl::Status ParseTransports(Section& sec, std::vector<std::string>* out) {
  if (!sec.Has("transports")) return absl::OkStatus();
  const YAML::Node list = sec.Get("transports");
  if (!list.IsSequence() || list.size() == 0) {
    return sec.Bad("transports", "must be a non-empty list, e.g. [tcp]");
  }
  out->clear();
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].IsScalar()) return sec.Bad("transports", "entries must be transport names");
    const std::string name = list[i].Scalar();
    if (name == "rdma") {
      return sec.Bad("transports",
                     "rdma is not served by fluxond yet (an owner serves one transport; the "
                     "verbs transport and its queue-pair exchange over the authenticated peer "
                     "service are built and tested, not yet wired into the owner); use [tcp]");
    }
    if (name != "tcp") {
      return sec.Bad("transports", "unknown transport '" + name + "' (known: tcp, rdma)");
    }
    for (const std::string& t : *out) {
      if (t == name) return sec.Bad("transports", "'" + name + "' is listed twice");
    }
    out->push_back(name);
  }
  return absl::OkStatus();
}

// The rules relating the owner's settings to each other and to the machine.
absl::Status CheckOwnerCapacity(const Section& sec, const OwnerConfig& o,
                                const MachineLimits& machine) {
  if (o.local_reserve.expected_capacity) {
    const auto& e = *o.local_reserve.expected_capacity;
    const uint64_t grants = ExpectedGrants(e.value_len, e.payload_capacity_bytes);
    const uint64_t positions = o.segment.size_bytes / kGrantBytes;
    if (grants > positions) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: prewarm needs %d grants (%d bytes) but owner.segment.size is %d bytes (%d grants)",
          sec.Key("local_reserve.expected_capacity"), grants, grants * kGrantBytes,
          o.segment.size_bytes, positions));
    }
  }
  if (o.segment.size_bytes < kGrantBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes is smaller than one 512 MiB grant", sec.Key("segment.size"),
                        o.segment.size_bytes));
  }
  // Host memory cannot back a segment larger than the machine: mapping or populating it fails at
  // start, or the OOM killer takes the owner once it fills.
  if (machine.physical_memory_bytes != 0 && o.segment.size_bytes > machine.physical_memory_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes (%s) is larger than this machine's physical memory, %d bytes (%s)",
        sec.Key("segment.size"), o.segment.size_bytes, HumanGiB(o.segment.size_bytes),
        machine.physical_memory_bytes, HumanGiB(machine.physical_memory_bytes)));
  }
  return absl::OkStatus();
}

// Demotion runs ahead of pressure, and moves values to another node through the master.
absl::Status CheckDemotion(const Section& sec, const OwnerConfig& o) {
  const DemotionConfig& d = o.demotion;
  if (!d.keep_fetched_copies && d.remote_budget_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: false decides what one ranking does with a value fetched back, so it needs %s",
        sec.Key("demotion.keep_fetched_copies"), sec.Key("demotion.remote_budget_bytes")));
  }
  if (!d.enabled) {
    if (d.remote_budget_bytes > 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: ranks demoted values, so it needs %s: true",
                          sec.Key("demotion.remote_budget_bytes"), sec.Key("demotion.enabled")));
    }
    return absl::OkStatus();
  }
  if (d.start_ratio <= 0 || d.start_ratio >= o.hot_capacity_ratio) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %g must be above 0 and below owner.hot_capacity_ratio (%g): demotion runs ahead of "
        "the pressure that deletes",
        sec.Key("demotion.start_ratio"), d.start_ratio, o.hot_capacity_ratio));
  }
  if (d.max_bytes_in_flight == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: must be at least 1 byte", sec.Key("demotion.max_bytes_in_flight")));
  }
  if (o.data_address.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: a demotion moves values to a remote_cache through the master and this owner's data "
        "plane: set owner.data_address (and owner.master_address or an election section)",
        sec.Key("demotion.enabled")));
  }
  return absl::OkStatus();
}

absl::Status ParseOwner(Section& sec, OwnerConfig* o, const MachineLimits& machine) {
  if (sec.Has("segment")) {
    FLUXON_ASSIGN_OR_RETURN(Section seg, sec.Child("segment"));
    FLUXON_RETURN_IF_ERROR(seg.ReadSettings(&o->segment));
    FLUXON_RETURN_IF_ERROR(seg.Finish());
  }
  if (sec.Has("local_reserve")) {
    FLUXON_ASSIGN_OR_RETURN(Section lr, sec.Child("local_reserve"));
    FLUXON_RETURN_IF_ERROR(ParseLocalReserve(lr, &o->local_reserve));
  }
  if (sec.Has("demotion")) {
    FLUXON_ASSIGN_OR_RETURN(Section d, sec.Child("demotion"));
    FLUXON_RETURN_IF_ERROR(d.ReadSettings(&o->demotion));
    FLUXON_RETURN_IF_ERROR(d.Finish());
  }
  FLUXON_RETURN_IF_ERROR(sec.ReadSettings(o));
  FLUXON_RETURN_IF_ERROR(ParseTransports(sec, &o->transports));
  FLUXON_RETURN_IF_ERROR(sec.Finish());
  FLUXON_RETURN_IF_ERROR(CheckDemotion(sec, *o));
  return CheckOwnerCapacity(sec, *o, machine);
}

absl::Status ParseSecurity(Section& sec, SecurityConfig* out) {
  if (sec.Has("tls")) {
    FLUXON_ASSIGN_OR_RETURN(Section tls, sec.Child("tls"));
    TlsConfig t;
    FLUXON_RETURN_IF_ERROR(tls.ReadSettings(&t));
    for (const auto& [k, v] :
         {std::pair<const char*, const std::string*>{"cert_file", &t.cert_file},
          {"key_file", &t.key_file},
          {"ca_file", &t.ca_file}}) {
      if (v->empty()) {
        return tls.Bad(k, "is required (mutual TLS needs cert_file, key_file and ca_file)");
      }
    }
    FLUXON_RETURN_IF_ERROR(tls.Finish());
    out->tls = std::move(t);
  }
  FLUXON_RETURN_IF_ERROR(sec.ReadSettings(out));
  return sec.Finish();
}

// One `faults:` entry.
absl::StatusOr<FaultConfig> ParseFault(Section& f) {
  FaultConfig fc;
  FLUXON_RETURN_IF_ERROR(f.Str("point", &fc.point));
  FLUXON_RETURN_IF_ERROR(f.Str("action", &fc.action));
  if (fc.point.empty()) return f.Bad("point", "is required");
  for (const char ch : fc.point) {
    // Fault points are names such as master.PublishBatch or peer.read.
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' &&
        ch != '-') {
      return f.Bad("point", "may hold only letters, digits, '.', '_' and '-'");
    }
  }
  if (!ParseFaultAction(fc.action).ok()) {
    return f.Bad("action", "must be one of " + FaultActionList());
  }
  int64_t count = -1;
  FLUXON_RETURN_IF_ERROR(f.BoundedMs("delay_ms", 0, &fc.delay));
  FLUXON_RETURN_IF_ERROR(f.Int("count", &count));
  if (count == 0 || count < -1 || count > std::numeric_limits<int>::max()) {
    return f.Bad("count", "must be positive (at most 2^31-1) or -1 (until cleared)");
  }
  fc.count = static_cast<int>(count);
  FLUXON_RETURN_IF_ERROR(f.Finish());
  return fc;
}

absl::Status ParseFaults(Section& top, std::vector<FaultConfig>* out) {
  if (!top.Has("faults")) return absl::OkStatus();
  const YAML::Node list = top.Get("faults");
  if (!list.IsSequence()) return top.Bad("faults", "must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].IsMap()) return top.Bad("faults", "entries must be mappings");
    Section f(list[i], absl::StrFormat("faults[%d]", i));
    FLUXON_ASSIGN_OR_RETURN(FaultConfig fc, ParseFault(f));
    out->push_back(std::move(fc));
  }
  return absl::OkStatus();
}

absl::Status ParseReplicaPlacement(Section& sec, ReplicaPlacementConfig* p) {
  FLUXON_RETURN_IF_ERROR(sec.ReadSettings(p));
  if (sec.Has("remote_only_node_roles")) {
    const YAML::Node list = sec.Get("remote_only_node_roles");
    if (!list.IsSequence()) {
      return sec.Bad("remote_only_node_roles", "must be a list of roles, e.g. [remote_cache]");
    }
    p->remote_only_node_roles.clear();
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string role = list[i].IsScalar() ? list[i].Scalar() : "";
      if (role != "owner" && role != "remote_cache" && role != "embedded") {
        return sec.Bad(
            "remote_only_node_roles",
            "entries must be owner roles (owner, remote_cache, embedded), got '" + role + "'");
      }
      if (std::find(p->remote_only_node_roles.begin(), p->remote_only_node_roles.end(), role) !=
          p->remote_only_node_roles.end()) {
        return sec.Bad("remote_only_node_roles", "'" + role + "' is listed twice");
      }
      p->remote_only_node_roles.push_back(role);
    }
  }
  if (p->restrict_to_remote_only_node_roles && p->remote_only_node_roles.empty()) {
    return sec.Bad("restrict_to_remote_only_node_roles",
                   "needs a non-empty remote_only_node_roles (every replica would be NoSpace)");
  }
  return sec.Finish();
}

absl::Status ParseMaster(Section& sec, MasterConfig* m) {
  FLUXON_RETURN_IF_ERROR(sec.ReadSettings(m));
  if (sec.Has("replica_task_placement")) {
    FLUXON_ASSIGN_OR_RETURN(Section placement, sec.Child("replica_task_placement"));
    FLUXON_RETURN_IF_ERROR(ParseReplicaPlacement(placement, &m->replica_task_placement));
  }
  return sec.Finish();
}

// A role's optional section: refused for roles that do not run it, parsed with `parse` when
// present, default-constructed for roles that run it.
// With default_when_absent false, an absent section stays unset even for roles that may have it.
template <typename T, typename Parse>
absl::Status ParseRoleSection(Section& top, const char* name, bool role_has_it, const char* refusal,
                              std::optional<T>* out, Parse parse, bool default_when_absent = true) {
  if (top.Has(name) && !role_has_it) return top.Bad(name, refusal);
  if (!role_has_it) return absl::OkStatus();
  if (!top.Has(name) && !default_when_absent) return absl::OkStatus();
  *out = T{};
  if (!top.Has(name)) return absl::OkStatus();
  FLUXON_ASSIGN_OR_RETURN(Section sec, top.Child(name));
  return parse(sec, &**out);
}

// The rules that relate sections to each other.
absl::Status CheckAcrossSections(const Section& top, const Config& c) {
  const bool follower = c.role == Role::kOwner || c.role == Role::kRemoteCache;
  if (follower && c.owner->master_address.empty() && !c.election) {
    return top.Bad("owner.master_address",
                   "is required for role=" + std::string(RoleName(c.role)) +
                       " (or an election section naming the etcd the masters campaign in)");
  }
  if (follower && !c.owner->master_address.empty() && c.election) {
    return top.Bad("owner.master_address",
                   "and an election section are exclusive: with election the owner follows "
                   "whichever master leads");
  }
  if (c.role == Role::kMaster && c.election && c.election->advertise_address.empty()) {
    if (IsWildcardHost(HostOfAddress(c.master->listen_address))) {
      return top.Bad("election.advertise_address",
                     "is required when master.listen_address (" + c.master->listen_address +
                         ") is a wildcard: owners are told the address to dial");
    }
  }
  if (c.role == Role::kEmbedded && c.owner->demotion.enabled) {
    return top.Bad("owner.demotion.enabled",
                   "a demotion moves values to a remote_cache through a cluster master: needs "
                   "role=owner (owner.master_address or election) and owner.data_address");
  }
  // One process runs both: the master must not expire its own owner between two heartbeats.
  if (c.role == Role::kEmbedded && c.owner->heartbeat_interval >= c.master->owner_lease) {
    return top.Bad(
        "owner.heartbeat_interval_ms",
        absl::StrFormat("must be less than master.owner_lease_ms (%d ms), got %d ms",
                        c.master->owner_lease.count(), c.owner->heartbeat_interval.count()));
  }
  return absl::OkStatus();
}

absl::Status ParseElection(Section& sec, ElectionConfig* e) {
  FLUXON_RETURN_IF_ERROR(sec.ReadSettings(e));
  if (!sec.Has("endpoints")) return sec.Bad("endpoints", "is required (etcd members, host:port)");
  const YAML::Node list = sec.Get("endpoints");
  if (!list.IsSequence() || list.size() == 0) {
    return sec.Bad("endpoints", "must be a non-empty list of host:port, e.g. [127.0.0.1:2379]");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string endpoint = list[i].IsScalar() ? list[i].Scalar() : "";
    if (const std::string why = HostPortProblem(endpoint, /*allow_port_zero=*/false);
        !why.empty()) {
      return sec.Bad("endpoints", absl::StrFormat("entry '%s': %s", endpoint, why));
    }
    if (list.size() > 1 && !IsIpv4(HostOfAddress(endpoint))) {
      return sec.Bad("endpoints", absl::StrFormat("entry '%s': with several members each must be "
                                                  "an IPv4 address:port",
                                                  endpoint));
    }
    if (std::find(e->endpoints.begin(), e->endpoints.end(), endpoint) != e->endpoints.end()) {
      return sec.Bad("endpoints", "'" + endpoint + "' is listed twice");
    }
    e->endpoints.push_back(endpoint);
  }
  if (e->key.empty() || e->key[0] != '/') {
    return sec.Bad("key", "must be a path starting with '/', e.g. /fluxon/<cluster>/master/leader");
  }
  return sec.Finish();
}

absl::Status ParseSections(Section& top, Config* c, const MachineLimits& machine) {
  const std::string role = RoleName(c->role);
  FLUXON_RETURN_IF_ERROR(ParseRoleSection(
      top, "election",
      c->role == Role::kMaster || c->role == Role::kOwner || c->role == Role::kRemoteCache,
      ("is for roles master, owner and remote_cache (standby masters), not role=" + role).c_str(),
      &c->election, ParseElection, /*default_when_absent=*/false));
  FLUXON_RETURN_IF_ERROR(
      ParseRoleSection(top, "owner", RoleHasOwner(c->role),
                       ("owner-only section is not allowed for role=" + role).c_str(), &c->owner,
                       [&](Section& sec, OwnerConfig* o) { return ParseOwner(sec, o, machine); }));
  FLUXON_RETURN_IF_ERROR(ParseRoleSection(
      top, "master", RoleHasMaster(c->role),
      ("master section is not allowed for role=" + role).c_str(), &c->master, ParseMaster));
  FLUXON_RETURN_IF_ERROR(CheckAcrossSections(top, *c));
  FLUXON_RETURN_IF_ERROR(ParseRoleSection(top, "client", c->role == Role::kClient,
                                          "client section is only allowed for role=client",
                                          &c->client, [](Section& sec, ClientConfig* cl) {
                                            FLUXON_RETURN_IF_ERROR(sec.ReadSettings(cl));
                                            return sec.Finish();
                                          }));
  if (top.Has("admin")) {
    FLUXON_ASSIGN_OR_RETURN(Section sec, top.Child("admin"));
    FLUXON_RETURN_IF_ERROR(sec.ReadSettings(&c->admin));
    FLUXON_RETURN_IF_ERROR(sec.Finish());
  }
  if (top.Has("security")) {
    if (c->role == Role::kClient) {
      return top.Bad("security", "is a node's setting; role=client talks over the Unix socket");
    }
    FLUXON_ASSIGN_OR_RETURN(Section sec, top.Child("security"));
    FLUXON_RETURN_IF_ERROR(ParseSecurity(sec, &c->security));
  }
  return ParseFaults(top, &c->faults);
}

}  // namespace

MachineLimits ThisMachineLimits() {
  MachineLimits m;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "MemTotal:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    uint64_t kib = 0;
    if (absl::ConsumeSuffix(&rest, "kB") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) {
      m.physical_memory_bytes = kib * kKiB;
    }
    break;
  }
  if (m.physical_memory_bytes == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0) {
      m.physical_memory_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
    }
  }
  return m;
}

absl::StatusOr<Config> ParseConfig(absl::string_view yaml_text) {
  return ParseConfig(yaml_text, ThisMachineLimits());
}

namespace {
// Offset of the first byte that is not part of a well-formed UTF-8 sequence (overlong forms,
// surrogates and code points past U+10FFFF included), or npos. YAML text is Unicode; yaml-cpp
// passes other bytes through on parsing but its emitter writes each as U+FFFD, so a value holding
// them (a socket path, say) would not survive DumpConfig -> ParseConfig.
size_t FirstInvalidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return i;
    }
    i += len;
  }
  return absl::string_view::npos;
}
}  // namespace

absl::StatusOr<Config> ParseConfig(absl::string_view yaml_text, const MachineLimits& machine) {
  if (const size_t bad = FirstInvalidUtf8(yaml_text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("config is not UTF-8 text: byte %d (0x%02x) starts no valid sequence", bad,
                        static_cast<unsigned char>(yaml_text[bad])));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("config is not valid YAML: %s", e.what()));
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) return absl::InvalidArgumentError("config must be a YAML mapping");
  FLUXON_RETURN_IF_ERROR(CheckNoDuplicateKeys(root, ""));
  Section top(root, "");
  Config c;
  std::string role = "embedded";
  FLUXON_RETURN_IF_ERROR(top.Str("role", &role));
  FLUXON_ASSIGN_OR_RETURN(c.role, ParseRole(role));
  FLUXON_RETURN_IF_ERROR(top.ReadSettings(&c));
  FLUXON_RETURN_IF_ERROR(ParseSections(top, &c, machine));
  FLUXON_RETURN_IF_ERROR(top.Finish());
  return c;
}

std::string HostOfAddress(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close != absl::string_view::npos) return std::string(address.substr(1, close - 1));
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || absl::StrContains(address.substr(0, colon), ':')) {
    return std::string(address);  // no port, or an unbracketed IPv6 literal
  }
  return std::string(address.substr(0, colon));
}

std::string JoinHostPort(absl::string_view host, int port) {
  return host.find(':') != absl::string_view::npos ? absl::StrFormat("[%s]:%d", host, port)
                                                   : absl::StrFormat("%s:%d", host, port);
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  in_addr a4;
  if (inet_pton(AF_INET, std::string(host).c_str(), &a4) == 1) {
    return (ntohl(a4.s_addr) >> 24) == 127;
  }
  in6_addr a6;
  if (inet_pton(AF_INET6, std::string(host).c_str(), &a6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&a6);
  }
  return false;
}

absl::Status CheckListenSecurity(const Config& c) {
  if (c.security.insecure) return absl::OkStatus();
  auto refuse = [](const std::string& key, const std::string& address, const char* missing,
                   const char* what) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s '%s' is reachable from other machines but %s is not set, so %s; configure it, "
        "listen on a loopback address, or set security.insecure: true to accept that",
        key, address, missing, what));
  };
  if (!c.security.tls) {
    if (c.master && !IsLoopbackHost(HostOfAddress(c.master->listen_address))) {
      return refuse("master.listen_address", c.master->listen_address, "security.tls",
                    "any peer could call the master unauthenticated");
    }
    if (!IsLoopbackHost(HostOfAddress(c.admin.listen_address))) {
      return refuse("admin.listen_address", c.admin.listen_address, "security.tls",
                    "any peer could call the admin service unauthenticated");
    }
  }
  if (c.security.cluster_secret_file.empty() && c.owner && !c.owner->data_address.empty() &&
      !IsLoopbackHost(HostOfAddress(c.owner->data_address))) {
    return refuse("owner.data_address", c.owner->data_address, "security.cluster_secret_file",
                  "any peer could read and write this owner's memory");
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read config file %s", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<Config> c = ParseConfig(ss.str());
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrFormat("%s: %s", path, c.status().message()));
  }
  return c;
}

namespace {

// One writer per setting kind: what DumpConfig emits for a field (ParseConfig reads it back).
// Settings whose empty value means "unset" are left out when empty.
void Emit(YAML::Emitter& out, const char* key, config_internal::Millis,
          std::chrono::milliseconds v) {
  out << YAML::Key << key << YAML::Value << v.count();
}
template <typename Kind, typename T>
void Emit(YAML::Emitter& out, const char* key, const Kind&, const T& v) {
  out << YAML::Key << key << YAML::Value << v;
}
// A string with a control character in it is written double-quoted, where each one is escaped:
// written plain, a carriage return reads back as a line break.
void EmitString(YAML::Emitter& out, const char* key, const std::string& v) {
  const bool control = std::any_of(v.begin(), v.end(), [](char ch) {
    const auto u = static_cast<unsigned char>(ch);
    return u < 0x20 || u == 0x7f;
  });
  out << YAML::Key << key << YAML::Value;
  if (control) out << YAML::DoubleQuoted;
  out << v;
}
template <typename Kind>
void Emit(YAML::Emitter& out, const char* key, const Kind&, const std::string& v) {
  EmitString(out, key, v);
}
void EmitUnlessEmpty(YAML::Emitter& out, const char* key, const std::string& v) {
  if (!v.empty()) EmitString(out, key, v);
}
void Emit(YAML::Emitter& out, const char* key, config_internal::NonEmptyText,
          const std::string& v) {
  EmitUnlessEmpty(out, key, v);
}
void Emit(YAML::Emitter& out, const char* key, config_internal::PeerAddress, const std::string& v) {
  EmitUnlessEmpty(out, key, v);
}
void Emit(YAML::Emitter& out, const char* key, config_internal::OptionalListen,
          const std::string& v) {
  EmitUnlessEmpty(out, key, v);
}

template <typename T>
void EmitSettings(YAML::Emitter& out, const T& obj) {
  config_internal::Settings<T>::Visit(obj, [&](const char* key, const auto& kind, const auto& field,
                                               const char*) { Emit(out, key, kind, field); });
}

// A section of scalar settings, plus `more` (its lists and subsections) before it closes.
template <typename T, typename More>
void EmitSection(YAML::Emitter& out, const char* name, const T& obj, More more) {
  out << YAML::Key << name << YAML::Value << YAML::BeginMap;
  more();
  EmitSettings(out, obj);
  out << YAML::EndMap;
}
template <typename T>
void EmitSection(YAML::Emitter& out, const char* name, const T& obj) {
  EmitSection(out, name, obj, [] {});
}

void EmitOwner(YAML::Emitter& out, const OwnerConfig& o) {
  EmitSection(out, "owner", o, [&] {
    EmitSection(out, "segment", o.segment);
    EmitSection(out, "local_reserve", o.local_reserve, [&] {
      if (!o.local_reserve.expected_capacity) return;
      const ExpectedCapacityConfig& e = *o.local_reserve.expected_capacity;
      EmitSection(out, "expected_capacity", e);
      out << YAML::Comment(absl::StrFormat("prewarms %d grants",
                                           ExpectedGrants(e.value_len, e.payload_capacity_bytes)));
    });
    EmitSection(out, "demotion", o.demotion);
    out << YAML::Key << "transports" << YAML::Value << YAML::Flow << o.transports;
  });
}

void EmitFaults(YAML::Emitter& out, const std::vector<FaultConfig>& faults) {
  if (faults.empty()) return;
  out << YAML::Key << "faults" << YAML::Value << YAML::BeginSeq;
  for (const FaultConfig& f : faults) {
    out << YAML::BeginMap;
    out << YAML::Key << "point" << YAML::Value << f.point;
    out << YAML::Key << "action" << YAML::Value << f.action;
    out << YAML::Key << "delay_ms" << YAML::Value << f.delay.count();
    out << YAML::Key << "count" << YAML::Value << f.count;
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

}  // namespace

std::string DumpConfig(const Config& c) {
  YAML::Emitter out;
  out.SetDoublePrecision(12);
  out << YAML::BeginMap;
  out << YAML::Key << "role" << YAML::Value << RoleName(c.role);
  EmitSettings(out, c);
  if (c.master) {
    EmitSection(out, "master", *c.master, [&] {
      const ReplicaPlacementConfig& p = c.master->replica_task_placement;
      EmitSection(out, "replica_task_placement", p, [&] {
        out << YAML::Key << "remote_only_node_roles" << YAML::Value << YAML::Flow
            << p.remote_only_node_roles;
      });
    });
  }
  if (c.owner) EmitOwner(out, *c.owner);
  if (c.client) EmitSection(out, "client", *c.client);
  if (c.election) {
    EmitSection(out, "election", *c.election, [&] {
      out << YAML::Key << "endpoints" << YAML::Value << YAML::Flow << c.election->endpoints;
    });
  }
  EmitSection(out, "admin", c.admin);
  if (c.role != Role::kClient) {
    EmitSection(out, "security", c.security, [&] {
      if (c.security.tls) EmitSection(out, "tls", *c.security.tls);
    });
  }
  EmitFaults(out, c.faults);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {

// How the reference describes a kind and a default.
std::string Describe(config_internal::Millis k) {
  return absl::StrFormat("milliseconds, %d .. %d", k.min_ms, kMaxSettingMs);
}
std::string Describe(config_internal::Bytes) { return "byte size > 0 (4GiB, 512MiB, 4096)"; }
std::string Describe(config_internal::BytesOrZero) { return "byte size (4GiB, 512MiB); 0: off"; }
std::string Describe(config_internal::Ratio) { return "number in (0, 1)"; }
std::string Describe(config_internal::Text) { return "text"; }
std::string Describe(config_internal::NonEmptyText) { return "path (non-empty when set)"; }
std::string Describe(config_internal::Flag) { return "true / false"; }
template <typename T>
std::string Describe(config_internal::IntIn<T> k) {
  return absl::StrFormat("integer, %d .. %d", k.lo, k.hi);
}
std::string Describe(config_internal::SocketPath) { return "Unix socket path (< 108 bytes)"; }
std::string Describe(config_internal::ListenAddress) { return "host:port (port 0: any)"; }
std::string Describe(config_internal::PeerAddress) { return "host:port, or unset"; }
std::string Describe(config_internal::OptionalListen) {
  return "host:port (port 0: any), or unset";
}
std::string Describe(config_internal::IpLiteral) { return "IP address"; }
std::string Describe(const config_internal::OneOf& k) {
  return "one of " + absl::StrJoin(k.words, ", ");
}

std::string DefaultText(std::chrono::milliseconds v) { return absl::StrFormat("%d", v.count()); }
std::string DefaultText(const std::string& v) {
  return v.empty() ? std::string("(unset)") : absl::StrCat("`", v, "`");
}
std::string DefaultText(bool v) { return v ? "true" : "false"; }
std::string DefaultText(double v) { return absl::StrFormat("%g", v); }
template <typename T>
std::string DefaultText(T v) {
  return absl::StrFormat("%d", v);
}

template <typename T>
void ReferenceRows(std::string* out, const std::string& prefix, const T& defaults) {
  config_internal::Settings<T>::Visit(
      defaults, [&](const char* key, const auto& kind, const auto& field, const char* doc) {
        absl::StrAppend(out, "| `", prefix, key, "` | ", Describe(kind), " | ", DefaultText(field),
                        " | ", doc, " |\n");
      });
}

}  // namespace

std::string SettingsReferenceMarkdown() {
  std::string out;
  const char* kHead = "| key | kind | default | what it does |\n|---|---|---|---|\n";
  auto section = [&](const char* title, const char* note) {
    absl::StrAppend(&out, "\n## ", title, "\n\n", note, note[0] ? "\n\n" : "", kHead);
  };
  section("Top level", "");
  absl::StrAppend(&out,
                  "| `role` | one of embedded, master, owner, remote_cache, client | embedded | "
                  "which parts this process runs |\n");
  ReferenceRows(&out, "", Config{});
  section("owner", "Roles embedded, owner and remote_cache.");
  ReferenceRows(&out, "owner.", OwnerConfig{});
  absl::StrAppend(&out,
                  "| `owner.transports` | list of transport names | [tcp] | the data plane's "
                  "transports; only tcp is served (rdma is refused) |\n");
  ReferenceRows(&out, "owner.segment.", SegmentConfig{});
  ReferenceRows(&out, "owner.local_reserve.", LocalReserveConfig{});
  ReferenceRows(&out, "owner.local_reserve.expected_capacity.", ExpectedCapacityConfig{});
  ReferenceRows(&out, "owner.demotion.", DemotionConfig{});
  section("master", "Roles embedded and master.");
  ReferenceRows(&out, "master.", MasterConfig{});
  ReferenceRows(&out, "master.replica_task_placement.", ReplicaPlacementConfig{});
  absl::StrAppend(&out,
                  "| `master.replica_task_placement.remote_only_node_roles` | list of owner roles "
                  "| [remote_cache] | roles of owners that hold only copies: preferred replica "
                  "targets, the only ones when restricted |\n");
  section("election",
          "Roles master, owner and remote_cache: standby masters elected through etcd "
          "(docs/ha.md). A master campaigns for the key; an owner follows its holder instead of "
          "owner.master_address.");
  absl::StrAppend(&out,
                  "| `election.endpoints` | list of host:port (IPv4 literals when several) | — "
                  "| required in the section: the etcd members |\n");
  ReferenceRows(&out, "election.", ElectionConfig{});
  section("client", "Role client (a config file a client library reads).");
  ReferenceRows(&out, "client.", ClientConfig{});
  section("admin", "Every role.");
  ReferenceRows(&out, "admin.", AdminConfig{});
  section("security", "Every role but client.");
  ReferenceRows(&out, "security.", SecurityConfig{});
  ReferenceRows(&out, "security.tls.", TlsConfig{});
  section("faults", "A list of fault-injection rules (tests and drills).");
  absl::StrAppend(&out,
                  "| `faults[].point` | text (letters, digits, `.`, `_`, `-`) | — | where: "
                  "master.<Method>, peer.read |\n"
                  "| `faults[].action` | one of delay, drop, duplicate, fail, refuse | — | what "
                  "happens there |\n"
                  "| `faults[].delay_ms` | milliseconds, 0 .. ",
                  kMaxSettingMs,
                  " | 0 | the delay of `delay` |\n"
                  "| `faults[].count` | integer > 0, or -1 | -1 | how many calls it applies to "
                  "(-1: until cleared) |\n");
  return out;
}

}  // namespace fluxon
