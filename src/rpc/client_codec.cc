#include "rpc/client_codec.h"

namespace fluxon {

void EncodePutStart(const std::vector<std::string>& keys, int64_t value_len, const PutOptions& o,
                    v1::PutStartRequest* p) {
  for (const std::string& k : keys) p->add_keys(k);
  p->set_value_len(static_cast<uint64_t>(value_len));
  p->set_reject_if_inflight_same_key(o.reject_if_inflight_same_key);
  p->set_reject_if_exist_same_key(o.reject_if_exist_same_key);
  p->set_write_through(o.write_through);
  p->set_make_replica_task(o.make_replica_task);
  for (bool b : o.make_replica_task_mask) p->add_make_replica_task_mask(b);
  for (uint32_t g : o.atomic_group_lens) p->add_atomic_group_lens(g);
  p->set_lease_id(o.lease_id);
  p->set_parent_key(o.parent_key);
}

PutOptions DecodePutStart(v1::PutStartRequest* p, std::vector<std::string>* keys,
                          int64_t* value_len) {
  // One allocation per key, not two: the request's strings move into the put.
  keys->reserve(p->keys_size());
  for (std::string& k : *p->mutable_keys()) keys->push_back(std::move(k));
  *value_len = static_cast<int64_t>(p->value_len());
  PutOptions o;
  o.reject_if_inflight_same_key = p->reject_if_inflight_same_key();
  o.reject_if_exist_same_key = p->reject_if_exist_same_key();
  o.write_through = p->write_through();
  o.make_replica_task = p->make_replica_task();
  o.make_replica_task_mask.assign(p->make_replica_task_mask().begin(),
                                  p->make_replica_task_mask().end());
  o.atomic_group_lens.assign(p->atomic_group_lens().begin(), p->atomic_group_lens().end());
  o.lease_id = std::move(*p->mutable_lease_id());
  o.parent_key = std::move(*p->mutable_parent_key());
  return o;
}

void EncodeGetStart(const std::vector<std::string>& keys, bool prefix_best_effort,
                    const std::vector<uint32_t>& group_lens, bool allow_deferred,
                    v1::GetStartRequest* out) {
  for (const std::string& k : keys) out->add_keys(k);
  out->set_prefix_best_effort(prefix_best_effort);
  out->set_allow_deferred(allow_deferred);
  for (uint32_t n : group_lens) out->add_atomic_group_lens(n);
}

bool DecodeGetStart(v1::GetStartRequest* request, std::vector<std::string>* keys,
                    std::vector<uint32_t>* group_lens) {
  keys->reserve(request->keys_size());
  for (std::string& k : *request->mutable_keys()) keys->push_back(std::move(k));
  group_lens->assign(request->atomic_group_lens().begin(), request->atomic_group_lens().end());
  return request->prefix_best_effort();
}

void EncodeGetStartReply(const GetStartOutcome& r, v1::GetStartReply* out) {
  out->set_handle_id(r.handle_id);
  out->set_raw_prefix_hit_len(r.prefix.raw_prefix_hit_len);
  out->set_transferable_len(r.prefix.transferable_len);
  out->set_prefix_hit_groups(r.prefix.prefix_hit_groups);
  // -1 on the wire: no miss.
  out->set_first_miss_index(r.prefix.first_miss_index ? *r.prefix.first_miss_index : -1);
  out->set_first_miss_group_index(r.prefix.first_miss_group_index ? *r.prefix.first_miss_group_index
                                                                  : -1);
  for (uint64_t o : r.offsets) out->add_offsets(o);
  for (uint64_t l : r.lens) out->add_lens(l);
  out->set_local_pinned(r.local_pinned);
  out->set_inflight_joined(r.inflight_joined);
  out->set_leader_started(r.leader_started);
  out->set_deferred(r.deferred);
}

GetStartResult DecodeGetStartResult(const v1::GetStartReply& r, size_t num_keys) {
  GetStartResult res;
  res.raw_prefix_hit_len = r.raw_prefix_hit_len();
  res.transferable_len = r.transferable_len();
  res.prefix_hit_groups = r.prefix_hit_groups();
  if (r.first_miss_index() >= 0) res.first_miss_index = r.first_miss_index();
  if (r.first_miss_group_index() >= 0) res.first_miss_group_index = r.first_miss_group_index();
  res.all_hit = res.transferable_len == num_keys;
  res.local_pinned = r.local_pinned();
  res.inflight_joined = r.inflight_joined();
  res.leader_started = r.leader_started();
  res.deferred = r.deferred();
  res.transferred = r.transferred();
  return res;
}

}  // namespace fluxon
