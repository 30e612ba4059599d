// The Prometheus metrics of one fluxond (every name starts with "fluxon_"; see
// docs/operations.md for the list).
//
// Invariants:
// - Rendering reads counters and gauges as they are at that moment (each value is read once;
//   values of different families are not a single atomic snapshot) and changes nothing.
// - Owner families appear only when the node has an owner, master families only when it has a
//   master, latency histograms only when it serves local clients; a family that appears always
//   has every one of its label values (all slot states, all seven request types).
#pragma once

#include <string>

namespace fluxon {

class FluxonNode;

// The node's metrics in the Prometheus text exposition format 0.0.4.
std::string RenderNodeMetrics(FluxonNode& node);

}  // namespace fluxon
