"""dsv32.torch: a live PyTorch layer checked against golden files, eagerly or under CUDA graphs
with eager breaks (docs/TORCH.md).

    import dsv32.torch as dt
    verdict = dt.check(MyLayer.from_golden(golden), golden, mode="narrow", device="cuda")
    assert verdict.passed, dt.failure_text(verdict)

The layer is called as `layer(batch) -> output` (batch: `dt.Batch`, engine-shaped tensors and
persistent paged caches), marks its ops with `@dt.op("sparse_mqa")` and records stages with
`dt.record("layer0/c", t)`. Modes: eager, full, narrow, wide (BOUNDARIES.md's plans).
`dt.weights.state_dict(golden, "hf" | "vllm")` gives the golden's weights under the names a
Hugging Face or vLLM module loads.
"""
from . import fp8, weights
from .batch import Batch, Inputs, LayerCache, storage_dtype
from .capture import MODES, PLANS, Runner, op, record
from .check import LayerError, check, failure_text, run_steps

__all__ = ["fp8", "weights", "Batch", "Inputs", "LayerCache", "storage_dtype", "MODES", "PLANS", "Runner",
           "op", "record", "LayerError", "check", "failure_text", "run_steps"]
