"""Standalone repro: with apache-tvm-ffi 0.1.15, TVM 0.27's wheel ends the process serializing any TVM object.

Why MetaSchedule's own entry points crash here and tvm_cpu's ``schedule="meta_schedule"`` takes a route around them
(``byoc_hetero/backends/tvm_cpu/meta_schedule.py``, docs/backends.md, bench/TVM_CPU.md). Nothing of byoc_hetero is
imported. Usage::

    python3 tools/ms_crash_repro.py json            # tvm.ir.save_json(IntImm): SIGSEGV (status 139)
    python3 tools/ms_crash_repro.py [ARGS] [--init] # MetaSchedule's tune context (session 12's repro)

``ARGS`` picks which arguments of the FFI constructor ``s_tir.meta_schedule.TuneContext`` get a value (the others
None): ``m`` the module, ``t`` the target, ``s`` the space generator (post-order-apply, the target's rules, postprocs
and mutators), ``r`` the search strategy (replay-trace), ``l`` the logging function; default ``mtsrl``. ``--init``
then calls ``TuneContextInitialize``, which crashes in the mutator ``MutateParallel``.

Root cause (session 15): the wheel apache-tvm 0.27.0.post1 (``Requires-Dist: apache-tvm-ffi>=0.1.14.post0``) was
built against tvm-ffi 0.1.14's C++ headers: ``libtvm_compiler.so`` carries ``tvm::ffi::details::`` symbols, the
namespace 0.1.15 renamed ``detail``. tvm-ffi's C API is the same in 0.1.14.post1 and 0.1.15.post2 (``c_api.h`` differs
in the version number only), but its C++ header ABI is not, and ``tvm::ffi::ToJSONGraph`` (libtvm_ffi) on a TVM IR
object calls back into libtvm_compiler code compiled against the old headers, which calls through a function table
at offset 0x18 of the object it is handed (libtvm_compiler.so+0x2f31b8e: ``mov 0x18(%rbx),%rax; call *(%rax)``);
the process ends with SIGSEGV: a jump to an unmapped address (session 12: 0x409c15) or, in the run of session 15,
the decrement of a reference count through a "pointer" 0x100000001 (libtvm_ffi.so+0x3b6c7, an exception landing
pad). Measured on this machine (CPython 3.11.7, Linux x86_64), each a fresh process:

=========================================  ==================  ==================  ==================
call                                       tvm-ffi 0.1.15.post2  0.1.15.post1        0.1.14.post1 (venv)
=========================================  ==================  ==================  ==================
``python3 tools/ms_crash_repro.py json``   SIGSEGV             SIGSEGV             serializes
``... mtsrl --init`` (MetaSchedule)        SIGSEGV             (not run)           initializes
=========================================  ==================  ==================  ==================

(``tvm_ffi.serialization.to_json_graph_str`` of tvm-ffi's own containers works with 0.1.15.post2: the crash needs a
TVM object.) MetaSchedule calls ``ToJSONGraph`` in the mutators MutateParallel / MutateComputeLocation /
MutateThreadBinding, in ``DeepCopyIRModule`` (strategies replay-trace and evolutionary, the XGBoost cost model's
features), in the JSON database, and by pickling in ``LocalBuilder`` / ``LocalRunner``. To try another tvm-ffi
without touching the system install: ``python3 -m venv --system-site-packages /tmp/v && /tmp/v/bin/pip install
--no-deps apache-tvm-ffi==0.1.14.post1 && /tmp/v/bin/python tools/ms_crash_repro.py json``. The import of
``tvm.s_tir.tensor_intrin`` (``ms.TuneContext`` does it first) parses a few hundred TVMScript intrinsics and is
skipped here: it is not needed to reach the crash.
"""

from __future__ import annotations

import sys
import time


def serialize() -> None:
    """``tvm.ir.save_json`` of one ``IntImm``: tvm-ffi's ``ToJSONGraph`` on the smallest TVM IR object."""
    import tvm

    print(f"tvm {tvm.__version__}; saving an IntImm as JSON", flush=True)
    text = tvm.ir.save_json(tvm.tirx.IntImm("int32", 3))
    print(f"serialized ({len(text)} characters): no crash with this tvm-ffi", flush=True)


def main(which: str = "mtsrl") -> None:
    """MetaSchedule's tune context made through the FFI constructor with the arguments ``which`` names."""
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
    if sys.argv[1:2] == ["json"]:
        serialize()
    else:
        main(*[a for a in sys.argv[1:2] if a != "--init"])
