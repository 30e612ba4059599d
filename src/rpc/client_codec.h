// The client protocol's requests and replies on the wire: one conversion each way, shared by the
// client (kv_client.cc) and the owner (client_server.cc), so a field is spelled once per side.
#pragma once

#include <string>
#include <vector>

#include "common/batch.h"
#include "fluxon/client.h"
#include "fluxon/put_options.h"
#include "fluxon/v1/client.pb.h"

namespace fluxon {

// Fills `out` with the batch (keys, value_len, options).
void EncodePutStart(const std::vector<std::string>& keys, int64_t value_len,
                    const PutOptions& options, v1::PutStartRequest* out);
// The request's options; its keys are moved into `keys` (the request is the caller's to spend).
PutOptions DecodePutStart(v1::PutStartRequest* request, std::vector<std::string>* keys,
                          int64_t* value_len);

void EncodeGetStart(const std::vector<std::string>& keys, bool prefix_best_effort,
                    const std::vector<uint32_t>& group_lens, bool allow_deferred,
                    v1::GetStartRequest* out);
// Moves the request's keys into `keys`; returns prefix_best_effort.
bool DecodeGetStart(v1::GetStartRequest* request, std::vector<std::string>* keys,
                    std::vector<uint32_t>* group_lens);

void EncodeGetStartReply(const GetStartOutcome& outcome, v1::GetStartReply* out);
// The caller-facing result of a reply for a batch of `num_keys` (offsets and lens stay in the
// reply: the client checks them against its segment).
GetStartResult DecodeGetStartResult(const v1::GetStartReply& reply, size_t num_keys);

}  // namespace fluxon
