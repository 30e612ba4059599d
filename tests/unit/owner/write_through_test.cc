// WriteThroughPut and its tracker (src/owner/write_through.h): a write-through put completes once,
// after its publish outcome and every group's end, in any order; a failed copy fails it with a
// clear error; the parent rule (a child is never reported backed while its parent is not).
#include "owner/write_through.h"

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

class WriteThroughTest : public OwnerPartsTest {
 protected:
  void SetUp() override {
    OwnerPartsTest::SetUp();
    o_ = &Make();
    tracker_ = std::make_unique<WriteThroughTracker>(o_->registration.get(), &master());
  }
  // A callback that records every completion.
  WriteThroughDone Record(std::vector<absl::Status>* out) {
    return [out](const absl::Status& s) { out->push_back(s); };
  }
  OwnerParts* o_ = nullptr;
  std::unique_ptr<WriteThroughTracker> tracker_;
};

TEST_F(WriteThroughTest, CompletesOnceAfterThePublishAndEveryGroupInAnyOrder) {
  std::vector<absl::Status> done;
  auto put = tracker_->Start({"a", "b", "c"}, "");
  put->Published(absl::OkStatus(), Record(&done));
  EXPECT_EQ(tracker_->in_flight(), 1u);
  put->GroupEnded(ReplicaGroupEnd::kCopied, 2);  // before the publisher said how many
  EXPECT_TRUE(done.empty());
  put->Queued(2);
  EXPECT_TRUE(done.empty());
  put->GroupEnded(ReplicaGroupEnd::kCopied, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok()) << done[0];
  EXPECT_EQ(tracker_->in_flight(), 0u);

  // Nothing queued (the publish failed first): the publish outcome is the put's.
  std::vector<absl::Status> failed;
  auto refused = tracker_->Start({"d"}, "");
  refused->Published(absl::AlreadyExistsError("published by another writer"), Record(&failed));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(WriteThroughTest, AFailedCopyFailsThePutWithAClearError) {
  for (const auto& [end, code] : std::vector<std::pair<ReplicaGroupEnd, absl::StatusCode>>{
           {ReplicaGroupEnd::kNoSpace, absl::StatusCode::kResourceExhausted},
           {ReplicaGroupEnd::kGone, absl::StatusCode::kAborted},
           {ReplicaGroupEnd::kFailed, absl::StatusCode::kUnavailable}}) {
    std::vector<absl::Status> done;
    auto put = tracker_->Start({"x", "y"}, "");
    put->Queued(2);
    put->GroupEnded(ReplicaGroupEnd::kCopied, 1);
    put->GroupEnded(end, 1);
    put->Published(absl::OkStatus(), Record(&done));
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].code(), code) << done[0];
    EXPECT_NE(done[0].message().find("write_through"), std::string::npos) << done[0];
  }
  EXPECT_EQ(tracker_->in_flight(), 0u);
}

// A member dropped before its copy was asked for (no longer held) ends no group: the put still
// fails, since not every value was copied.
TEST_F(WriteThroughTest, AValueNeverCopiedFailsThePut) {
  std::vector<absl::Status> done;
  auto put = tracker_->Start({"kept", "dropped"}, "");
  put->Queued(1);
  put->GroupEnded(ReplicaGroupEnd::kCopied, 1);
  put->Published(absl::OkStatus(), Record(&done));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].code(), absl::StatusCode::kAborted) << done[0];
}

TEST_F(WriteThroughTest, AChildFollowsItsParentStillInFlight) {
  std::vector<absl::Status> parent_done, child_done;
  auto parent = tracker_->Start({"p0", "p1"}, "");
  parent->Queued(1);
  parent->Published(absl::OkStatus(), Record(&parent_done));
  auto child = tracker_->Start({"c0"}, "p1");
  child->Queued(1);
  child->Published(absl::OkStatus(), Record(&child_done));
  child->GroupEnded(ReplicaGroupEnd::kCopied, 1);  // copied first: waits for the parent
  EXPECT_TRUE(child_done.empty());
  parent->GroupEnded(ReplicaGroupEnd::kCopied, 2);
  ASSERT_EQ(parent_done.size(), 1u);
  ASSERT_EQ(child_done.size(), 1u);
  EXPECT_TRUE(child_done[0].ok()) << child_done[0];

  // A parent whose copy failed: the child is not reported backed.
  std::vector<absl::Status> p2, c2;
  auto bad_parent = tracker_->Start({"q0"}, "");
  bad_parent->Queued(1);
  bad_parent->Published(absl::OkStatus(), Record(&p2));
  auto orphan = tracker_->Start({"r0"}, "q0");
  orphan->Queued(1);
  orphan->Published(absl::OkStatus(), Record(&c2));
  orphan->GroupEnded(ReplicaGroupEnd::kCopied, 1);
  bad_parent->GroupEnded(ReplicaGroupEnd::kNoSpace, 1);
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_EQ(c2[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c2[0].message().find("parent_key 'q0'"), std::string::npos) << c2[0];
  EXPECT_EQ(tracker_->in_flight(), 0u);
}

TEST_F(WriteThroughTest, AParentNotInFlightMustBeRoutedOnAnotherNode) {
  // "local": routed on this owner only; "remote": routed on node 9 too.
  ASSERT_TRUE(PutAndPublish(*o_, {"local", "remote"}).ok());
  ASSERT_TRUE(RegisterPeer(master(), 9, 90).ok());
  auto route = RouteOf(master(), "remote");
  ASSERT_TRUE(route.has_value());
  v1::PublishBatchRequest copy;
  copy.set_node_id(9);
  copy.set_generation(90);
  copy.set_put_id(route->put_id());
  copy.set_republish(true);
  v1::RouteItem* item = copy.add_items();
  item->set_key("remote");
  item->set_put_id(route->put_id());
  item->set_version(route->version());
  item->set_offset(4096);
  item->set_len(route->len());
  item->set_copy(true);
  ASSERT_TRUE(master().PublishBatch(copy).ok());
  ASSERT_EQ(RouteOf(master(), "remote")->locations_size(), 2);

  for (const auto& [parent, ok] : std::vector<std::pair<std::string, bool>>{
           {"remote", true}, {"local", false}, {"absent", false}}) {
    std::vector<absl::Status> done;
    auto put = tracker_->Start({"child-of-" + parent}, parent);
    put->Queued(1);
    put->GroupEnded(ReplicaGroupEnd::kCopied, 1);
    put->Published(absl::OkStatus(), Record(&done));
    ASSERT_EQ(done.size(), 1u) << parent;
    EXPECT_EQ(done[0].ok(), ok) << parent << ": " << done[0];
  }
}

// A parent routed on another node backs nothing once that node's owner is no longer live (its
// location stays routed until its lease and grace pass): the child's put fails.
class WriteThroughLeaseTest : public WriteThroughTest {
 protected:
  void SetUp() override {
    OwnerPartsTest::SetUp();
    MasterOptions options;
    options.owner_lease = milliseconds(300);
    options.owner_grace = milliseconds(60'000);
    UseMaster(options);
    PartsOptions o;
    o.heartbeat_interval = milliseconds(50);  // this owner stays live
    o_ = &Make(o);
    tracker_ = std::make_unique<WriteThroughTracker>(o_->registration.get(), &master());
  }
};

TEST_F(WriteThroughLeaseTest, AParentOnlyOnAnOwnerPastItsLeaseIsNotBacked) {
  ASSERT_TRUE(RegisterPeer(master(), 9, 90).ok());
  ASSERT_TRUE(PublishOne(master(), 9, 90, 5, "parent").ok());
  auto child_of_parent = [&] {
    std::vector<absl::Status> done;
    auto put = tracker_->Start({"child"}, "parent");
    put->Queued(1);
    put->GroupEnded(ReplicaGroupEnd::kCopied, 1);
    put->Published(absl::OkStatus(), Record(&done));
    EXPECT_EQ(done.size(), 1u);
    return done.empty() ? absl::UnknownError("no outcome") : done[0];
  };
  EXPECT_TRUE(child_of_parent().ok());
  std::this_thread::sleep_for(milliseconds(400));        // node 9 is silent past its lease
  ASSERT_TRUE(RouteOf(master(), "parent").has_value());  // still routed (grace)
  const absl::Status late = child_of_parent();
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_NE(late.message().find("parent_key 'parent'"), std::string::npos) << late;
}

}  // namespace
}  // namespace fluxon::testing
