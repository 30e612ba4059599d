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

}  // namespace fluxon
