// Ranks emulated on one GPU (docs/GPU.md, "Ranks on one GPU"): each rank is its own stack, with
// its own caches, streams and host thread, on the same device; their collective is a staging
// buffer and flags in device memory (kernels/exchange.cuh), capturable as NCCL's is. What the
// ranks compute and exchange is what they would over NCCL; only the transport differs.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dsv32/gpu/stack.hpp"

namespace dsv32::gpu {

class LocalExchange {
 public:
  /// `ranks` ranks on the current device, exchanging at most `capacity` bytes each at a time;
  /// a wait that lasts `timeout_s` seconds fails the group instead of hanging it.
  LocalExchange(int ranks, std::size_t capacity, double timeout_s = 60.0);
  ~LocalExchange();
  LocalExchange(const LocalExchange&) = delete;
  LocalExchange& operator=(const LocalExchange&) = delete;

  /// Rank r's end of the all-gather (RankGather), valid while this object lives.
  RankGather* gather(int rank);
  /// While a rank rehearses (its captures' warm-ups and the eager ops a capture runs on empty
  /// metadata), its gathers executed outside a capture wait for no one: each copies the rank's
  /// own rows into every slot. A capture records the real exchange either way. Captures then
  /// never wait on the device for a rank whose host thread is building a graph (an allocation
  /// or an instantiation may wait for the whole device: that would deadlock).
  void set_rehearsal(int rank, bool on);
  /// set_rehearsal(rank, true) for the guard's scope.
  struct Rehearsal {
    Rehearsal(LocalExchange& x, int rank) : x_(x), rank_(rank) { x_.set_rehearsal(rank_, true); }
    ~Rehearsal() { x_.set_rehearsal(rank_, false); }
    Rehearsal(const Rehearsal&) = delete;
    Rehearsal& operator=(const Rehearsal&) = delete;

   private:
    LocalExchange& x_;
    int rank_;
  };
  /// Releases every rank waiting on the device (a rank failed before it reached an exchange);
  /// the group is unusable afterwards.
  void abort();
  /// "" while every exchange has completed; else why not. Read when the ranks' streams are
  /// idle (after a step).
  std::string failure() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace dsv32::gpu
