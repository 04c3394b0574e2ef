"""The end-to-end check, reused: a second tune of an unchanged model with an unchanged plan does
not build and time both plans again.

The never-slower check of :func:`.tuner.tune` builds the default and the tuned module and times
them side by side; on a ResNet-50 that was most of a warm-cache tune (18.7 s of it on a loaded
2-core machine, against 5 s targeted), because every per-candidate timing came from the cache but
the check itself was redone. Its two figures go into the :class:`.cache.TimingCache` under a key
made of the model (:func:`model_digest`: its Relax structure and its weights' bytes) and the plan
(:func:`plan_digest`: the targets, precision, codegen map, algorithm option and the check's own
settings). A plan that differs in any decision, another model, or a cache from another machine
(which the cache ignores anyway) times again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from .cache import Timing, TimingCache, signature


def model_digest(mod: tvm.IRModule, params: Mapping[str, Any] | None) -> str:
    """A digest of what ``mod`` computes with ``params``: TVM's structural hash of the module (which
    covers constants bound in it) and the bytes, shapes and dtypes of the parameters."""
    h = hashlib.sha256(str(tvm_ffi.structural_hash(mod, map_free_vars=True)).encode())
    for name in sorted(params or {}):
        value = params[name]
        arr = np.ascontiguousarray(value.numpy() if hasattr(value, "numpy") else value)
        h.update(f"{name}:{arr.dtype}:{arr.shape}".encode())
        h.update(memoryview(arr).cast("B"))
    return h.hexdigest()[:20]


def plan_digest(targets: Any, precision: str, region_codegen: Mapping[str, str] | None, algorithms: str,
                rounds: int, repeat: int) -> str:
    """A digest of every decision and setting that shapes the tuned module and its check."""
    body = {"targets": targets if isinstance(targets, str | None) else list(targets), "precision": precision,
            "codegen": dict(sorted((region_codegen or {}).items())), "algorithms": algorithms,
            "rounds": rounds, "repeat": repeat}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:20]


def reused_guard(cache: TimingCache, mod: tvm.IRModule, params: Mapping[str, Any] | None, plan: str,
                 measure: Callable[[], tuple[Timing, Timing]]) -> tuple[Timing, Timing, bool]:
    """``(default, tuned, reused)``: the end-to-end figures of ``plan`` on this model from ``cache``,
    or from ``measure()`` (then stored in ``cache``)."""
    model = model_digest(mod, params)
    keys = [signature("end_to_end", attrs={"model": model, "plan": plan}, choice=c) for c in ("default", "tuned")]
    found = [cache.get(k) for k in keys]
    if all(t is not None for t in found):
        return found[0], found[1], True
    default, tuned = measure()
    cache.put(keys[0], default)
    cache.put(keys[1], tuned)
    return default, tuned, False


__all__ = ["model_digest", "plan_digest", "reused_guard"]
