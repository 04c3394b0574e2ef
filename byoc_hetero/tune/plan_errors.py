"""The precision level's measured errors, kept in the timing cache: a second tune of the same model
with the same calibration inputs builds nothing to measure them again.

Each error the precision level measures — a unit alone in bf16 or int8 (its *sensitivity*), a mix
of the search, all-bf16, all-int8, each candidate on the held-out inputs — is the relative output
error of one *plan* (node key → precision) of one model on one set of inputs. It is stored in the
:class:`.cache.TimingCache` (its ``errors`` part) under a signature of:

- the model (:func:`.reuse.model_digest`: its Relax structure and weights),
- the settings every plan of the tune shares (targets, backend options such as the algorithm
  level's choices, the codegen level's map),
- the plan (its table),
- the inputs (a digest of the calibration or held-out arrays: another calibration set misses).

The end-to-end timings of the plans compared at the end go into the cache the same way (the plans'
tables, the sample's digest, the rounds and repeats), as :mod:`.reuse` does for the codegen and
algorithm levels. Builds are lazy (:class:`.plans.Built`), so a plan whose figures all come
from the cache is never built, and the reference outputs (the default float32 partition run on
the inputs) are computed only when some error must be measured.

Before this, a second tune of ResNet-18 re-measured every sensitivity (one build each, about
3-5 s per build on the project's loaded 2-core machine): most of the warm tune.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import math

import numpy as np

from .cache import Timing, TimingCache, signature


def relative_error(outputs: Sequence[Sequence[np.ndarray]], references: Sequence[Sequence[np.ndarray]]) -> float:
    """``max |y - r| / max |r|`` over every output of every sample (inf for a non-finite output)."""
    worst = 0.0
    for ys, rs in zip(outputs, references):
        for y, r in zip(ys, rs):
            if not np.all(np.isfinite(y)):
                return math.inf
            scale = float(np.max(np.abs(r))) if r.size else 0.0
            diff = float(np.max(np.abs(y.astype("float64") - r))) if r.size else 0.0
            worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def inputs_digest(samples: Sequence[Sequence[np.ndarray]]) -> str:
    """A digest of a list of samples (each a list of arrays): their shapes, dtypes and bytes."""
    h = hashlib.sha256()
    for sample in samples:
        for arr in sample:
            a = np.ascontiguousarray(arr)
            h.update(f"{a.dtype}:{a.shape};".encode())
            h.update(memoryview(a).cast("B"))
        h.update(b"|")
    return h.hexdigest()[:20]


def settings_digest(targets: Any, options: Mapping[str, Any], region_codegen: Mapping[str, str] | None) -> str:
    """A digest of what every plan of one tune shares besides the table."""
    body = {"targets": targets if isinstance(targets, str | None) else list(targets),
            "options": {k: dict(v) for k, v in sorted(options.items())},
            "codegen": dict(sorted((region_codegen or {}).items()))}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:20]


class LazyOutputs(Sequence):
    """The outputs of ``run(samples)``, computed on first access (the reference outputs, which a
    tune whose errors all come from the cache never needs)."""

    def __init__(self, run: Callable[[], list]):
        self._run, self._value = run, None

    def _get(self) -> list:
        if self._value is None:
            self._value = self._run()
        return self._value

    def __getitem__(self, i):  # noqa: ANN001 - Sequence's protocol
        return self._get()[i]

    def __len__(self) -> int:
        return len(self._get())


class PlanErrors:
    """The errors of one tune's plans, through the timing cache; ``samples`` and ``reference`` by
    input set name (``"calibration"``, ``"holdout"``)."""

    def __init__(self, cache: TimingCache, model: str, settings: str):
        self.cache, self.model, self.settings = cache, model, settings
        self.samples: dict[str, list] = {}
        self.reference: dict[str, Sequence] = {}
        self.digests: dict[str, str] = {}
        self.measured = 0  # errors measured (not found in the cache) by this tune

    def inputs(self, which: str, samples: list, reference: Sequence) -> None:
        """Register an input set and its reference outputs (may be :class:`LazyOutputs`)."""
        self.samples[which], self.reference[which], self.digests[which] = samples, reference, inputs_digest(samples)

    def _key(self, table: Mapping[str, str], which: str) -> str:
        attrs = {"model": self.model, "settings": self.settings, "inputs": self.digests[which],
                 "plan": json.dumps(dict(sorted(table.items())))}
        return signature("plan_error", attrs=attrs, choice=which)

    def error(self, table: Mapping[str, str], which: str, built: Any) -> float:
        """The relative error of the plan ``table`` on the ``which`` inputs: from the cache, or by
        running ``built`` (a :class:`.plans.Built`, built only then)."""
        key = self._key(table, which)
        found = self.cache.get_error(key)
        if found is None:
            found = relative_error(built.run(self.samples[which]), self.reference[which])
            self.cache.put_error(key, found)
            self.measured += 1
        return found

    def timings(self, tables: Sequence[Mapping[str, str]], sample: Sequence[np.ndarray], rounds: int, repeat: int,
                measure: Callable[[], list[Timing]]) -> list[Timing]:
        """The end-to-end timings of the plans ``tables`` timed together on ``sample``: from the
        cache when this set of plans was timed so before, else ``measure()`` (then stored)."""
        plans = json.dumps([dict(sorted(t.items())) for t in tables])
        attrs = {"model": self.model, "settings": self.settings, "inputs": inputs_digest([sample]),
                 "plans": hashlib.sha256(plans.encode()).hexdigest()[:20], "rounds": rounds, "repeat": repeat}
        keys = [signature("plans_end_to_end", attrs=attrs, choice=str(i)) for i in range(len(tables))]
        found = [self.cache.get(k) for k in keys]
        if all(t is not None for t in found):
            return found
        timed = measure()
        for k, t in zip(keys, timed):
            self.cache.put(k, t)
        return timed


__all__ = ["LazyOutputs", "PlanErrors", "inputs_digest", "settings_digest"]
