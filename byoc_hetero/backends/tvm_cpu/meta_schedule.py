"""TVM's MetaSchedule for backend ``tvm_cpu`` (option ``schedule="meta_schedule"``), on a route this wheel survives.

Issue 38 asks for TVM's MetaSchedule beside the fixed CPU rules of :mod:`.schedule`: each region's PrimFunc tuned
into a database kept beside the tune's timing cache, the schedule chosen per region by ``bh.tune``'s option level.

Why MetaSchedule's own entry points crash on this wheel (apache-tvm 0.27.0.post1 with apache-tvm-ffi 0.1.15.post2):
the wheel's ``libtvm_compiler.so`` was built against tvm-ffi 0.1.14's C++ headers (its inline code still uses the
``tvm::ffi::details`` namespace that 0.1.15 renamed ``detail``; the wheel asks only ``apache-tvm-ffi>=0.1.14.post0``)
while this project runs apache-tvm-ffi 0.1.15.post2. The C API is unchanged between them (``c_api.h`` differs in its
version number only), but tvm-ffi's reflection-based object-graph serializer ``tvm::ffi::ToJSONGraph``
(``tvm.ir.save_json``, pickling a TVM object) crashes on any TVM IR object, an ``IntImm`` included: libtvm_ffi 0.1.15
calls back into a libtvm_compiler routine compiled against the old headers, which calls through a function table at
offset 0x18 of the object it is handed, and the process ends with SIGSEGV (a jump to an unmapped address, or an object
pointer read from a reference count). The same wheel with apache-tvm-ffi 0.1.14.post1 (a throwaway venv) serializes
every object tried and initializes MetaSchedule's default tune context. MetaSchedule calls ``ToJSONGraph`` in the
mutators ``MutateParallel`` / ``MutateComputeLocation`` / ``MutateThreadBinding`` (their
``InitializeWithTuneContext``), in ``DeepCopyIRModule`` (the ``replay-trace`` and ``evolutionary`` strategies, the
per-store feature extractor of the XGBoost cost model), in the JSON database (``Workload::AsJSON``) and, through
pickling, in ``LocalBuilder`` / ``LocalRunner``: ``ms.tune_tir`` reaches one of them whatever it is given
(``tools/ms_crash_repro.py``, bench/TVM_CPU.md).

The route (:func:`search`) reaches none of the crashing calls: the tune context made through the FFI constructor (not
``ms.TuneContext``, which imports ``tvm.s_tir.tensor_intrin``), the post-order-apply space with the generic ``llvm``
schedule rules and postprocessors but no mutators, the ``replay-func`` search strategy (a fresh sample of the space
per trial: no copy of the module), MetaSchedule's ``MemoryDatabase``, and a builder and runner of this module's own
that compile and time each candidate in this process (no subprocess, nothing pickled). Each region's best trace is
kept as JSON (:func:`trace_json`) in the timing cache of the ``bh.tune`` that runs (its ``values``, keyed by the
PrimFunc's text and the target: :func:`workload_key`), else in this process's memory, so that the build the tuner
applies replays the schedule it measured instead of searching again.

Budget: :data:`TRIALS` candidates per region, and no candidate built or timed once :data:`SECONDS` are spent on the
region. Never slower than the fixed rules: ``schedule`` is tunable (``Tunable(SCHEDULES, TOLERANCE)``), so ``bh.tune``
(given a tolerance of at least :data:`TOLERANCE`) times each region both ways and keeps MetaSchedule's schedule only
where it is measured faster and its outputs stay within the tolerance (a MetaSchedule schedule may sum a reduction in
another order).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import tirx
from tvm.target import Target

from ...errors import RuleError

SCHEDULES = ("dlight", "meta_schedule")
"""The values of the option ``schedule``: the fixed rules of :mod:`.schedule`, or MetaSchedule (:func:`search`)."""

TRIALS = 16
"""Candidates MetaSchedule builds and times per region (at most)."""

SECONDS = 30.0
"""Wall time per region after which no further candidate is built or timed (the search ends with what it timed)."""

TOLERANCE = 1e-5
"""Relative error against the fixed rules' outputs that a MetaSchedule schedule may show (a reduction summed in
another order: ``rfactor``, tiling); ``bh.tune`` measures it and keeps the schedule only within its tolerance."""

KEY_KIND = "tvm_cpu.meta_schedule"
"""The kind of the timing cache's keys under which the records are kept (:func:`workload_key`)."""

_LOG = logging.getLogger("byoc_hetero.tvm_cpu.meta_schedule")
_LOG.setLevel(logging.WARNING)


_NEEDED = ("TuneContext", "TuneContextInitialize", "SpaceGeneratorPostOrderApply", "BuilderPyBuilder",
           "RunnerPyRunner")


def unavailable() -> str | None:
    """Why this TVM cannot run the route of this module (its MetaSchedule package or one of the FFI functions
    the route calls missing), None where it can."""
    try:
        from tvm.s_tir.meta_schedule import _ffi_api
    except ImportError as err:
        return f"this TVM has no MetaSchedule package (tvm.s_tir.meta_schedule: {err})"
    missing = [name for name in _NEEDED if not hasattr(_ffi_api, name)]
    return f"this TVM's MetaSchedule lacks the FFI functions {', '.join(missing)}" if missing else None


def check_schedule(value: object) -> str:
    """The option ``schedule``: ``"dlight"`` (the fixed rules of :mod:`.schedule`) or ``"meta_schedule"``
    (:func:`schedule_func`; a :class:`~byoc_hetero.RuleError` with the reason where :func:`unavailable` gives one);
    anything else is a :class:`~byoc_hetero.RuleError` naming the values."""
    if value not in SCHEDULES:
        raise RuleError(f"tvm_cpu option schedule: expected one of {', '.join(SCHEDULES)}, got {value!r}")
    why = unavailable() if value == "meta_schedule" else None
    if why:
        raise RuleError(f"tvm_cpu option schedule='meta_schedule': unavailable: {why}")
    return str(value)


@dataclass(frozen=True)
class Record:
    """The best schedule MetaSchedule found for one workload: its trace (JSON), median time, and how many
    candidates were timed."""

    trace: list
    median_s: float
    trials: int

    def to_json(self) -> dict[str, Any]:
        return {"trace": self.trace, "median_s": self.median_s, "trials": self.trials}

    @classmethod
    def from_json(cls, obj: Any) -> "Record | None":
        """The record stored as ``obj``, or None where it is not one (a corrupt entry is searched again)."""
        try:
            return cls(list(obj["trace"]), float(obj["median_s"]), int(obj["trials"]))
        except (KeyError, TypeError, ValueError):
            return None


_MEMORY: dict[str, Record] = {}
_LOCK = threading.Lock()


def workload_key(func: tirx.PrimFunc, target: Target) -> str:
    """The key of ``func`` tuned for ``target``: a SHA-256 of its TVMScript text, the target and TVM's version
    (equal PrimFuncs of two models share it)."""
    text = func.with_attr("global_symbol", "main").script()
    digest = hashlib.sha256(f"{text}\n{target}\n{tvm.__version__}".encode()).hexdigest()
    return json.dumps({"kind": KEY_KIND, "workload": digest}, sort_keys=True)


def stored() -> dict[str, Record]:
    """The records the searches of this process found, by :func:`workload_key` (a copy)."""
    return dict(_MEMORY)


def forget() -> None:
    """Drop this process's records (a tune's timing cache keeps its own)."""
    _MEMORY.clear()


def _stored(key: str) -> Record | None:
    from ...tune.cache import active_cache  # the tuner's cache, where a tune runs (lazy: tune imports backends)

    cache = active_cache()
    if cache is not None:
        found = Record.from_json(cache.get_value(key))
        if found is not None:
            return found
    return _MEMORY.get(key)


def _store(key: str, record: Record) -> None:
    from ...tune.cache import active_cache

    _MEMORY[key] = record
    cache = active_cache()
    if cache is not None:
        cache.put_value(key, record.to_json())


def _plain(value: Any) -> Any:
    """A trace's JSON object (FFI arrays, strings, integer and float immediates) as plain Python."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tirx.IntImm):
        return int(value)
    if isinstance(value, tirx.FloatImm):
        return float(value)
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value]


def trace_json(trace: Any) -> list:
    """A MetaSchedule trace as plain JSON (``Trace.as_json``, its FFI containers made Python lists)."""
    return _plain(trace.as_json(remove_postproc=False))


def apply_record(func: tirx.PrimFunc, record: Record) -> tirx.PrimFunc:
    """``func`` scheduled by replaying ``record``'s trace."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)  # not func.with_attr(...): TVM 0.27 then rewrites func itself in place
    s_tir.schedule.Trace.apply_json_to_schedule(record.trace, sch)
    return sch.mod["main"]


def tuning_target(target: Target) -> Target:
    """``target`` with the ``num-cores`` MetaSchedule requires (this process's CPUs where it has none)."""
    config = dict(target.export())
    if not config.get("num-cores"):
        config["num-cores"] = os.cpu_count() or 1
    return Target(config)


def _builder(deadline: float) -> tuple[Any, dict[str, Any]]:
    """A MetaSchedule builder compiling each candidate in this process (``tirx.build``), keeping the runtime
    modules by a made-up artifact path; past ``deadline`` (``time.monotonic()``) it refuses further candidates."""
    from tvm.s_tir.meta_schedule.builder.builder import BuilderResult, _PyBuilder

    artifacts: dict[str, Any] = {}
    seconds = deadline - time.monotonic()

    def build(inputs: Sequence[Any]) -> list[Any]:
        out = []
        for inp in inputs:
            if time.monotonic() > deadline:
                out.append(BuilderResult(None, f"byoc_hetero: the search's {seconds:g} s are spent"))
                continue
            try:
                path = f"memory:{len(artifacts)}"
                main = inp.mod["main"].with_attr("global_symbol", "main")  # the name the runner calls
                artifacts[path] = tvm.tirx.build(tvm.IRModule({"main": main}), target=inp.target)
                out.append(BuilderResult(path, None))
            except Exception as err:  # noqa: BLE001 - a candidate that does not compile is a failed trial
                out.append(BuilderResult(None, f"{type(err).__name__}: {str(err)[:2000]}"))
        return out

    return _PyBuilder(build), artifacts


def _time_candidate(artifact: Any, args_info: Sequence[Any], rng: np.random.Generator) -> Any:
    from tvm.s_tir.meta_schedule.runner.runner import RunnerResult

    dev = tvm.cpu()
    try:
        args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in info.shape]).astype(str(info.dtype)), dev)
                for info in args_info]
        timer = artifact.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=5)
        return RunnerResult([float(s) for s in timer(*args).results], None)
    except Exception as err:  # noqa: BLE001 - a candidate that fails to run is a failed trial
        return RunnerResult(None, f"{type(err).__name__}: {str(err)[:2000]}")


def _runner(artifacts: dict[str, Any], deadline: float) -> Any:
    """A MetaSchedule runner timing each built candidate in this process on random inputs; past ``deadline``
    (``time.monotonic()``) it times no further candidate (a slow candidate takes seconds per call)."""
    from tvm.s_tir.meta_schedule.runner.runner import RunnerFuture, RunnerResult, _PyRunner

    rng = np.random.default_rng(0)

    def run(inputs: Sequence[Any]) -> list[Any]:
        futures = []
        for inp in inputs:
            artifact = artifacts.pop(str(inp.artifact_path))
            result = (_time_candidate(artifact, inp.args_info, rng) if time.monotonic() <= deadline
                      else RunnerResult(None, "byoc_hetero: the search's time is spent"))
            futures.append(RunnerFuture(lambda: True, lambda result=result: result))
        return futures

    return _PyRunner(run)


UNROLL_STEPS = (0, 16, 64)
"""The explicit-unroll limits the search samples (TVM's llvm default adds 512, whose candidates can take LLVM
minutes to compile: a softmax search ran past its time budget in one such build)."""


def _rules() -> list[Any]:
    """TVM's generic llvm schedule rules, with :data:`UNROLL_STEPS` as ParallelizeVectorizeUnroll's limits."""
    from tvm.s_tir.meta_schedule import schedule_rule as rules

    out = []
    for rule in rules.ScheduleRule.create("llvm"):
        if isinstance(rule, rules.ParallelizeVectorizeUnroll):
            rule = rules.ParallelizeVectorizeUnroll(max_jobs_per_core=int(rule.max_jobs_per_core),
                                                    max_vectorize_extent=int(rule.max_vectorize_extent),
                                                    unroll_max_steps=list(UNROLL_STEPS), unroll_explicit=True)
        out.append(rule)
    return out


def _context(mod: tvm.IRModule, target: Target, seed: int) -> Any:
    """MetaSchedule's tune context for ``mod``: made through the FFI constructor (``ms.TuneContext`` would import
    ``tvm.s_tir.tensor_intrin``), post-order-apply with the generic llvm rules and postprocessors (the target's own
    would add the VNNI tensorization rule, whose intrinsics need that import) and no mutators,
    the replay-func strategy, one thread for the search itself (the candidates run on TVM's thread pool)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.logging import get_logging_func

    space = ms.space_generator.PostOrderApply(sch_rules=_rules(), postprocs="llvm", mutator_probs={})
    strategy = ms.search_strategy.SearchStrategy.create("replay-func")
    context = ms.TuneContext.__new__(ms.TuneContext)
    context.__init_handle_by_constructor__(_ffi_api.TuneContext, mod, target, space, strategy, "main", 1, seed,
                                           get_logging_func(_LOG))
    _ffi_api.TuneContextInitialize(context)
    return context


def search(func: tirx.PrimFunc, target: Target, trials: int | None = None, seconds: float | None = None,
           seed: int = 1) -> Record | None:
    """MetaSchedule's search for ``func`` on ``target`` (at most ``trials`` candidates, none built after
    ``seconds`` nor past the running ``bh.tune``'s ``budget_s``; :data:`TRIALS` and :data:`SECONDS` where None):
    the fastest candidate's record, or None where no candidate built and ran (or no time was left)."""
    from tvm.s_tir import meta_schedule as ms

    from ...tune.cache import active_deadline  # lazy: tune imports backends

    trials, seconds = trials or TRIALS, SECONDS if seconds is None else seconds
    target = tuning_target(target)
    mod = tvm.IRModule({"main": func})  # func as it is: a copy by with_attr would let the search rewrite func in place
    deadline = time.monotonic() + seconds
    tune_deadline = active_deadline()  # a bh.tune's budget_s: none of the search past it
    if tune_deadline is not None:
        deadline = min(deadline, tune_deadline)
    if deadline <= time.monotonic():
        return None
    builder, artifacts = _builder(deadline)
    database = ms.database.MemoryDatabase()
    with _LOCK:  # one search at a time: MetaSchedule's task scheduler is not reentrant
        ms.tune_tasks(tasks=[_context(mod, target, seed)], task_weights=[1.0], work_dir=os.devnull,
                      max_trials_global=trials, num_trials_per_iter=min(trials, 4), builder=builder,
                      runner=_runner(artifacts, deadline), database=database, cost_model=ms.cost_model.RandomModel(),
                      measure_callbacks=[ms.measure_callback.AddToDatabase()], task_scheduler="round-robin")
    records = database.get_top_k(database.commit_workload(mod), 1)
    if not records:
        return None
    secs = [float(s) for s in records[0].run_secs]
    timed = sum(1 for r in database.get_all_tuning_records() if r.run_secs)
    return Record(trace_json(records[0].trace), float(np.median(secs)) if secs else math.inf, timed)


def schedule_func(func: tirx.PrimFunc, target: Target, trials: int | None = None,
                  seconds: float | None = None) -> tirx.PrimFunc | None:
    """``func`` with the schedule MetaSchedule found for ``target`` (the stored record where there is one, else
    :func:`search`, then stored), or None where the search found none."""
    key = workload_key(func, target)
    record = _stored(key)
    if record is None:
        record = search(func, target, trials, seconds)
        if record is None:
            return None
        _store(key, record)
    return apply_record(func, record)


__all__ = ["KEY_KIND", "Record", "SCHEDULES", "SECONDS", "TOLERANCE", "TRIALS", "UNROLL_STEPS", "apply_record",
           "check_schedule", "forget", "schedule_func", "search", "stored", "trace_json", "tuning_target", "unavailable", "workload_key"]
