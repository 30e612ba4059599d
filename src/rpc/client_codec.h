// The client protocol's put options on the wire: one conversion each way, shared by the client
// (kv_client.cc) and the owner (client_server.cc), so a put option is spelled once per side.
#pragma once

#include <string>
#include <vector>

#include "fluxon/put_options.h"
#include "fluxon/v1/client.pb.h"

namespace fluxon {

// Fills `out` with the batch (keys, value_len, options).
void EncodePutStart(const std::vector<std::string>& keys, int64_t value_len,
                    const PutOptions& options, v1::PutStartRequest* out);
// The request's options; its keys are moved into `keys` (the request is the caller's to spend).
PutOptions DecodePutStart(v1::PutStartRequest* request, std::vector<std::string>* keys,
                          int64_t* value_len);

}  // namespace fluxon
