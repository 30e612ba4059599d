// The owners' peer service as a client: PeerApi over gRPC (rpc/peer_api.h), one channel per peer
// address with the node's credentials (mutual TLS when security.tls is set, so only a member
// certificate reaches a peer; with node-bound certificates the target checks the requester's
// node against the caller's certificate).
//
// Invariants: every call has a deadline; Cancel() ends every call in progress and refuses new
// ones; channels are cached per address and bounded (kMaxChannels, the least recent dropped).
#pragma once

#include <memory>

#include "rpc/peer_api.h"
#include "rpc_grpc/grpc_security.h"

namespace fluxon {

std::unique_ptr<PeerApi> MakeGrpcPeerClient(const GrpcSecurity& security);

}  // namespace fluxon
