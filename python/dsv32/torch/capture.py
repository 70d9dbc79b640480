"""Running a layer eagerly or under CUDA graphs with eager breaks (docs/TORCH.md).

A layer marks its ops with `@op("sparse_mqa")` (BOUNDARIES.md's names) and its stages with
`record("layer0/c", t)`. A plan says which marked ops run eagerly between graph segments:

| mode | graphs | eager at replay |
|---|---|---|
| `eager` | none; each step unpadded | everything |
| `full` | one a capture size | nothing |
| `narrow` | the segments between | `indexer_topk`, `sparse_mqa`, `uv_proj` |
| `wide` | the segments between | ops 4-11: `norm_rope_cache` ... `uv_proj` |

Capture (per capture size T, on the first step that needs it): the static `Batch` is filled with
a dummy (one token, the rest padding), the layer runs once eagerly to warm up, then once under
capture: reaching an eager op ends the segment, runs the op for real, remembers it and its
arguments, and begins the next segment (one memory pool for all). Replay of a step: its inputs
are copied into the static batch (host metadata too), then segments and eager ops run in order on
one stream, each eager op called again with the arguments it had at capture. An eager op must
write its results into tensors the graphs hold (as vLLM's attention writes `output`): a tensor
it returns at replay at another address than at capture is not what the next segment reads, and
the runner notes it (`Runner.notes`).
"""
import functools
import warnings

import torch

PLANS = {
    "eager": None,
    "full": frozenset(),
    "narrow": frozenset({"indexer_topk", "sparse_mqa", "uv_proj"}),
    "wide": frozenset({"norm_rope_cache", "q_b_proj", "uk_absorb", "indexer_wq_b", "fused_q",
                       "indexer_topk", "sparse_mqa", "uv_proj"}),
}
MODES = tuple(PLANS)

_active = None  # the Runner driving the layer now, if any


def record(name, tensor):
    """Records a stage (GOLDEN.md's names: "layer0/c", "output", ...) of the rows [0, T). Under
    capture the value is copied into a buffer of the graph's, refreshed at every replay."""
    if _active is not None:
        _active._record(name, tensor)


def op(name):
    """Marks a function as BOUNDARIES.md's op `name`: under a plan that runs it eagerly, it is
    a break between graph segments, called again at every replay with its capture arguments."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if _active is None:
                return fn(*args, **kwargs)
            return _active._op(name, fn, args, kwargs)
        return call
    return wrap


class Segments:
    """One capture size's graphs and eager ops, in the order they replay."""

    def __init__(self):
        self.items = []  # ("graph", CUDAGraph) | ("eager", name, fn, args, kwargs, result)
        self.stages = {}  # name -> the graph-held buffer of a recorded stage


class Runner:
    """Drives `layer(batch) -> output (T, D)` through steps in one mode."""

    def __init__(self, mode, device):
        if mode not in PLANS:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        self.mode, self.plan, self.device = mode, PLANS[mode], torch.device(device)
        if self.plan is not None and self.device.type != "cuda":
            raise RuntimeError(f"mode {mode} captures CUDA graphs: it needs a CUDA device, "
                               f"not {self.device}")
        self.graphs, self.static, self.notes, self.memory = {}, {}, [], {}
        self.grown = set()  # capture sizes whose memory growth is noted
        self.capturing = None  # the Segments being captured
        self.stages = {}
        self.stream = torch.cuda.Stream(self.device) if self.plan is not None else None
        self.pool = None

    # --- what the layer calls -----------------------------------------------------------------
    def _record(self, name, t):
        seg = self.capturing
        if seg is None:  # eager, warm-up, or an eager op at replay
            target = self.replaying.stages.get(name) if self.replaying else None
            if target is not None:
                target.copy_(t)
            else:
                self.stages[name] = t.detach().clone()
            return
        buf = seg.stages.get(name)
        if buf is None:
            buf = seg.stages[name] = torch.empty_like(t)
        buf.copy_(t)

    def _op(self, name, fn, args, kwargs):
        seg = self.capturing
        if seg is None or name not in self.plan or self.in_eager:  # an op inside an eager op
            return fn(*args, **kwargs)                            # is part of it
        self._end_segment(seg)
        self.in_eager = True
        try:
            out = fn(*args, **kwargs)  # for real, on the capture stream
        finally:
            self.in_eager = False
        seg.items.append(("eager", name, fn, args, kwargs, out))
        self._begin_segment(seg)
        return out

    # --- capture and replay -------------------------------------------------------------------
    replaying = None
    in_eager = False

    def _begin_segment(self, seg):
        g = torch.cuda.CUDAGraph()
        g.capture_begin(pool=self.pool)
        seg.items.append(("graph", g))

    def _end_segment(self, seg):
        """Ends the segment; one that captured nothing (two eager ops in a row) is dropped."""
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            seg.items[-1][1].capture_end()
        if any("CUDA Graph is empty" in str(w.message) for w in seen):
            seg.items.pop()
        else:
            for w in seen:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def run(self, layer, batch, inputs):
        """The layer's output and stages of one step (rows [0, T))."""
        global _active
        self.stages = {}
        if self.plan is None:
            _active = self
            try:
                with torch.no_grad():
                    out = layer(batch)
            finally:
                _active = None
            self.stages["output"] = out  # what the layer returns is its output, recorded or not
            return self.stages
        T = batch.num_padded
        if T not in self.graphs:
            self._capture(layer, T, inputs)
        static, seg = self.static[T], self.graphs[T]
        static.copy_from(batch)  # on the current stream: the replay's stream waits for it
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        before = torch.cuda.memory_allocated(self.device)
        _active, self.replaying = self, seg
        try:
            with torch.cuda.stream(self.stream), torch.no_grad():
                for item in seg.items:
                    if item[0] == "graph":
                        item[1].replay()
                    else:
                        _, name, fn, args, kwargs, was = item
                        self._check_address(name, was, fn(*args, **kwargs))
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            torch.cuda.synchronize(self.device)
        finally:
            _active, self.replaying = None, None
        self._check_growth(T, batch.step, torch.cuda.memory_allocated(self.device) - before)
        got = {k: v.clone() for k, v in seg.stages.items()}
        got.update({k: v for k, v in self.stages.items() if k not in got})
        return got

    def _capture(self, layer, T, inputs):
        global _active
        static = self.static[T] = inputs.dummy(T)
        seg = Segments()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        _active = self
        try:
            with torch.cuda.stream(self.stream), torch.no_grad():
                layer(static)  # warm-up, eagerly
                torch.cuda.synchronize(self.device)
                self.capturing = seg
                self._begin_segment(seg)
                out = layer(static)
                seg.stages["output"] = out
                self._end_segment(seg)
                self.capturing = None
        except BaseException:
            if self.capturing is not None and seg.items and seg.items[-1][0] == "graph":
                try:  # leave the stream out of capture mode, so the error is all that remains
                    with torch.cuda.stream(self.stream):  # capture ends where it began
                        seg.items[-1][1].capture_end()
                except Exception:
                    pass
            raise
        finally:
            _active, self.capturing = None, None
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.graphs[T] = seg

    def _check_growth(self, T, step, grew):
        """Notes device memory that a replay leaves allocated (`grew` bytes more after it than
        before it), at each of the last three replays of a capture size: graphs allocate nothing
        at replay and an eager op's temporaries are freed by its end, so an eager op keeps what
        it allocates. What the caller holds between steps (its batches, the stages handed back)
        is outside the window and does not count."""
        seen = self.memory.setdefault(T, [])
        seen.append(grew)
        if len(seen) >= 3 and min(seen[-3:]) > 0 and T not in self.grown:  # one note a size
            self.grown.add(T)
            self.notes.append(f"device memory grows at every replay of capture size {T} (by "
                              f"{sum(seen[-3:]) // 3} bytes a replay, at step {step}): an eager "
                              f"op keeps what it allocates")

    def _check_address(self, name, was, now):
        pairs = zip(was, now) if isinstance(was, (tuple, list)) else [(was, now)]
        for a, b in pairs:
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
                    a.data_ptr() != b.data_ptr():
                note = (f"eager op {name} returned a tensor at a new address at replay: the "
                        f"graph segment after it reads the one it returned at capture (write "
                        f"into a buffer the graphs hold instead)")
                if note not in self.notes:
                    self.notes.append(note)
