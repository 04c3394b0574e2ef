"""CPU schedules for TVM's own code: parallel outer loops, vectorized inner loops.

TVM 0.27's ``relax.build`` for llvm compiles every PrimFunc as legalized: one thread, scalar
loops. :func:`schedule_cpu` gives each PrimFunc of a module a schedule, trying in order

1. the CPU rules TVM ships (``tvm.s_tir.dlight.cpu``: ``GEMV``, and ``Reduction`` for softmax /
   layer norm / RMS norm: parallel rows, vectorized element-wise parts);
2. :class:`ParallelVectorize`, this module's rule for the rest (element-wise chains, injective
   ops such as transpose / reshape / strided_slice / take / where, reductions): blocks inlined
   where TIR allows, then for each remaining block the spatial loops fused, the innermost lanes
   vectorized where they divide the extent, and the outer part parallel where the work is large
   enough to pay for the thread launch.

A PrimFunc no rule takes (an opaque ``te.extern`` body, a ``call_packed``) keeps its plain loops.
A rule that raises (a schedule primitive refusing) counts as not applying. :func:`cpu_pipeline`
is TVM's CPU pipeline with the schedules applied right after legalization and fusion, for the
code that stays on llvm (``bh.build``); the ``tvm_cpu`` backend's codegen uses the same rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import dlight
from tvm.target import Target
from tvm.target.codegen import llvm_get_system_cpu, llvm_get_vector_width

MIN_PARALLEL_WORK = 1 << 14
"""A block whose loops run fewer iterations than this (spatial x reduction) stays on one thread:
TVM's parallel launch costs a few microseconds, what ~16k simple iterations take."""

SCHEDULED_ATTR = "tirx.is_scheduled"
"""What dlight's ApplyDefaultSchedule marks a scheduled PrimFunc with (a second pass skips it)."""


def host_target() -> Target:
    """llvm for this machine's CPU (its vector width: AVX-512 where the CPU has it)."""
    return Target({"kind": "llvm", "mcpu": llvm_get_system_cpu()})


def _lanes(target: Target, dtype_bits: int) -> int:
    width = llvm_get_vector_width(target)
    return max((width if width > 0 else 128) // max(dtype_bits, 8), 2)


def _extent(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


class ParallelVectorize(dlight.ScheduleRule):
    """Every block: its outer spatial loops fused and parallel, its innermost axis vectorized.

    Element-wise and injective blocks are first inlined into their consumers (or producers)
    where TIR allows, so a chain becomes one loop nest. A reduction block keeps its reduction
    loops inside the parallel spatial loop (not vectorized: the order of a float sum stays that
    of the plain code). The vector lanes are the largest power of two up to the target's vector
    width that divides the innermost extent (no tail, so no predicate in the vector loop); the
    parallel loop fuses as few outer loops as give 64 chunks (fewer index divisions per element)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        infos = dlight.normalize_prim_func(sch)
        if infos is None:
            return None
        infos = dlight.try_inline(sch, infos)
        changed = False
        for info in infos:
            changed |= self._block(sch, info, target)
        return sch if changed else None

    @staticmethod
    def _block(sch: s_tir.Schedule, info: dlight.SBlockInfo, target: Target) -> bool:
        kinds = info.dom_kind()
        loops = sch.get_loops(info.block_rv)
        if len(loops) != len(kinds) or "O" in kinds:
            return False
        s_loops = [lp for lp, k in zip(loops, kinds) if k == "S"]
        r_loops = [lp for lp, k in zip(loops, kinds) if k == "R"]
        extents = [_extent(sch, lp) for lp in loops]
        if not s_loops or None in extents:
            return False
        sch.reorder(*s_loops, *r_loops)
        vectorized = False
        if not r_loops:  # the innermost axis in vectors; the others stay whole loops (no div/mod)
            lanes = _lanes(target, sch.get(info.block_rv).writes[0].source.dtype.bits)
            inner = _extent(sch, s_loops[-1])
            while lanes > 1 and inner % lanes:
                lanes //= 2
            if lanes > 1:
                vectorized = True
                if inner > lanes:
                    outer, vec = sch.split(s_loops[-1], factors=[None, lanes])
                    s_loops[-1:] = [outer]
                else:
                    vec = s_loops.pop()
                sch.vectorize(vec)
        work = reduce(lambda a, b: a * b, extents, 1)
        if work < MIN_PARALLEL_WORK or not s_loops:
            return vectorized
        # parallel over the outer spatial loops, enough of them for a few chunks per thread
        take, chunks = 0, 1
        while take < len(s_loops) and chunks < 64:
            chunks *= _extent(sch, s_loops[take])
            take += 1
        if chunks < 2:
            return vectorized
        sch.parallel(sch.fuse(*s_loops[:take]) if take > 1 else s_loops[0])
        return True


RULES: tuple[dlight.ScheduleRule, ...] = (dlight.cpu.GEMV(), dlight.cpu.Reduction(), ParallelVectorize())
"""The rules :func:`schedule_cpu` tries, first that applies wins."""


def schedule_func(func: tirx.PrimFunc, target: Target,
                  rules: Sequence[dlight.ScheduleRule] = RULES) -> tirx.PrimFunc | None:
    """``func`` scheduled by the first rule of ``rules`` that applies, or None if none does."""
    for rule in rules:
        try:
            sch = rule.apply(func, target, False)
        except Exception:  # noqa: BLE001 - a primitive refused this function (ScheduleError, TVM's
            continue  # InternalError, ...): the next rule may take it
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        if sch is not None:
            return sch.mod["main"].with_attr(SCHEDULED_ATTR, True)
    return None


def schedule_cpu(target: Target | str | None = None) -> tvm.transform.Pass:
    """A module pass: every unscheduled PrimFunc scheduled by :data:`RULES` for ``target`` (the
    one of the enclosing ``with target:`` when None; :func:`host_target` when there is none)."""

    @tvm.transform.module_pass(opt_level=0, name="ScheduleCPU")
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        tgt = Target(target) if isinstance(target, str) else target
        tgt = tgt or Target.current(allow_none=True) or host_target()
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and not bool(func.attrs.get(SCHEDULED_ATTR, False)):
                done = schedule_func(func, tgt)
                if done is not None:
                    updates[gv] = done
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return run


def cpu_pipeline(target: Target | str | None = None) -> tvm.transform.Pass:
    """TVM's default CPU pipeline (``relax.backend.cpu_generic``) with :func:`schedule_cpu` after
    legalization and fusion: what ``relax.build(mod, target, relax_pipeline=cpu_pipeline(target))``
    takes so that the ops left to TVM run parallel and vectorized."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

    tgt = Target(target) if isinstance(target, str) else target or host_target()

    @tvm.transform.module_pass(opt_level=0, name="ByocHeteroCPUPipeline")
    def run(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with tgt:
            seq = tvm.transform.Sequential(
                cpu_generic.library_dispatch_passes(tgt) + cpu_generic.legalize_passes(tgt)
                + [schedule_cpu(tgt)]
                + cpu_generic.dataflow_lower_passes(tgt) + cpu_generic.finalize_passes(tgt))
            return seq(mod)

    return run


def build(mod: tvm.IRModule, target: Target | str | None = None, *, schedule: bool = True
          ) -> relax.VMExecutable:
    """``relax.build`` of a partitioned module for this CPU: the offloaded regions link in as
    external modules, and what stays on llvm gets :func:`schedule_cpu`'s parallel, vectorized
    schedules (``schedule=False``: TVM's plain single-threaded code, as stock ``relax.build``)."""
    tgt = Target(target) if isinstance(target, str) else target or host_target()
    if not schedule:
        return relax.build(mod, target=tgt)
    return relax.build(mod, target=tgt, relax_pipeline=cpu_pipeline(tgt))


__all__ = ["MIN_PARALLEL_WORK", "ParallelVectorize", "RULES", "build", "cpu_pipeline", "host_target",
           "schedule_cpu", "schedule_func"]
