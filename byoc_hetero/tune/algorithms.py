"""The algorithm level: for each unit a backend's ``algorithm`` knob names (e.g. each convolution of a
backend's regions, direct or Winograd), the variant measured fastest on this machine.

A runtime picks such an algorithm by fixed rules (this project's C++ runtime: Winograd F(4x4, 3x3)
at least 25 output tiles, tile buffers under 256 MiB; ``cpp/kernels/winograd.cc``), measured once on
one machine's benchmark layers. Here each distinct unit of a partitioned model's regions (read from
the regions as they run by the backend's knob: :class:`~byoc_hetero.rules.Knob` ``units``; for
this project's runtime its convolution sites, shapes, strides, padding, dilation, groups) is built
alone by the knob's ``probe`` once per choice — the backend's variants of level ``algorithm``
(``Backend.choices``) — and timed (:func:`.measure.time_call`). The fastest is the decision; the
decisions reach the backend as the knob's option (e.g. ``algorithms``: site key →
algorithm, written into the node as ``algo`` by its last region pass, docs/region-format.md),
which wins over the thresholds. A choice the probe says does not apply (Winograd on a 1x1 conv)
is not timed; a unit with one choice left is not timed at all.

Timings go through a :class:`.cache.TimingCache` under the unit's signature and the choice, so a
ResNet's repeated blocks are timed once, and a second tune of a model reads them back. Nothing here
names a backend: a user's backend with an ``algorithm`` knob and variants of that level is tuned
the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm

from .cache import Timing, TimingCache, signature
from .knobs import knob_of
from .measure import time_call

LEVEL = "algorithm"


def conv_sites(partitioned: tvm.IRModule) -> list[Any]:
    """The distinct units of the algorithm knobs of a partitioned module's regions (e.g. a
    backend's float32 convolutions as the regions run them), in the order first met."""
    from .._relax import region_table

    sites: dict[Any, None] = {}
    for entry in region_table(partitioned).values():
        knob = knob_of(entry.target, LEVEL)
        if knob is not None and knob.units is not None:
            sites.update(dict.fromkeys(knob.units(entry.graph or {})))
    return list(sites)


@dataclass
class AlgorithmDecision:
    """What was measured for one unit and what won."""

    site: Any
    timings: dict[str, Timing] = field(default_factory=dict)
    chosen: str = ""  # set by :func:`decide_unit`: the backend's first choice until measured otherwise
    default: str = ""  # what the backend picks without a decision
    cached: bool = False
    kept_because: str = ""  # why the level kept the default without building the unit

    def why(self) -> str:
        if self.kept_because:
            return f"{self.chosen}: {self.kept_because}"
        if len(self.timings) < 2:
            return f"{self.chosen}: the only algorithm that applies"
        parts = ", ".join(f"{a} {t.median_s * 1e6:.1f} µs" for a, t in sorted(self.timings.items()))
        change = "" if self.chosen == self.default else f" (the backend's default picks {self.default})"
        return f"{self.chosen} is fastest: {parts}{change}"


def timing_key(site: Any, choice: str) -> str:
    """The timing-cache signature of ``site`` run with ``choice``."""
    op, shapes, dtypes, attrs = site.timing_parts()
    return signature(op, shapes, dtypes, attrs, choice)


def _measure(site: Any, algo: str, cache: TimingCache, repeat: int, built: Any) -> tuple[Timing, bool]:
    key = timing_key(site, algo)
    hit = cache.get(key)
    if hit is not None:
        return hit, True
    timing = time_call(built, warmup=3, repeat=repeat, min_total_s=0.05)
    cache.put(key, timing)
    return timing, False


def decide_unit(site: Any, cache: TimingCache, repeat: int = 15,
                choices: Sequence[str] | None = None) -> AlgorithmDecision:
    """One unit's decision: ``choices`` (default: its backend's variants of level ``algorithm``)
    where they apply, each timed (through ``cache``), the fastest chosen."""
    from ..targets import get_target

    backend = get_target(site.backend)
    knob = backend.knobs[LEVEL]
    choices = tuple(choices) if choices is not None else backend.choices(LEVEL, knob.op)
    d = AlgorithmDecision(site, chosen=choices[0], default=choices[0])
    d.kept_because = knob.fixed(site) if knob.fixed is not None else ""
    if d.kept_because:
        return d
    d.default = knob.default(site) if knob.default is not None else choices[0]
    probes = {c: knob.probe(site, c) for c in choices}
    probes = {c: p for c, p in probes.items() if p is not None}
    if len(probes) < 2:  # one choice applies: nothing to time
        d.chosen = next(iter(probes), d.default)
        return d
    hits = []
    for algo, probe in probes.items():
        d.timings[algo], hit = _measure(site, algo, cache, repeat, probe)
        hits.append(hit)
    d.cached = all(hits)
    d.chosen = min(d.timings, key=lambda a: d.timings[a].median_s)
    return d


def tune_conv_algorithms(sites: Iterable[Any], cache: TimingCache | None = None,
                         repeat: int = 15) -> list[AlgorithmDecision]:
    """Time each unit's applicable choices (through ``cache``) and pick the fastest."""
    cache = cache if cache is not None else TimingCache(None)
    return [decide_unit(site, cache, repeat) for site in sites]


def decisions_options(decisions: Sequence[AlgorithmDecision], backends: Iterable[str] = ()
                      ) -> dict[str, dict[str, str]]:
    """The backend options that apply ``decisions`` (``{backend: {knob option: JSON unit key →
    choice}}``), naming only the units where the decision differs from the default; every backend
    of ``backends`` with an algorithm knob gets its option, an empty table where nothing changed."""
    tables: dict[str, dict[str, str]] = {b: {} for b in backends if knob_of(b, LEVEL) is not None}
    for d in decisions:
        table = tables.setdefault(d.site.backend, {})
        if d.chosen != d.default:
            table[d.site.key()] = d.chosen
    return {b: {knob_of(b, LEVEL).option: json.dumps(t, sort_keys=True)} for b, t in tables.items()}


def decisions_option(decisions: Sequence[AlgorithmDecision]) -> str:
    """The JSON table (unit key → choice) of the decisions that differ from the default."""
    return json.dumps({d.site.key(): d.chosen for d in decisions if d.chosen != d.default}, sort_keys=True)
