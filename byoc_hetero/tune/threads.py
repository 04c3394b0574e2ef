"""The threads level: for each region run by a backend with a ``threads`` knob
(:class:`~byoc_hetero.rules.Knob`; this project's C++ runtime declares one), all of the process's threads or
one, from timings (``bh.tune(..., threads=True)``).

This project's runtime's region module runs its calls with the process's thread count (``byoc_hetero._C.num_threads()``:
``BYOC_HETERO_NUM_THREADS``, else ``OMP_NUM_THREADS``, else the CPUs the process may use). A small
region can lose more to waking and joining the OpenMP team than the second core wins; a region
document's optional ``"threads"`` caps its calls' count (docs/region-format.md), and the backend
option ``region_threads`` (JSON ``{region key: n}``, the knob's option) writes it per region.

Each distinct offloaded region of the codegen level's plan (repeated blocks share a key) is built
alone twice — with the process's count and with one thread — and both are timed alternately on
random inputs of its real shapes (:func:`.codegen._time_all`), through the timing cache. One
thread wins only where it is faster by more than the two timings' spread; otherwise the region
keeps the process's count. With one thread in the process there is nothing to choose and the
level says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .cache import Timing, TimingCache
from .codegen import RegionCandidate, harness_module, random_inputs, timing_key, ms_text, runner, time_all, winner
from .knobs import knob_of, with_option

LEVEL = "threads"


@dataclass
class ThreadsDecision:
    """One region's thread counts, their times, and the count chosen."""

    region: RegionCandidate
    timings: dict[int, Timing] = field(default_factory=dict)
    chosen: int = 0
    cached: bool = False

    def why(self) -> str:
        parts = ", ".join(f"{n} thread{'s' if n > 1 else ''} {ms_text(t)}" for n, t in sorted(self.timings.items()))
        return f"{self.chosen} thread{'s' if self.chosen > 1 else ''}: {parts}{' [cached]' if self.cached else ''}"


def _options(options: Mapping[str, Mapping[str, Any]], c: RegionCandidate, n: int) -> dict[str, dict[str, Any]]:
    return with_option(options, c.target, LEVEL, {c.key: n})


def measure_threads(c: RegionCandidate, cache: TimingCache, options: Mapping[str, Mapping[str, Any]],
                    counts: tuple[int, int], repeat: int = 15, budget_s: float = 1.0) -> ThreadsDecision:
    """Time region ``c`` offloaded with each of ``counts`` (the process's count first, the default)
    through ``cache``, and choose."""
    d = ThreadsDecision(c)
    variants = {n: _options(options, c, n) for n in counts}
    keys = {n: timing_key(c, c.target, opts) for n, opts in variants.items()}
    found = {n: cache.get(k) for n, k in keys.items()}
    if all(found.values()):
        d.timings, d.cached = dict(found), True
    else:
        args, harness = random_inputs(c.func), harness_module(c.func, True)
        runners = {str(n): runner(harness, args, opts) for n, opts in variants.items()}
        timed, _ = time_all(runners, repeat, budget_s)
        d.timings = {int(n): t for n, t in timed.items()}
        for n, k in keys.items():
            cache.put(k, d.timings[n])
    d.chosen = int(winner({str(n): t for n, t in d.timings.items()}, str(counts[0])))
    return d


def threads_option(decisions: list[ThreadsDecision]) -> str | None:
    """The ``region_threads`` table (JSON) of the decisions that differ from the process's count."""
    table = {d.region.key: d.chosen for d in decisions if d.chosen != max(d.timings)}
    return json.dumps(table, sort_keys=True) if table else None


def threads_options(decisions: list[ThreadsDecision]) -> dict[str, dict[str, str]]:
    """The backend options (``{backend: {knob option: JSON}}``) of the decisions that differ from
    the process's count; empty when none does."""
    out: dict[str, dict[str, str]] = {}
    for backend in dict.fromkeys(d.region.target for d in decisions):
        table = threads_option([d for d in decisions if d.region.target == backend])
        if table:
            out[backend] = {knob_of(backend, LEVEL).option: table}
    return out


__all__ = ["ThreadsDecision", "measure_threads", "threads_option", "threads_options"]
