"""Standalone repro: TVM 0.27's MetaSchedule ends the process making a tune context (segmentation fault).

Why the tvm_cpu backend has no MetaSchedule schedule (docs/backends.md, bench/TVM_CPU.md). Nothing of byoc_hetero is
imported. Run ``python3 tools/ms_crash_repro.py [ARGS] [--init]`` (no psutil needed: the thread count is given, where
``ms.tune_tir`` asks psutil for it). ``ARGS`` picks which arguments of
the FFI constructor ``s_tir.meta_schedule.TuneContext`` get a value (the others None): ``m`` the module, ``t`` the
target, ``s`` the space generator (post-order-apply), ``r`` the search strategy (replay-trace), ``l`` the logging
function; default ``mtsrl``, what ``ms.TuneContext(...)`` passes and what ``ms.tune_tir`` makes first.

Seen on the wheel apache-tvm 0.27.0.post1 with apache-tvm-ffi 0.1.15.post2, CPython 3.11.7, Linux x86_64 (session
12): with ``tvm.s_tir.tensor_intrin`` imported (``ms.TuneContext`` imports it) the constructor crashes; without it, as
here, it constructs and ``TuneContextInitialize`` (``--init``) crashes with SIGSEGV (status 139) in the space's
default mutator ``MutateParallel``; bench/TVM_CPU.md lists every step tried.
gdb: the call from tvm_ffi's Cython ``Function.__call__`` jumps to an unmapped address (0x409c15), a bad function
pointer rather than a bad argument value; TVM's own crash handler names the nearest exported symbol,
``tvm::ffi::ToJSONGraph``, which is why session 11 read it as a JSON-database crash. The import of
``tvm.s_tir.tensor_intrin`` (which ``ms.TuneContext`` does first) parses a few hundred TVMScript intrinsics and took
9+ minutes on the loaded 2-core machine; it is not needed to reach the constructor and is skipped here.
"""

from __future__ import annotations

import sys
import time


def main(which: str = "mtsrl") -> None:
    start = time.time()
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.meta_schedule.logging import get_logger, get_logging_func

    a = te.placeholder((64, 64), name="a")
    func = te.create_prim_func([a, te.compute((64, 64), lambda i, j: te.exp(a[i, j]), name="b")])
    args = [None, None, None, None, "main", 1, 1, None]  # mod, target, space, strategy, name, threads, seed, logger
    if "m" in which:
        args[0] = tvm.IRModule({"main": func})
    if "t" in which:
        args[1] = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    if "s" in which:
        args[2] = ms.space_generator.SpaceGenerator.create("post-order-apply")
    if "r" in which:
        args[3] = ms.search_strategy.SearchStrategy.create("replay-trace")
    if "l" in which:
        args[7] = get_logging_func(get_logger("repro"))
    print(f"tvm {tvm.__version__}; imported in {time.time() - start:.0f} s; constructing with {which!r}", flush=True)
    context = ms.TuneContext.__new__(ms.TuneContext)
    context.__init_handle_by_constructor__(_ffi_api.TuneContext, *args)
    print("constructed", flush=True)
    if "--init" in sys.argv:
        _ffi_api.TuneContextInitialize(context)
        print("initialized: no crash with these arguments", flush=True)


if __name__ == "__main__":
    main(*[a for a in sys.argv[1:2] if a != "--init"])
