"""Why backend ``tvm_cpu`` has no MetaSchedule schedule (its option ``schedule="meta_schedule"``).

Issue 38 asks for TVM's MetaSchedule beside the fixed CPU rules of :mod:`.schedule`: each region's PrimFunc tuned
into a database kept beside the tune's timing cache. On the TVM wheel this project runs (apache-tvm 0.27.0.post1,
apache-tvm-ffi 0.1.15.post2) MetaSchedule cannot tune anything: making its tune context ends the process with a
segmentation fault (``tools/ms_crash_repro.py``, read with gdb in session 12):

- ``ms.tune_tir`` first needs ``psutil`` (not a dependency of this project) for its core count;
- with it, ``ms.TuneContext(...)`` crashes. Its ``__init__`` imports ``tvm.s_tir.tensor_intrin``; after that import
  the FFI constructor ``s_tir.meta_schedule.TuneContext`` itself crashes. Without that import (the object made
  through the FFI constructor) the constructor returns, and ``TuneContextInitialize`` crashes instead with the
  default post-order-apply space: its mutator ``MutateParallel`` crashes initializing (alone too); without
  mutators the context initializes, and ``ms.tune_tasks`` crashes before its first record, with the JSON database
  and ``MemoryDatabase`` alike, and with no logging callback (bench/TVM_CPU.md has each step);
- gdb: the call from tvm_ffi's Cython ``Function.__call__`` jumps to an unmapped address (a bad function
  pointer, not a bad argument); TVM's crash handler prints the nearest exported symbol,
  ``tvm::ffi::ToJSONGraph``, which session 11 read as a JSON-database crash.

A crash cannot be caught in-process, and probing in a child process costs a TVM import (tens of seconds) per
process, so the backend does not try: the option's check raises :class:`~byoc_hetero.RuleError` with
:data:`REASON`, and the fixed rules stay the only schedule.
"""

from __future__ import annotations

from ...errors import RuleError

REASON = ("unavailable: MetaSchedule of the TVM wheel this project runs (apache-tvm 0.27.0.post1, apache-tvm-ffi "
          "0.1.15.post2) ends the process with a segmentation fault making its tune context (the FFI call "
          "TuneContextInitialize, or the TuneContext constructor once tvm.s_tir.tensor_intrin is imported), before "
          "any database or trial; repro: tools/ms_crash_repro.py")
"""What ``schedule="meta_schedule"`` raises (docs/backends.md, bench/TVM_CPU.md)."""

SCHEDULES = ("dlight", "meta_schedule")
"""The values of the option ``schedule``: the fixed rules, or MetaSchedule (unavailable: :data:`REASON`)."""


def check_schedule(value: object) -> str:
    """The option ``schedule``: ``"dlight"`` (the fixed rules of :mod:`.schedule`); ``"meta_schedule"`` raises
    :class:`~byoc_hetero.RuleError` with :data:`REASON`; anything else names the values."""
    if value == "meta_schedule":
        raise RuleError(f"tvm_cpu option schedule='meta_schedule': {REASON}")
    if value not in SCHEDULES:
        raise RuleError(f"tvm_cpu option schedule: expected one of {', '.join(SCHEDULES)}, got {value!r}")
    return str(value)


__all__ = ["REASON", "SCHEDULES", "check_schedule"]
