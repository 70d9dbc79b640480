// A breakable CUDA graph (BOUNDARIES.md section 3): ops recorded into graph segments, eager ops
// between them that end the segment, run for real, and are called again at replay. Host-only
// header: the stream type is CUDA's opaque handle, declared here without the CUDA headers.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

struct CUstream_st;
struct CUevent_st;

namespace dsv32::gpu {

using Stream = CUstream_st*;  // cudaStream_t

/// Misuse of the capture machinery (nested capture, replay before capture, unknown side
/// stream); the message says what was asked and why it is refused.
struct GraphError : std::logic_error {
  using std::logic_error::logic_error;
};

/// Segment structure of one capture: graph segments and eager breaks, in order ("G E G").
struct CaptureInfo {
  int graphs = 0;
  int eager_breaks = 0;
  std::string structure;
};

/// One capture of a sequence of ops on a stream, replayable any number of times.
///
/// Capture runs on `stream` with thread-local capture mode. `graph` ops are recorded into the open
/// segment (one is begun when none is open); an `eager` op ends the open segment, runs once for
/// real and is recorded as a callable; consecutive eager ops form one eager segment. Work forked
/// onto a side stream is joined back into `stream` before a segment ends, so an eager op sees
/// everything recorded before it. Replay launches the segments in order on `stream`.
///
/// If an op throws during capture, the open capture is ended, everything recorded is dropped,
/// the side streams are joined back, and the exception propagates: the object is then empty and
/// can capture again.
class BreakableGraph {
 public:
  using Op = std::function<void()>;

  /// `stream` is not owned; `side_streams` non-blocking side streams are created and owned.
  explicit BreakableGraph(Stream stream, int side_streams = 0);
  /// Side streams the caller owns (and keeps alive while this object lives), for a caller that
  /// enqueues the same work on them outside captures too.
  BreakableGraph(Stream stream, std::vector<Stream> borrowed_sides);
  ~BreakableGraph();
  BreakableGraph(const BreakableGraph&) = delete;
  BreakableGraph& operator=(const BreakableGraph&) = delete;

  Stream stream() const { return stream_; }
  /// Side stream i, for work that overlaps the main stream between fork(i) and join(i).
  Stream side(int i) const;

  /// Starts a capture; throws GraphError when this object or anyone else is capturing `stream`
  /// (nested capture), and drops an earlier capture of this object.
  void begin();
  /// Records `op` (which launches on stream() or a forked side stream) into the open segment.
  void graph(const std::string& label, const Op& op);
  /// Ends the open segment, runs `op` now and records it for replay.
  void eager(const std::string& label, Op op);
  /// Side stream i waits for the work enqueued on stream() so far.
  void fork(int i);
  /// stream() waits for the work enqueued on side stream i so far.
  void join(int i);
  /// Ends the capture (closing the open segment) and returns its structure.
  CaptureInfo end();

  bool capturing() const { return capturing_; }
  bool captured() const { return captured_; }
  const CaptureInfo& info() const { return info_; }
  /// Labels of the segments in order: a graph segment lists its ops joined by ','.
  std::vector<std::string> segment_labels() const;

  /// Runs the segments in order on stream(); throws GraphError before a completed capture.
  /// `before_launch`, when given, runs on the host before each graph segment's launch (a
  /// framework's cost per graph launch, modelled by `dsv32 bench-gpu --graph-launch-us`).
  void replay(const Op& before_launch = {});

 private:
  struct Segment;
  void open_segment();
  void close_segment();
  void join_all();
  void abort() noexcept;
  void make_events();
  template <class F>
  void guarded(F&& f);

  Stream stream_;
  std::vector<Stream> sides_;
  bool own_sides_ = true;
  std::vector<bool> forked_;
  std::vector<CUevent_st*> fork_events_, join_events_;  // cudaEvent_t, one per side stream
  std::vector<Segment> segments_;
  CaptureInfo info_;
  std::string pending_label_;  // ops of the open graph segment
  bool capturing_ = false, open_ = false, captured_ = false;
};

}  // namespace dsv32::gpu
