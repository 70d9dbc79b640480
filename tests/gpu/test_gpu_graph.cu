// The breakable-graph runtime on its own (BOUNDARIES.md section 3), with toy kernels whose
// results depend on the order ops ran in: segment structure, capture runs no graph op, replay
// sees new inputs and host metadata, eager segments replay in order, nested capture is
// rejected, an op that throws leaves nothing behind, and an eager break inside a two-stream
// overlap joins the side stream first.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "dsv32/gpu/graph.hpp"
#include "support/gpu.hpp"

namespace dsv32 {
namespace {

using gpu::BreakableGraph;
using gpu::GraphError;

void ok(cudaError_t e) {
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}

/// x[i] = x[i] * a + b (unsigned wrap-around: order-sensitive, never overflows into UB).
__global__ void affine(unsigned* x, int n, unsigned a, unsigned b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a + b;
}

/// Spins for `cycles`, then dst[i] = src[i]: a slow writer that loses any race it is in.
__global__ void slow_copy(unsigned* dst, const unsigned* src, int n, long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

unsigned host_affine(unsigned x, unsigned a, unsigned b) {
  return x * a + b;
}

/// A device vector of n unsigned values with a stream, and helpers to launch on it.
class GraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DSV32_REQUIRE_GPU();
    ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ok(cudaMalloc(&x_, n_ * sizeof(unsigned)));
    ok(cudaMalloc(&y_, n_ * sizeof(unsigned)));
    set(x_, 0);
    set(y_, 0);
  }
  void TearDown() override {
    if (stream_) cudaStreamSynchronize(stream_);
    cudaFree(x_);
    cudaFree(y_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  void set(unsigned* p, unsigned v) {
    std::vector<unsigned> h(n_, v);
    ok(cudaMemcpy(p, h.data(), n_ * sizeof(unsigned), cudaMemcpyHostToDevice));
    ok(cudaDeviceSynchronize());  // a pageable H2D copy may return before its DMA lands
  }
  /// Every element of p, after the stream drains; they must all agree.
  unsigned get(unsigned* p) {
    ok(cudaStreamSynchronize(stream_));
    std::vector<unsigned> h(n_);
    ok(cudaMemcpy(h.data(), p, n_ * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (unsigned v : h) EXPECT_EQ(v, h[0]);
    return h[0];
  }
  BreakableGraph::Op launch(unsigned a, unsigned b, cudaStream_t s = nullptr) {
    return [this, a, b, s] {
      affine<<<(n_ + 255) / 256, 256, 0, s ? s : stream_>>>(x_, n_, a, b);
      ok(cudaGetLastError());
    };
  }

  /// Records into g's open capture: x = 0 on the main stream, then x = y slowly on side stream
  /// 0 (`side`), forked after it and left open.
  void record_slow_copy_overlap(BreakableGraph& g, cudaStream_t side) {
    g.graph("x = 0", [&] { ok(cudaMemsetAsync(x_, 0, n_ * sizeof(unsigned), stream_)); });
    g.fork(0);
    g.graph("side: x = y (slow)", [&] {
      slow_copy<<<(n_ + 255) / 256, 256, 0, side>>>(x_, y_, n_, 2'000'000);
      ok(cudaGetLastError());
    });
  }

  int n_ = 1 << 16;
  cudaStream_t stream_ = nullptr;
  unsigned* x_ = nullptr;
  unsigned* y_ = nullptr;
};

TEST_F(GraphTest, SegmentStructureCountsAndLabels) {
  BreakableGraph g(stream_);
  g.begin();
  g.graph("a", launch(1, 1));
  g.graph("b", launch(1, 2));
  g.eager("c", launch(1, 3));
  g.graph("d", launch(1, 4));
  g.eager("e", launch(1, 5));
  g.eager("f", launch(1, 6));
  g.graph("h", launch(1, 7));
  const gpu::CaptureInfo info = g.end();
  EXPECT_EQ(info.structure, "GEGEG");
  EXPECT_EQ(info.graphs, 3);
  EXPECT_EQ(info.eager_breaks, 2);
  EXPECT_EQ(g.segment_labels(), (std::vector<std::string>{"a,b", "c", "d", "e,f", "h"}));
}

TEST_F(GraphTest, CaptureRunsEagerOpsOnlyAndReplayRunsEverythingInOrder) {
  set(x_, 5);
  std::vector<std::string> log;
  BreakableGraph g(stream_);
  g.begin();
  g.graph("double+1", launch(2, 1));
  g.eager("times3", [&, op = launch(3, 0)] {
    log.push_back("times3");
    op();
  });
  g.graph("plus7", launch(1, 7));
  g.eager("times5+2", [&, op = launch(5, 2)] {
    log.push_back("times5+2");
    op();
  });
  g.end();
  // Capture ran the eager ops once, for real, and no graph op.
  unsigned want = host_affine(host_affine(5, 3, 0), 5, 2);
  EXPECT_EQ(get(x_), want);
  EXPECT_EQ(log, (std::vector<std::string>{"times3", "times5+2"}));
  for (int replay = 0; replay < 3; ++replay) {
    g.replay();
    want = host_affine(host_affine(host_affine(host_affine(want, 2, 1), 3, 0), 1, 7), 5, 2);
    EXPECT_EQ(get(x_), want) << "replay " << replay;
  }
  EXPECT_EQ(log.size(), 8u);
}

TEST_F(GraphTest, ReplayAfterChangingInputsAndHostMetadataGivesTheNewAnswer) {
  unsigned host_meta = 0;  // read by the eager op when it runs, like T_a or block tables
  BreakableGraph g(stream_);
  g.begin();
  g.graph("y=x", [&] {
    ok(cudaMemcpyAsync(y_, x_, n_ * sizeof(unsigned), cudaMemcpyDeviceToDevice, stream_));
  });
  g.graph("x*=3", launch(3, 0));
  g.eager("x+=meta", [&] { launch(1, host_meta)(); });
  g.graph("x*=2", launch(2, 0));
  g.end();
  for (unsigned step : {1u, 17u, 4000u}) {
    set(x_, step);
    host_meta = step * 7;
    g.replay();
    EXPECT_EQ(get(x_), (step * 3 + step * 7) * 2) << "step " << step;
    EXPECT_EQ(get(y_), step);
  }
}

TEST_F(GraphTest, NestedCaptureIsRejected) {
  BreakableGraph g(stream_), other(stream_);
  g.begin();
  g.graph("x+1", launch(1, 1));
  EXPECT_THROW(g.begin(), GraphError);
  try {
    other.begin();  // the stream is being captured by g
    FAIL() << "a second capture of a capturing stream was accepted";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("nested capture"), std::string::npos) << e.what();
  }
  // The rejected attempts left g's capture intact.
  EXPECT_TRUE(g.capturing());
  g.eager("x*2", launch(2, 0));
  g.end();
  set(x_, 10);
  g.replay();
  EXPECT_EQ(get(x_), 22u);
}

TEST_F(GraphTest, MisuseIsRejectedWithAReason) {
  BreakableGraph g(stream_);
  EXPECT_THROW(g.replay(), GraphError);
  EXPECT_THROW(g.graph("x", launch(1, 1)), GraphError);
  EXPECT_THROW(g.eager("x", launch(1, 1)), GraphError);
  EXPECT_THROW(g.end(), GraphError);
  EXPECT_THROW(g.fork(0), GraphError);  // no side streams
}

/// An op that throws during capture: the capture is ended, nothing is kept, the streams are no
/// longer capturing, and the same object captures and replays correctly afterwards.
void expect_clean_after_throw(BreakableGraph& g, cudaStream_t stream) {
  EXPECT_FALSE(g.capturing());
  EXPECT_FALSE(g.captured());
  EXPECT_EQ(g.info().structure, "");
  EXPECT_THROW(g.replay(), GraphError);
  cudaStreamCaptureStatus st;
  ASSERT_EQ(cudaStreamIsCapturing(stream, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(GraphTest, AGraphOpThatThrowsLeavesNothingBehind) {
  BreakableGraph g(stream_, 1);
  g.begin();
  g.graph("x+1", launch(1, 1));
  g.eager("x*2", launch(2, 0));
  g.graph("x+3", launch(1, 3));
  g.fork(0);
  g.graph("side x+1", launch(1, 1, static_cast<cudaStream_t>(g.side(0))));
  EXPECT_THROW(g.graph("boom", [] { throw std::runtime_error("op failed"); }), std::runtime_error);
  expect_clean_after_throw(g, stream_);
  cudaStreamCaptureStatus st;
  ASSERT_EQ(cudaStreamIsCapturing(static_cast<cudaStream_t>(g.side(0)), &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusNone);
  // Capture again on the same object.
  g.begin();
  g.graph("x*3", launch(3, 0));
  g.end();
  set(x_, 4);
  g.replay();
  EXPECT_EQ(get(x_), 12u);
}

TEST_F(GraphTest, AnEagerOpThatThrowsLeavesNothingBehind) {
  BreakableGraph g(stream_);
  g.begin();
  g.graph("x+1", launch(1, 1));
  EXPECT_THROW(g.eager("boom", [] { throw std::runtime_error("backend failed"); }),
               std::runtime_error);
  expect_clean_after_throw(g, stream_);
  g.begin();
  g.eager("x+5", launch(1, 5));
  g.end();
  set(x_, 1);
  g.replay();
  EXPECT_EQ(get(x_), 6u);
}

TEST_F(GraphTest, AnEagerBreakInsideATwoStreamOverlapJoinsTheSideStreamFirst) {
  // Graph segment: the main stream clears x; a side stream forked after that slowly copies
  // the step's input y into x. The eager op that follows (x = 3x + 1 on the main stream) must
  // see the copy: the break joins the side stream before ending the segment (else ending the
  // capture fails with an unjoined stream, or the eager op races the copy).
  BreakableGraph g(stream_, 1);
  g.begin();
  record_slow_copy_overlap(g, static_cast<cudaStream_t>(g.side(0)));
  g.eager("x = 3x + 1", launch(3, 1));
  g.graph("x += 2", launch(1, 2));
  const gpu::CaptureInfo info = g.end();
  EXPECT_EQ(info.structure, "GEG");
  for (unsigned step : {7u, 8u, 1000u}) {
    set(y_, step);
    g.replay();
    EXPECT_EQ(get(x_), step * 3 + 1 + 2) << "step " << step;
  }
}

TEST_F(GraphTest, ABorrowedSideStreamIsJoinedAndOutlivesTheGraph) {
  // The same overlap on a side stream the caller owns: joined at the break, and still usable
  // after the graph is gone (the graph does not destroy what it borrowed).
  cudaStream_t side = nullptr;
  ok(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  {
    BreakableGraph g(stream_, std::vector<gpu::Stream>{side});
    EXPECT_EQ(g.side(0), side);
    g.begin();
    record_slow_copy_overlap(g, side);
    g.eager("x = 3x + 1", launch(3, 1));
    EXPECT_EQ(g.end().structure, "GE");
    set(y_, 5);
    g.replay();
    EXPECT_EQ(get(x_), 16u);
  }
  affine<<<(n_ + 255) / 256, 256, 0, side>>>(x_, n_, 2, 0);
  ok(cudaGetLastError());
  ok(cudaStreamSynchronize(side));
  EXPECT_EQ(get(x_), 32u);
  ok(cudaStreamDestroy(side));
  EXPECT_THROW(BreakableGraph(stream_, std::vector<gpu::Stream>{stream_}), GraphError);
  EXPECT_THROW(BreakableGraph(stream_, std::vector<gpu::Stream>{nullptr}), GraphError);
}

}  // namespace
}  // namespace dsv32
