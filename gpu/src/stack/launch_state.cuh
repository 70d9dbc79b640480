// Where an op runs, as one value handed to every op (ops.cu, attention.cu): eagerly, recorded
// into a graph segment, or as a captured plan's eager op; device-driven or not; whether a
// capture is recording; the graph whose fork and join the indexer's stream takes. Whoever runs
// ops makes it (run_layers, the capture, time_ops) and no op changes it, except for the one
// piece of state a layer's ops hand on: whether indexer_wq_b was launched at the fork.
#pragma once

#include "dsv32/gpu/graph.hpp"

namespace dsv32::gpu::stack {

struct LaunchState {
  enum class Where {
    eager,          // a step or an op run directly (no capture)
    graph,          // recorded into a graph segment (a plan's capture, time_ops's graph)
    eager_segment,  // a captured plan's eager op: at its capture (empty metadata) and replays
  };
  Where where = Where::eager;
  /// The H ops run their device-driven variants (a full graph's plan; docs/GPU.md).
  bool device_driven = false;
  /// A plan's capture is recording now (its eager ops run once on empty metadata).
  bool capturing = false;
  /// The recording whose fork and join the indexer's stream takes (nullptr: the streams' own).
  BreakableGraph* graph = nullptr;
  /// This layer's indexer_wq_b may be launched at the fork (StackImpl::wq_b_may_lead).
  bool lead = false;
  /// The layer whose indexer_wq_b was launched at the fork (-1: none): the op then launches
  /// nothing. Written by norm_rope_cache, read and cleared by indexer_wq_b.
  int wq_b_led = -1;

  bool in_graph() const { return where == Where::graph; }
  bool in_eager_segment() const { return where == Where::eager_segment; }
  /// A framework's host cost applies (StackLab::set_host_costs): an op run for real, not recorded.
  bool charged() const { return !capturing && graph == nullptr; }
};

}  // namespace dsv32::gpu::stack
