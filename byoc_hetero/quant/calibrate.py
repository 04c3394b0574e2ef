"""Calibration: the float model's activations on sample inputs, and the ranges they give.

:func:`observe` builds **one** module that returns the model's outputs *and* every tensor to
calibrate (``main`` re-emitted without dataflow blocks, its result a tuple of both), so that one build
and one call per calibration input collect every activation — no build per layer. The build is the
llvm one by default, or the offloaded one (``on="onednn"``: the float model's regions on oneDNN).

Ranges (:func:`calibrated_range`), always widened to hold 0 afterwards:

- ``"minmax"``: the smallest and largest value seen;
- ``"percentile"``: the ``percentile``-th and ``100 - percentile``-th percentiles of all values seen
  (outliers clipped);
- ``"entropy"``: TensorRT's KL-divergence threshold on the histogram of ``|x|`` (2048 bins): the
  clipping threshold whose 128-level (signed) or 256-level (non-negative data) quantization loses the
  least information; the range is ``[-t, t]`` clipped to the values seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import QuantizationError

METHODS = ("minmax", "percentile", "entropy")
_SAMPLE_LIMIT = 1 << 20  # values kept per tensor and input for the histogram methods


def observer_function(func: relax.Function, tensors: Sequence[relax.Var]) -> relax.Function:
    """``func`` returning ``(its result, (tensors...))``; its bindings re-emitted outside dataflow
    blocks, so that any bound value can be returned."""
    from .insert_qdq import substitute

    bb = relax.BlockBuilder()
    env: dict[relax.Var, relax.Expr] = {}
    attrs = {k: v for k, v in func.attrs.items() if k != "params"} if func.attrs is not None else None
    with bb.function("main", list(func.params), attrs=attrs, pure=True):
        for block in func.body.blocks:
            for b in block.bindings:
                value = substitute(b.value, env)
                env[b.var] = bb.match_cast(value, b.ty) if isinstance(b, relax.MatchCast) else bb.emit(value)
        out = relax.Tuple([substitute(func.body.body, env), relax.Tuple([env.get(t, t) for t in tensors])])
        bb.emit_func_output(out)
    return bb.get()["main"]


def _flatten(value: Any) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for item in value for a in _flatten(item)]


def build_observer(mod: tvm.IRModule, params: Mapping[str, np.ndarray], tensors: Sequence[relax.Var],
                   on: str = "llvm") -> relax.VirtualMachine:
    """A VM of ``mod`` (weights bound) whose ``main`` returns ``(outputs, tensors)``."""
    from ..stages import bind_params, partition
    from ..timing import build

    observed = mod.clone()
    observed["main"] = observer_function(mod["main"], tensors)
    if on == "llvm":
        observed = bind_params(observed, params)
    elif on == "onednn":
        observed = partition(observed, params)
    else:
        raise QuantizationError(f"calibrate_on must be 'llvm' or 'onednn', got {on!r}")
    return relax.VirtualMachine(build(observed), tvm.cpu())


def run_observer(vm: relax.VirtualMachine, inputs: Sequence[np.ndarray], n_outputs: int | None = None
                 ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One call: (the model's outputs flattened, the observed tensors in order)."""
    result = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(x)) for x in inputs])
    outputs, observed = result[0], result[1]
    return _flatten(outputs), [t.numpy() for t in observed]


class Observations:
    """Per observed tensor: its min and max over all inputs, and (for the histogram methods) a sample
    of its values (at most 2**20 per input, evenly strided)."""

    def __init__(self, names: list[str], keep_samples: bool):
        self.names = names
        count = len(names)
        self.low = np.full(count, np.inf)
        self.high = np.full(count, -np.inf)
        self.samples: list[list[np.ndarray]] | None = [[] for _ in range(count)] if keep_samples else None

    def add(self, arrays: Sequence[np.ndarray]) -> None:
        for i, a in enumerate(arrays):
            if a.size == 0:
                continue
            if not np.all(np.isfinite(a)):
                raise QuantizationError(f"the float model's tensor {self.names[i]!r} holds NaN or inf on a "
                                        "calibration input: its range cannot be calibrated (check the inputs)")
            self.low[i] = min(self.low[i], float(a.min()))
            self.high[i] = max(self.high[i], float(a.max()))
            if self.samples is not None:
                flat = a.reshape(-1)
                step = max(1, flat.size // _SAMPLE_LIMIT)
                self.samples[i].append(np.array(flat[::step], np.float32))

    def range(self, i: int, method: str, percentile: float) -> tuple[float, float]:
        lo, hi = float(self.low[i]), float(self.high[i])
        if method == "minmax" or self.samples is None or not np.isfinite(lo):
            return lo, hi
        values = np.concatenate(self.samples[i])
        return calibrated_range(values, method, percentile, (lo, hi))


def calibrated_range(values: np.ndarray, method: str, percentile: float = 99.99,
                     seen: tuple[float, float] | None = None) -> tuple[float, float]:
    """The range of ``values`` by ``method`` (see the module docstring)."""
    lo, hi = seen if seen is not None else (float(values.min()), float(values.max()))
    if method == "minmax":
        return lo, hi
    if method == "percentile":
        return float(np.percentile(values, 100.0 - percentile)), float(np.percentile(values, percentile))
    if method == "entropy":
        t = entropy_threshold(np.abs(values), signed=lo < 0)
        return max(lo, -t), min(hi, t)
    raise QuantizationError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    mask = p > 0
    q = np.where(q > 0, q, 1e-12)
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def entropy_threshold(magnitudes: np.ndarray, signed: bool, bins: int = 2048) -> float:
    """TensorRT's calibration threshold: of the candidate clipping points ``edges[i]`` (i from the
    number of levels up to ``bins``), the one minimizing KL(reference || quantized), where the
    reference is the histogram clipped at ``i`` (the tail added to its last bin) and the quantized
    one spreads each of ``levels`` merged bins' mass evenly over its non-empty bins."""
    amax = float(magnitudes.max()) if magnitudes.size else 0.0
    if amax == 0.0:
        return 0.0
    hist, edges = np.histogram(magnitudes, bins=bins, range=(0.0, amax))
    hist = hist.astype(np.float64)
    levels = 128 if signed else 256
    best, best_kl = bins, np.inf
    for i in range(levels, bins + 1, 16):
        ref = hist[:i].copy()
        ref[-1] += hist[i:].sum()
        # the i bins merged into `levels` chunks (np.array_split's sizes), each chunk's mass spread
        # evenly over its non-empty bins
        lengths = np.full(levels, i // levels)
        lengths[: i % levels] += 1  # as np.array_split sizes them (i >= levels: none empty)
        starts = np.concatenate(([0], lengths.cumsum()[:-1]))
        nonzero = hist[:i] > 0
        mass = np.add.reduceat(hist[:i], starts)
        count = np.add.reduceat(nonzero.astype(np.float64), starts)
        q = np.repeat(np.divide(mass, count, out=np.zeros_like(mass), where=count > 0), lengths) * nonzero
        kl = _kl(ref / ref.sum(), q / max(q.sum(), 1e-12))
        if kl < best_kl:
            best, best_kl = i, kl
    return float(edges[best])
