"""Build and time helpers shared by the demo, the CLI and the benchmarks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tvm
from tvm import relax


def build(mod: tvm.IRModule, target: str = "llvm") -> relax.VMExecutable:
    """``relax.build`` for the host CPU (offloaded regions are linked in as external modules)."""
    return relax.build(mod, target=target)


def run(ex: relax.VMExecutable, inputs: Sequence[np.ndarray], entry: str = "main") -> np.ndarray:
    """Run ``entry`` once on numpy inputs; returns the (first) output as numpy."""
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm[entry](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


def median_latency(ex: relax.VMExecutable, inputs: Sequence[np.ndarray], repeat: int = 5,
                   entry: str = "main") -> float:
    """Median wall time of one call of ``entry`` in seconds (after one warm-up call)."""
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in inputs]
    vm[entry](*args)
    timer = vm.time_evaluator(entry, tvm.cpu(), number=1, repeat=repeat)
    return float(np.median(timer(*args).results))


def random_inputs(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None = None,
                  seed: int = 1, entry: str = "main") -> list[np.ndarray]:
    """Random float inputs for the parameters of ``entry`` that are not weights in ``params``."""
    rng = np.random.default_rng(seed)
    arrays = []
    for var in mod[entry].params:
        if params and var.name in params:
            continue
        shape = [int(d) for d in var.ty.shape.values]
        arrays.append(rng.standard_normal(shape).astype(str(var.ty.dtype)))
    return arrays


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (0 when both are all zero)."""
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(got.astype("float64") - want.astype("float64")))) / scale
