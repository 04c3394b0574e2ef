"""The codegen level: for each candidate region, offloaded, left to TVM's llvm code, or run by
another backend of ``targets`` (a user's, from ``bh.register_target``), from timings.

The cost gate of MergeCompilerRegions keeps a region on llvm when it has no conv, dense or matmul
(``byoc_hetero/passes/cost_gate.py``) — a fixed rule, measured once on a lone relu. Here the
candidates are the regions the stages form with that rule off (so the regions the gate refuses
are tried offloaded too). Each distinct region (:func:`~byoc_hetero.passes.cost_gate.region_key`:
its ops, attributes and shapes, not its weights) is built alone twice, with random inputs of its
real shapes:

- *offloaded*: a ``main`` that calls the region, through the backend's codegen — so the time
  counts what the boundary costs: the VM's call into the region, the runtime's argument binding and
  its layout conversions in and out;
- *llvm*: the same ``main`` with the region's composites inlined back to plain ops, as
  ``relax.build`` compiles what stays with TVM;
- *another backend* of ``targets``: the region as that backend forms it from the plain ops
  (:mod:`byoc_hetero.passes.retarget_regions`), where it can run all of them, called like the
  offloaded one through that backend's codegen.

Both run in the same VM harness and are timed (:func:`.measure.time_call`; a candidate already
``GIVE_UP`` times slower than the other on its first call is not timed further). The faster wins;
where the two are closer than their spread (IQR / median) the cost gate's verdict stays. The
decisions reach the stages as a codegen map (``bh.partition(..., region_codegen=...)``: region key
→ ``"llvm"`` or the backend), which overrides the gate for the regions it names.

Timings go through the :class:`.cache.TimingCache` under the region's key, shapes and the backend
options that change how it runs (the precision): repeated blocks are timed once, and a second tune
reads them back without building anything.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .._relax import is_region, op_calls, region_composites, shape_of, static_shape, tensor_dtype
from ..errors import PlacementWarning
from ..rules import get_target
from ..passes.cost_gate import DEFAULT_MIN_REGION_OPS, HOST, gate_reason
from ..passes.retarget_regions import region_as_main, region_key_of
from ..stages import retarget_region
from .cache import Timing, TimingCache, signature
from .measure import random_input, robust_timing

GIVE_UP = 5.0
"""A candidate whose first call takes this many times the other's median is not timed further ..."""

GIVE_UP_AFTER_S = 0.05
"""... when that call took at least this long: a first call pays one-time costs of up to a few ms
(an llvm ``not_equal`` on 32 elements read 4 ms on its first call, 2 µs after), which only a call
this long makes negligible."""

TIMED_ON = "cpu"
"""The device kind this level times regions on (its harness runs on ``tvm.cpu()``): a backend whose
regions run on another device (``cuda_vendor``: ``cuda``) is no candidate here, and its own regions
are left to the cost gate's rule, the report saying why (the device level places them)."""

Progress = Callable[[str, int, int, str], None]
"""``progress(level, done, total, what)``: told before each measurement."""


@dataclass(frozen=True)
class RegionCandidate:
    """One distinct region the stages form with the cost gate off."""

    key: str  # region_key: equal for repeated blocks
    target: str  # the backend that would run it
    ops: tuple[str, ...]  # its Relax ops, short names, in order
    gate: str | None  # why the fixed rule keeps it on llvm; None: the rule offloads it
    count: int = 1  # how many regions of the model have this key
    func: relax.Function | None = field(default=None, repr=False, compare=False)

    @property
    def default(self) -> str:
        """What the cost gate's fixed rule decides: the backend or ``"llvm"``."""
        return HOST if self.gate else self.target

    @property
    def untimeable(self) -> str | None:
        """Why the region cannot be timed alone (then the cost gate's rule decides), else None."""
        reason = device_reason(self.target)
        if reason:
            return reason
        for p in self.func.params if self.func is not None else ():
            if not isinstance(p.ty, relax.TensorType) or static_shape(p) is None:
                return f"parameter {p.name} has no static tensor shape: not timed"
            try:
                np.dtype(tensor_dtype(p))
            except TypeError:
                return f"parameter {p.name} is {tensor_dtype(p)}, which numpy cannot make inputs of: not timed"
        return None

    def __str__(self) -> str:
        names = list(dict.fromkeys(self.ops))
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        first = shape_of(self.func.params[0]) if self.func is not None and self.func.params else None
        where = f" on {list(first)}" if first is not None else ""
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"region {self.key} [{len(self.ops)} ops: {shown}]{where}{times}"


def candidate_regions(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None = None, *,
                      targets: Any = None, precision: str | None = None,
                      options: Mapping[str, Mapping[str, Any]] | None = None,
                      region_codegen: Mapping[str, str] | None = None) -> list[RegionCandidate]:
    """The distinct regions of ``mod`` as MergeCompilerRegions forms them without the cost gate's
    heavy-op rule (with ``region_codegen`` applied where given), in the order first met."""
    from ..passes import BEFORE_STAGES, run_passes
    from ..stages import bind_params, stages

    merged = run_passes(BEFORE_STAGES, bind_params(mod, params))
    with warnings.catch_warnings():  # keys of a region a decision removed: expected here
        warnings.simplefilter("ignore", PlacementWarning)
        for stage in stages(targets, 1, False, precision, options, region_codegen)[:3]:
            merged = stage(merged)
    found: dict[str, RegionCandidate] = {}
    for func in merged.functions.values():
        if not is_region(func):
            continue
        key = region_key_of(func)
        if key in found:
            found[key] = replace(found[key], count=found[key].count + 1)
            continue
        calls = [c for f in region_composites(func) for c in op_calls(f)]
        found[key] = RegionCandidate(key, get_target(str(func.attrs["Codegen"])).name,
                                     tuple(c.op.name.removeprefix("relax.") for c in calls),
                                     gate_reason(calls, DEFAULT_MIN_REGION_OPS, True), func=func)
    return list(found.values())


def device_reason(backend: str) -> str | None:
    """Why this level cannot time ``backend``'s regions (its runtime runs on another device than
    :data:`TIMED_ON`), else None."""
    device = get_target(backend).device
    if device != TIMED_ON:
        return f"{backend} runs on {device}; the codegen level times on the {TIMED_ON}: not timed here"
    return None


def harness_module(region: relax.Function, offloaded: bool) -> tvm.IRModule:
    """A module whose ``main`` runs ``region``: called as a region, or with its composites inlined
    as plain ops for llvm."""
    if offloaded:
        symbol = str(region.attrs["global_symbol"])
        bb = relax.BlockBuilder()
        gv = bb.add_func(region, symbol)
        params = [relax.Var(p.name, p.ty) for p in region.params]
        with bb.function("main", params):
            bb.emit_func_output(bb.emit(relax.Call(gv, params)))
        return bb.get()
    return region_as_main(region)


def _other_backends(c: RegionCandidate, names: Sequence[str]) -> tuple[dict[str, relax.Function], dict[str, str]]:
    """The region as a region of each other backend of ``names`` that can run all of it, and why
    each of the rest cannot."""
    runs, why = {}, {}
    for name in names:
        if name == c.target:
            continue
        reason = device_reason(name)
        if reason:
            why[name] = reason
            continue
        got = retarget_region(c.func, name)
        if isinstance(got, str):
            why[name] = got
        else:
            runs[name] = got
    return runs, why


def random_inputs(region: relax.Function, seed: int = 0) -> list[tvm.runtime.Tensor]:
    """Random arguments of the region's parameter types (integers 0: valid indices)."""
    rng = np.random.default_rng(seed)
    args = []
    for p in region.params:
        args.append(tvm.runtime.tensor(random_input(rng, static_shape(p), tensor_dtype(p))))
    return args


def runner(harness: tvm.IRModule, args: list, options: Mapping[str, Mapping[str, Any]]) -> Callable[[], Any]:
    from ..stages import partition_graph

    if any(is_region(f) for f in harness.functions.values()):
        harness = partition_graph(options)(harness)
    fn = relax.VirtualMachine(relax.build(harness, target="llvm"), tvm.cpu())["main"]
    return lambda: fn(*args)


def _calls(fn: Callable[[], Any], n: int) -> list[float]:
    """The durations of ``n`` calls of ``fn``."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def time_all(fns: Mapping[str, Callable[[], Any]], repeat: int, budget_s: float) -> tuple[dict[str, Timing], str]:
    """Every candidate timed: the first (the region's own backend) warmed up and called three
    times; each other one called once, and dropped from further timing when that first call is
    :data:`GIVE_UP` times the first's median and long (:data:`GIVE_UP_AFTER_S`); then three rounds
    alternating between those left, the order reversed every other round (so that load from other
    work hits all alike), each round ``repeat / 3`` calls or as many as ``budget_s`` allows (at
    least 2)."""
    names = list(fns)
    fns[names[0]]()
    samples = {names[0]: _calls(fns[names[0]], 3)}
    median = float(np.median(samples[names[0]]))
    out, notes = {}, []
    for name in names[1:]:
        first = _calls(fns[name], 1)[0]
        if first > max(GIVE_UP * median, GIVE_UP_AFTER_S):
            out[name] = robust_timing([first])
            notes.append(f"{name}'s first call took {first / median:.0f}x the offloaded median: not timed further")
        else:
            samples[name] = [first]
    timed = list(samples)
    if len(timed) == 1:
        samples[names[0]] += _calls(fns[names[0]], max(0, repeat - 3))
    else:
        slowest = max(max(v) for v in samples.values())
        per_round = max(2, min(-(-repeat // 3), int(budget_s / (3 * len(timed)) / max(slowest, 1e-9))))
        for r in range(3):
            for name in timed if r % 2 == 0 else reversed(timed):
                samples[name].extend(_calls(fns[name], per_round))
    out.update({name: robust_timing(v) for name, v in samples.items()})
    return {name: out[name] for name in names}, "; ".join(notes)


@dataclass
class CodegenDecision:
    """What was measured for one candidate region and where it runs."""

    region: RegionCandidate
    timings: dict[str, Timing] = field(default_factory=dict)  # "llvm", the backend, other backends
    chosen: str = ""
    cached: bool = False
    note: str = ""
    unable: dict[str, str] = field(default_factory=dict)  # other backends asked for that cannot run it: why

    @property
    def default(self) -> str:
        return self.region.default

    def why(self) -> str:
        """The decision with both times and the reason."""
        if len(self.timings) < 2:
            return f"{self.chosen}: {self.note or 'not measured'} (the cost gate's rule decides)"
        parts = ", ".join(f"{c} {ms_text(t)}" for c, t in sorted(self.timings.items()))
        rule = (f"the cost gate would keep it on llvm: {self.region.gate}" if self.region.gate
                else "the cost gate would offload it")
        verdict = "agrees with" if self.chosen == self.default else "overrides"
        unable = "".join(f"; {k} cannot run it: {v}" for k, v in sorted(self.unable.items()))
        return f"{self.chosen}: {parts}{'; ' + self.note if self.note else ''}{unable} ({verdict} the rule; {rule})"


def ms_text(t: Timing) -> str:
    text = f"{t.median_s * 1e3:.3f} ms" if t.median_s >= 1e-3 else f"{t.median_s * 1e6:.1f} µs"
    return text + (" (one call)" if t.samples == 1 else "")


def timing_key(c: RegionCandidate, codegen: str, options: Mapping[str, Mapping[str, Any]]) -> str:
    """The timing-cache key: the region, its parameter shapes, and for the offloaded candidate the
    backend options (the precision) that change how it runs."""
    shapes = [static_shape(p) for p in c.func.params]
    dtypes = [tensor_dtype(p) for p in c.func.params]
    attrs = {"region": c.key}
    if codegen != HOST:
        attrs["options"] = json.dumps(options.get(codegen, {}), sort_keys=True, default=str)
    return signature("region", shapes, dtypes, attrs, codegen)


def measure_region(c: RegionCandidate, cache: TimingCache, options: Mapping[str, Mapping[str, Any]] | None = None,
                   repeat: int = 15, budget_s: float = 1.0,
                   step: Callable[[str], None] | None = None, backends: Sequence[str] = ()) -> CodegenDecision:
    """Time ``c`` offloaded, on llvm, and on each other backend of ``backends`` that can run all
    of it (:func:`~byoc_hetero.stages.retarget_region`), through ``cache``, and
    decide; ``options`` as the codegens are given them (``stages.codegen_options``);
    ``step(what)`` hears of each build and the timing (a whole ResNet-50 on llvm takes a while)."""
    step = step or (lambda _what: None)
    options = options or {}
    d = CodegenDecision(c)
    if c.untimeable:
        d.chosen, d.note = c.default, c.untimeable
        return d
    others, d.unable = _other_backends(c, backends)
    keys = {codegen: timing_key(c, codegen, options) for codegen in (c.target, HOST, *others)}
    found = {codegen: cache.get(k) for codegen, k in keys.items()}
    if all(found.values()):
        step("timings from the cache")
        d.timings, d.cached = dict(found), True
    else:
        args = random_inputs(c.func)
        regions = {c.target: harness_module(c.func, True), HOST: harness_module(c.func, False),
                   **{name: harness_module(f, True) for name, f in others.items()}}
        runners = {}
        for codegen, harness in regions.items():
            step(f"building it for {codegen}")
            runners[codegen] = runner(harness, args, options)
        step(f"timing {len(runners)} candidates")
        d.timings, d.note = time_all(runners, repeat, budget_s)
        for codegen, k in keys.items():
            cache.put(k, d.timings[codegen])
    d.chosen = winner(d.timings, c.default)
    best = min(d.timings, key=lambda k: d.timings[k].median_s)
    if best != d.chosen:
        gain = d.timings[d.chosen].median_s / d.timings[best].median_s - 1
        spread = max(t.spread for t in d.timings.values())
        d.note = f"{best} {gain:.0%} faster, within the spread ({spread:.0%}): a tie"
    return d


def winner(timings: Mapping[str, Timing], default: str) -> str:
    """The faster candidate; the default where the other is not faster by more than the larger
    spread of the two (a tie on a noisy machine keeps the rule's verdict)."""
    best = min(timings, key=lambda k: timings[k].median_s)
    if best == default:
        return best
    margin = max(t.spread for t in timings.values())
    return best if timings[best].median_s * (1 + margin) < timings[default].median_s else default


@dataclass
class CodegenPlan:
    """The codegen level's decisions and the map that applies them."""

    decisions: list[CodegenDecision] = field(default_factory=list)

    @property
    def region_codegen(self) -> dict[str, str]:
        """``bh.partition``'s ``region_codegen``: every measured region's codegen."""
        return {d.region.key: d.chosen for d in self.decisions}

    @property
    def changed(self) -> bool:
        """Whether any decision differs from the cost gate's rule."""
        return any(d.chosen != d.default for d in self.decisions)

    def lines(self) -> list[str]:
        """The report's lines for this level."""
        out = [f"  {d.region}: {d.why()}{' [cached]' if d.cached else ''}" for d in self.decisions]
        moved = sum(d.chosen != d.default for d in self.decisions)
        out.append(f"  codegen: {len(self.decisions)} distinct regions, {moved} placed otherwise than the cost "
                   "gate's rule")
        return out


def tune_codegen(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None, cache: TimingCache, *,
                 targets: Any = None, precision: str | None = None,
                 options: Mapping[str, Mapping[str, Any]] | None = None, repeat: int = 15,
                 progress: Progress | None = None) -> CodegenPlan:
    """Decide each candidate region's codegen from timings. Decisions can change how the rest
    merges (a region sent to llvm may split a neighbour); regions that appear only then are
    measured in a further round (at most three). The plan holds every measured region: the ones
    sent to llvm are no longer regions once the map applies, but the map must still name them."""
    from ..stages import codegen_options, target_names

    names = target_names(targets)
    given = codegen_options(names, precision, options)
    measured: dict[str, CodegenDecision] = {}
    for _ in range(3):
        applied = {k: d.chosen for k, d in measured.items()} or None
        current = candidate_regions(mod, params, targets=targets, precision=precision, options=options,
                                    region_codegen=applied)
        new = [c for c in current if c.key not in measured]
        for i, c in enumerate(new):
            def step(what: str, i: int = i, c: RegionCandidate = c) -> None:
                if progress is not None:
                    progress("codegen", i, len(new), f"{c}: {what}")

            measured[c.key] = measure_region(c, cache, given, repeat, step=step, backends=names)
        if progress is not None and new:
            progress("codegen", len(new), len(new), "done")
        if not new or all(d.chosen != HOST for d in measured.values()):
            break  # nothing new, or nothing sent to llvm: the regions stay as they were
    return CodegenPlan(list(measured.values()))


__all__ = ["CodegenDecision", "CodegenPlan", "GIVE_UP", "RegionCandidate", "TIMED_ON", "candidate_regions",
           "device_reason", "measure_region", "tune_codegen"]
