#include "fluxon/config.h"

#include <arpa/inet.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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
  absl::Status PositiveBytes(const std::string& k, uint64_t* out) {
    if (!Has(k)) return absl::OkStatus();
    const YAML::Node n = Get(k);
    if (!n.IsScalar()) return Bad(k, "must be a byte size");
    const std::string& s = n.Scalar();
    if (!s.empty() && s[0] == '-') return Bad(k, "must be > 0, got " + s);
    absl::StatusOr<uint64_t> v = ParseByteSize(s);
    if (!v.ok()) return Bad(k, std::string(v.status().message()));
    if (*v == 0) return Bad(k, "must be > 0");
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

absl::Status ParseOwner(Section& sec, OwnerConfig* o, const MachineLimits& machine) {
  if (sec.Has("segment")) {
    FLUXON_ASSIGN_OR_RETURN(Section seg, sec.Child("segment"));
    FLUXON_RETURN_IF_ERROR(seg.PositiveBytes("size", &o->segment.size_bytes));
    FLUXON_RETURN_IF_ERROR(seg.Bool("huge_pages", &o->segment.huge_pages));
    int64_t node = o->segment.numa_node;
    FLUXON_RETURN_IF_ERROR(seg.Int("numa_node", &node));
    if (node < -1 || node > 1023) return seg.Bad("numa_node", "must be -1 (none) or a node id");
    o->segment.numa_node = static_cast<int>(node);
    FLUXON_RETURN_IF_ERROR(seg.Str("path", &o->segment.path));
    FLUXON_RETURN_IF_ERROR(seg.Finish());
  }
  if (sec.Has("local_reserve")) {
    FLUXON_ASSIGN_OR_RETURN(Section lr, sec.Child("local_reserve"));
    LocalReserveConfig& l = o->local_reserve;
    if (lr.Has("expected_capacity")) {
      FLUXON_ASSIGN_OR_RETURN(Section ec, lr.Child("expected_capacity"));
      ExpectedCapacityConfig e;
      if (!ec.Has("value_len")) return ec.Bad("value_len", "is required");
      if (!ec.Has("payload_capacity_bytes")) return ec.Bad("payload_capacity_bytes", "is required");
      FLUXON_RETURN_IF_ERROR(ec.PositiveBytes("value_len", &e.value_len));
      FLUXON_RETURN_IF_ERROR(ec.PositiveBytes("payload_capacity_bytes", &e.payload_capacity_bytes));
      if (e.value_len > kMaxValueBytes) {
        return ec.Bad("value_len",
                      absl::StrFormat("%d bytes exceeds the 512 MiB slot limit", e.value_len));
      }
      FLUXON_RETURN_IF_ERROR(ec.Finish());
      l.expected_capacity = e;
    }
    FLUXON_RETURN_IF_ERROR(lr.PositiveMs("claim_soft_timeout_ms", &l.claim_soft_timeout));
    FLUXON_RETURN_IF_ERROR(lr.PositiveMs("claim_hard_timeout_ms", &l.claim_hard_timeout));
    FLUXON_RETURN_IF_ERROR(lr.PositiveMs("shrink_idle_ms", &l.shrink_idle));
    if (l.claim_hard_timeout <= l.claim_soft_timeout) {
      return lr.Bad("claim_hard_timeout_ms",
                    absl::StrFormat("must be greater than claim_soft_timeout_ms (%d), got %d",
                                    l.claim_soft_timeout.count(), l.claim_hard_timeout.count()));
    }
    FLUXON_RETURN_IF_ERROR(lr.Finish());
  }
  FLUXON_RETURN_IF_ERROR(sec.Ratio("hot_capacity_ratio", &o->hot_capacity_ratio));
  FLUXON_RETURN_IF_ERROR(sec.Str("socket_path", &o->socket_path));
  FLUXON_RETURN_IF_ERROR(sec.Str("socket_group", &o->socket_group));
  FLUXON_RETURN_IF_ERROR(sec.Str("master_address", &o->master_address));
  FLUXON_RETURN_IF_ERROR(
      sec.PositiveBytes("eviction_max_bytes_per_round", &o->eviction_max_bytes_per_round));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("eviction_interval_ms", &o->eviction_interval));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("handle_ttl_ms", &o->handle_ttl));
  FLUXON_RETURN_IF_ERROR(sec.Int("busy_poll_us", &o->busy_poll_us));
  if (o->busy_poll_us < 0 || o->busy_poll_us > 100'000) {
    return sec.Bad("busy_poll_us", "must be in [0, 100000]");
  }
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("put_lease_ms", &o->put_lease));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("view_lease_ms", &o->view_lease));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("commit_wait_timeout_ms", &o->commit_wait_timeout));
  FLUXON_RETURN_IF_ERROR(sec.Int("max_connections", &o->max_connections));
  if (o->max_connections < 1 || o->max_connections > 65'536) {
    return sec.Bad("max_connections",
                   absl::StrFormat("must be in [1, 65536], got %d", o->max_connections));
  }
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("hello_timeout_ms", &o->hello_timeout));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("frame_timeout_ms", &o->frame_timeout));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("heartbeat_interval_ms", &o->heartbeat_interval));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("register_timeout_ms", &o->register_timeout));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("remote_get_timeout_ms", &o->remote_get_timeout));
  FLUXON_RETURN_IF_ERROR(sec.Str("data_address", &o->data_address));
  if (!o->data_address.empty()) {
    FLUXON_RETURN_IF_ERROR(
        sec.CheckHostPort("data_address", o->data_address, /*allow_port_zero=*/true));
  }
  if (sec.Has("transports")) {
    const YAML::Node list = sec.Get("transports");
    if (!list.IsSequence() || list.size() == 0) {
      return sec.Bad("transports", "must be a non-empty list, e.g. [tcp]");
    }
    o->transports.clear();
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
      for (const std::string& t : o->transports) {
        if (t == name) return sec.Bad("transports", "'" + name + "' is listed twice");
      }
      o->transports.push_back(name);
    }
  }
  FLUXON_RETURN_IF_ERROR(sec.CheckSocketPath("socket_path", o->socket_path));
  if (!o->master_address.empty()) {
    FLUXON_RETURN_IF_ERROR(
        sec.CheckHostPort("master_address", o->master_address, /*allow_port_zero=*/false));
  }
  FLUXON_RETURN_IF_ERROR(sec.Finish());

  if (o->local_reserve.expected_capacity) {
    const auto& e = *o->local_reserve.expected_capacity;
    const uint64_t grants = ExpectedGrants(e.value_len, e.payload_capacity_bytes);
    const uint64_t positions = o->segment.size_bytes / kGrantBytes;
    if (grants > positions) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: prewarm needs %d grants (%d bytes) but owner.segment.size is %d bytes (%d grants)",
          sec.Key("local_reserve.expected_capacity"), grants, grants * kGrantBytes,
          o->segment.size_bytes, positions));
    }
  }
  if (o->segment.size_bytes < kGrantBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes is smaller than one 512 MiB grant", sec.Key("segment.size"),
                        o->segment.size_bytes));
  }
  // Host memory cannot back a segment larger than the machine: mapping or populating it fails at
  // start, or the OOM killer takes the owner once it fills.
  if (machine.physical_memory_bytes != 0 && o->segment.size_bytes > machine.physical_memory_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d bytes (%s) is larger than this machine's physical memory, %d bytes (%s)",
        sec.Key("segment.size"), o->segment.size_bytes, HumanGiB(o->segment.size_bytes),
        machine.physical_memory_bytes, HumanGiB(machine.physical_memory_bytes)));
  }
  return absl::OkStatus();
}

absl::Status ParseSecurity(Section& sec, SecurityConfig* out) {
  if (sec.Has("tls")) {
    FLUXON_ASSIGN_OR_RETURN(Section tls, sec.Child("tls"));
    TlsConfig t;
    FLUXON_RETURN_IF_ERROR(tls.Str("cert_file", &t.cert_file));
    FLUXON_RETURN_IF_ERROR(tls.Str("key_file", &t.key_file));
    FLUXON_RETURN_IF_ERROR(tls.Str("ca_file", &t.ca_file));
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
  FLUXON_RETURN_IF_ERROR(sec.Str("cluster_secret_file", &out->cluster_secret_file));
  if (sec.Has("cluster_secret_file") && out->cluster_secret_file.empty()) {
    return sec.Bad("cluster_secret_file", "must not be empty (omit it for no secret)");
  }
  FLUXON_RETURN_IF_ERROR(sec.Bool("insecure", &out->insecure));
  return sec.Finish();
}

absl::Status ParseMaster(Section& sec, MasterConfig* m) {
  FLUXON_RETURN_IF_ERROR(sec.Str("listen_address", &m->listen_address));
  FLUXON_RETURN_IF_ERROR(
      sec.CheckHostPort("listen_address", m->listen_address, /*allow_port_zero=*/true));
  FLUXON_RETURN_IF_ERROR(
      sec.Ratio("replica_cache_capacity_ratio", &m->replica_cache_capacity_ratio));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("inflight_ttl_ms", &m->inflight_ttl));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("owner_lease_ms", &m->owner_lease));
  FLUXON_RETURN_IF_ERROR(sec.PositiveMs("owner_grace_ms", &m->owner_grace));
  return sec.Finish();
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
  int64_t node_id = 0;
  FLUXON_RETURN_IF_ERROR(top.Int("node_id", &node_id));
  // node_id is part of every value identity (put_id's high 20 bits, owner/put_path.h).
  if (node_id < 0 || node_id >= (int64_t{1} << 20)) {
    return top.Bad("node_id", "must be in [0, 2^20) (1048576)");
  }
  c.node_id = static_cast<uint32_t>(node_id);
  FLUXON_RETURN_IF_ERROR(top.Str("log_level", &c.log_level));
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "off"};
  if (!kLevels.contains(c.log_level)) {
    return top.Bad("log_level", "must be one of trace, debug, info, warn, error, off");
  }

  if (top.Has("owner")) {
    if (!RoleHasOwner(c.role)) {
      return top.Bad("owner", absl::StrFormat("owner-only section is not allowed for role=%s",
                                              RoleName(c.role)));
    }
  }
  if (RoleHasOwner(c.role)) {
    c.owner = OwnerConfig{};
    if (top.Has("owner")) {
      FLUXON_ASSIGN_OR_RETURN(Section sec, top.Child("owner"));
      FLUXON_RETURN_IF_ERROR(ParseOwner(sec, &*c.owner, machine));
    }
    if ((c.role == Role::kOwner || c.role == Role::kRemoteCache) &&
        c.owner->master_address.empty()) {
      return top.Bad("owner.master_address",
                     "is required for role=" + std::string(RoleName(c.role)));
    }
  }
  if (top.Has("master")) {
    if (!RoleHasMaster(c.role)) {
      return top.Bad(
          "master", absl::StrFormat("master section is not allowed for role=%s", RoleName(c.role)));
    }
  }
  if (RoleHasMaster(c.role)) {
    c.master = MasterConfig{};
    if (top.Has("master")) {
      FLUXON_ASSIGN_OR_RETURN(Section sec, top.Child("master"));
      FLUXON_RETURN_IF_ERROR(ParseMaster(sec, &*c.master));
    }
  }
  // One process runs both: the master must not expire its own owner between two heartbeats.
  if (c.role == Role::kEmbedded && c.owner->heartbeat_interval >= c.master->owner_lease) {
    return top.Bad(
        "owner.heartbeat_interval_ms",
        absl::StrFormat("must be less than master.owner_lease_ms (%d ms), got %d ms",
                        c.master->owner_lease.count(), c.owner->heartbeat_interval.count()));
  }
  if (top.Has("client")) {
    if (c.role != Role::kClient) {
      return top.Bad("client", "client section is only allowed for role=client");
    }
    FLUXON_ASSIGN_OR_RETURN(Section sec, top.Child("client"));
    c.client = ClientConfig{};
    FLUXON_RETURN_IF_ERROR(sec.Str("socket_path", &c.client->socket_path));
    FLUXON_RETURN_IF_ERROR(sec.CheckSocketPath("socket_path", c.client->socket_path));
    FLUXON_RETURN_IF_ERROR(sec.PositiveMs("call_timeout_ms", &c.client->call_timeout));
    FLUXON_RETURN_IF_ERROR(sec.Finish());
  } else if (c.role == Role::kClient) {
    c.client = ClientConfig{};
  }
  if (top.Has("admin")) {
    FLUXON_ASSIGN_OR_RETURN(Section sec, top.Child("admin"));
    FLUXON_RETURN_IF_ERROR(sec.Str("listen_address", &c.admin.listen_address));
    FLUXON_RETURN_IF_ERROR(
        sec.CheckHostPort("listen_address", c.admin.listen_address, /*allow_port_zero=*/true));
    int64_t port = c.admin.metrics_port;
    FLUXON_RETURN_IF_ERROR(sec.Int("metrics_port", &port));
    if (port < 0 || port > 65535) return sec.Bad("metrics_port", "must be in [0, 65535]");
    c.admin.metrics_port = static_cast<int>(port);
    FLUXON_RETURN_IF_ERROR(sec.Str("metrics_address", &c.admin.metrics_address));
    if (c.admin.metrics_address.empty()) return sec.Bad("metrics_address", "must not be empty");
    // The metrics exposer (prometheus-cpp's civetweb) binds an IP literal: no port, no brackets,
    // no name lookup. An IPv6 literal passes here; a civetweb built without IPv6 (Debian 12's)
    // refuses it when the node starts, with that reason.
    if (!IsIpv4(c.admin.metrics_address) && !IsIpv6(c.admin.metrics_address)) {
      return sec.Bad("metrics_address",
                     absl::StrFormat("'%s' is not an IP address (IPv4 or unbracketed IPv6, no "
                                     "port; host names are not resolved)",
                                     c.admin.metrics_address));
    }
    FLUXON_RETURN_IF_ERROR(sec.Bool("allow_mutations", &c.admin.allow_mutations));
    FLUXON_RETURN_IF_ERROR(sec.Finish());
  }
  if (top.Has("security")) {
    if (c.role == Role::kClient) {
      return top.Bad("security", "is a node's setting; role=client talks over the Unix socket");
    }
    FLUXON_ASSIGN_OR_RETURN(Section sec, top.Child("security"));
    FLUXON_RETURN_IF_ERROR(ParseSecurity(sec, &c.security));
  }
  if (top.Has("faults")) {
    const YAML::Node list = top.Get("faults");
    if (!list.IsSequence()) return top.Bad("faults", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].IsMap()) return top.Bad("faults", "entries must be mappings");
      Section f(list[i], absl::StrFormat("faults[%d]", i));
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
      static const std::set<std::string> kActions = {"delay", "drop", "duplicate", "fail",
                                                     "refuse"};
      if (!kActions.contains(fc.action)) {
        return f.Bad("action", "must be one of delay, drop, duplicate, fail, refuse");
      }
      int64_t count = -1;
      FLUXON_RETURN_IF_ERROR(f.BoundedMs("delay_ms", 0, &fc.delay));
      FLUXON_RETURN_IF_ERROR(f.Int("count", &count));
      if (count == 0 || count < -1 || count > std::numeric_limits<int>::max()) {
        return f.Bad("count", "must be positive (at most 2^31-1) or -1 (until cleared)");
      }
      fc.count = static_cast<int>(count);
      FLUXON_RETURN_IF_ERROR(f.Finish());
      c.faults.push_back(fc);
    }
  }
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

std::string DumpConfig(const Config& c) {
  YAML::Emitter out;
  out.SetDoublePrecision(12);
  out << YAML::BeginMap;
  out << YAML::Key << "role" << YAML::Value << RoleName(c.role);
  out << YAML::Key << "node_id" << YAML::Value << c.node_id;
  out << YAML::Key << "log_level" << YAML::Value << c.log_level;
  if (c.master) {
    out << YAML::Key << "master" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "listen_address" << YAML::Value << c.master->listen_address;
    out << YAML::Key << "replica_cache_capacity_ratio" << YAML::Value
        << c.master->replica_cache_capacity_ratio;
    out << YAML::Key << "inflight_ttl_ms" << YAML::Value << c.master->inflight_ttl.count();
    out << YAML::Key << "owner_lease_ms" << YAML::Value << c.master->owner_lease.count();
    out << YAML::Key << "owner_grace_ms" << YAML::Value << c.master->owner_grace.count();
    out << YAML::EndMap;
  }
  if (c.owner) {
    const OwnerConfig& o = *c.owner;
    out << YAML::Key << "owner" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "segment" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "size" << YAML::Value << o.segment.size_bytes;
    out << YAML::Key << "huge_pages" << YAML::Value << o.segment.huge_pages;
    out << YAML::Key << "numa_node" << YAML::Value << o.segment.numa_node;
    out << YAML::Key << "path" << YAML::Value << o.segment.path;
    out << YAML::EndMap;
    out << YAML::Key << "local_reserve" << YAML::Value << YAML::BeginMap;
    if (o.local_reserve.expected_capacity) {
      const auto& e = *o.local_reserve.expected_capacity;
      out << YAML::Key << "expected_capacity" << YAML::Value << YAML::BeginMap;
      out << YAML::Key << "value_len" << YAML::Value << e.value_len;
      out << YAML::Key << "payload_capacity_bytes" << YAML::Value << e.payload_capacity_bytes;
      out << YAML::EndMap;
      out << YAML::Comment(absl::StrFormat("prewarms %d grants",
                                           ExpectedGrants(e.value_len, e.payload_capacity_bytes)));
    }
    out << YAML::Key << "claim_soft_timeout_ms" << YAML::Value
        << o.local_reserve.claim_soft_timeout.count();
    out << YAML::Key << "claim_hard_timeout_ms" << YAML::Value
        << o.local_reserve.claim_hard_timeout.count();
    out << YAML::Key << "shrink_idle_ms" << YAML::Value << o.local_reserve.shrink_idle.count();
    out << YAML::EndMap;
    out << YAML::Key << "hot_capacity_ratio" << YAML::Value << o.hot_capacity_ratio;
    out << YAML::Key << "socket_path" << YAML::Value << o.socket_path;
    out << YAML::Key << "socket_group" << YAML::Value << o.socket_group;
    out << YAML::Key << "eviction_max_bytes_per_round" << YAML::Value
        << o.eviction_max_bytes_per_round;
    out << YAML::Key << "eviction_interval_ms" << YAML::Value << o.eviction_interval.count();
    out << YAML::Key << "handle_ttl_ms" << YAML::Value << o.handle_ttl.count();
    out << YAML::Key << "busy_poll_us" << YAML::Value << o.busy_poll_us;
    out << YAML::Key << "put_lease_ms" << YAML::Value << o.put_lease.count();
    out << YAML::Key << "view_lease_ms" << YAML::Value << o.view_lease.count();
    out << YAML::Key << "commit_wait_timeout_ms" << YAML::Value << o.commit_wait_timeout.count();
    out << YAML::Key << "max_connections" << YAML::Value << o.max_connections;
    out << YAML::Key << "hello_timeout_ms" << YAML::Value << o.hello_timeout.count();
    out << YAML::Key << "frame_timeout_ms" << YAML::Value << o.frame_timeout.count();
    out << YAML::Key << "heartbeat_interval_ms" << YAML::Value << o.heartbeat_interval.count();
    out << YAML::Key << "register_timeout_ms" << YAML::Value << o.register_timeout.count();
    out << YAML::Key << "remote_get_timeout_ms" << YAML::Value << o.remote_get_timeout.count();
    if (!o.data_address.empty()) {
      out << YAML::Key << "data_address" << YAML::Value << o.data_address;
    }
    out << YAML::Key << "transports" << YAML::Value << YAML::Flow << o.transports;
    if (!o.master_address.empty()) {
      out << YAML::Key << "master_address" << YAML::Value << o.master_address;
    }
    out << YAML::EndMap;
  }
  if (c.client) {
    out << YAML::Key << "client" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "socket_path" << YAML::Value << c.client->socket_path;
    out << YAML::Key << "call_timeout_ms" << YAML::Value << c.client->call_timeout.count();
    out << YAML::EndMap;
  }
  out << YAML::Key << "admin" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "listen_address" << YAML::Value << c.admin.listen_address;
  out << YAML::Key << "metrics_port" << YAML::Value << c.admin.metrics_port;
  out << YAML::Key << "metrics_address" << YAML::Value << c.admin.metrics_address;
  out << YAML::Key << "allow_mutations" << YAML::Value << c.admin.allow_mutations;
  out << YAML::EndMap;
  if (c.role != Role::kClient) {
    out << YAML::Key << "security" << YAML::Value << YAML::BeginMap;
    if (c.security.tls) {
      out << YAML::Key << "tls" << YAML::Value << YAML::BeginMap;
      out << YAML::Key << "cert_file" << YAML::Value << c.security.tls->cert_file;
      out << YAML::Key << "key_file" << YAML::Value << c.security.tls->key_file;
      out << YAML::Key << "ca_file" << YAML::Value << c.security.tls->ca_file;
      out << YAML::EndMap;
    }
    if (!c.security.cluster_secret_file.empty()) {
      out << YAML::Key << "cluster_secret_file" << YAML::Value << c.security.cluster_secret_file;
    }
    out << YAML::Key << "insecure" << YAML::Value << c.security.insecure;
    out << YAML::EndMap;
  }
  if (!c.faults.empty()) {
    out << YAML::Key << "faults" << YAML::Value << YAML::BeginSeq;
    for (const FaultConfig& f : c.faults) {
      out << YAML::BeginMap;
      out << YAML::Key << "point" << YAML::Value << f.point;
      out << YAML::Key << "action" << YAML::Value << f.action;
      out << YAML::Key << "delay_ms" << YAML::Value << f.delay.count();
      out << YAML::Key << "count" << YAML::Value << f.count;
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace fluxon
