#include "ha/leader_record.h"

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fluxon {

std::string LeaderAdminKey(const std::string& key) { return absl::StrCat(key, "/admin"); }

absl::StatusOr<LeaderRecord> ReadLeaderRecord(EtcdClient& etcd, const std::string& key) {
  absl::StatusOr<std::vector<std::optional<EtcdKeyValue>>> kvs =
      etcd.GetAtOneRevision({key, LeaderAdminKey(key)});
  if (!kvs.ok()) return kvs.status();
  const std::optional<EtcdKeyValue>& leader = (*kvs)[0];
  const std::optional<EtcdKeyValue>& admin = (*kvs)[1];
  if (!leader) {
    return absl::NotFoundError(absl::StrCat("no master leads now (the key ", key, " is empty)"));
  }
  // One transaction wrote both: the same create_revision, else the admin key is another
  // leadership's (it cannot be, both go with one lease) or missing.
  if (!admin || admin->create_revision != leader->create_revision) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the leader %s (epoch %d) publishes no admin address at %s (a master that predates it)",
        leader->value, leader->create_revision, LeaderAdminKey(key)));
  }
  return LeaderRecord{leader->value, admin->value, leader->create_revision};
}

}  // namespace fluxon
