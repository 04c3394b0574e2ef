"""Backend ``tvm_cpu`` (alias ``tvm-cpu``): regions compiled by TVM itself, scheduled for this CPU.

Where the oneDNN backend hands a region to a vendor library, this one keeps TVM's own code but
schedules it (:mod:`.schedule`: TVM's ``s_tir.dlight`` CPU rules, then a parallel-outer /
vectorized-inner rule of ours), so that "TVM's codegen" is a fair candidate of the tuner's codegen
level (``bh.tune(..., target=["onednn", "tvm_cpu"])``) next to oneDNN and plain llvm. It is an
ordinary backend registered with :func:`byoc_hetero.register_target`; nothing in the tuner names it.

What it can run: any call of a Relax op TVM legalizes into ``call_tir`` (element-wise, injective,
reductions, softmax / norms, also matmul / conv, which its schedules do not make competitive)
whose tensors have static shapes, and whose constant arguments are scalars. A call with a larger
constant (a bound weight, a mask) stays on llvm: the region is compiled into a plain llvm module,
which has no place for constant data (the reason shows in ``bh.report``).

Options (:data:`OPTIONS`, ``bh.partition(..., options={"tvm_cpu": {...}})``): ``fast_math``, float32
``exp`` and ``softmax`` through a guarded polynomial exp that vectorizes (:mod:`.fast_math`), for every
region or per region (``{region key: true}``), declared tunable: ``bh.tune`` chooses it per region
where given a tolerance of at least :data:`.fast_math.TOLERANCE`; ``schedule``, ``dlight`` (the fixed
rules) or ``meta_schedule`` (TVM's MetaSchedule searches each region's schedule, on the route
:mod:`.meta_schedule` describes), declared tunable too: ``bh.tune`` given a tolerance of at least
:data:`.meta_schedule.TOLERANCE` times each region both ways and keeps the faster.
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from ..._relax import constant_value, static_shape
from ...errors import RuleError
from ...rules import Backend, Match, Option, Tunable, op_rule, register_target
from . import codegen, fast_math, meta_schedule, schedule
from .schedule import build, cpu_pipeline, schedule_cpu

TARGET = "tvm_cpu"
ALIASES = ("tvm-cpu",)

_SKIPPED_NAMESPACES = ("relax.ccl.", "relax.dist.", "relax.grad.", "relax.inspect.")


def _arg_reason(arg: relax.Expr) -> str | None:
    value = constant_value(arg)
    if value is not None:
        return None if value.ndim == 0 else (
            f"a constant argument of shape {list(value.shape)}: tvm_cpu compiles a region into a plain llvm "
            "module, which has no place for constant data (only scalars, which become immediates)")
    if isinstance(arg.ty, relax.TensorType) and static_shape(arg) is None:
        return "a tensor of symbolic shape: tvm_cpu schedules static shapes"
    if isinstance(arg, relax.Tuple):
        return next((r for r in map(_arg_reason, arg.fields) if r), None)
    return None


def _result_reason(ty: relax.Type) -> str | None:
    tys = ty.fields if isinstance(ty, relax.TupleType) else [ty]
    for t in tys:
        if not isinstance(t, relax.TensorType) or t.ndim < 0 or t.shape is None:
            return f"a result of type {t}: tvm_cpu makes tensors of known rank"
        if not all(isinstance(d, tvm.tirx.IntImm) for d in t.shape.values):
            return "a result of symbolic shape: tvm_cpu schedules static shapes"
    return None


_LEGALIZED: dict[int, str | None] = {}


def _legalizes(text: str, call_mod: tvm.IRModule) -> str | None:
    """None when the call's module legalizes into ``call_tir`` bindings only, else why not
    (remembered per structurally equal call)."""
    key = tvm_ffi.structural_hash(call_mod)
    if key not in _LEGALIZED:
        _LEGALIZED[key] = _legalize_reason(text, call_mod)
    return _LEGALIZED[key]


def _legalize_reason(text: str, call_mod: tvm.IRModule) -> str | None:
    try:
        mod = relax.transform.LegalizeOps()(call_mod)
    except Exception as err:  # noqa: BLE001 - a legalization that fails is a reason, not a crash
        return f"TVM cannot legalize {text} here: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
    call_tir = tvm.ir.Op.get("relax.call_tir")
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and not v.op.same_as(call_tir):
                return f"TVM legalizes {text} into {v.op}, not a TIR function"
    return None


def _as_parameters(arg: relax.Expr, params: list[relax.Var]) -> relax.Expr:
    """``arg`` with each variable (also inside a tuple, as concat takes them) replaced by a new
    parameter appended to ``params``: the call alone, as a function of its own."""
    if isinstance(arg, relax.Var):
        params.append(relax.Var(f"a{len(params)}", arg.ty))
        return params[-1]
    if isinstance(arg, relax.Tuple):
        return relax.Tuple([_as_parameters(f, params) for f in arg.fields])
    return arg


def check_call(match: Match) -> str | None:
    """The op rule of backend ``tvm_cpu``: None when TVM can compile the call as part of a region,
    else the reason (the call then stays on llvm)."""
    call = match.call
    reason = next((r for r in map(_arg_reason, call.args) if r), None) or _result_reason(call.ty)
    if reason:
        return reason
    params: list[relax.Var] = []
    args = [_as_parameters(a, params) for a in call.args]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(call.op, args, call.attrs))
        bb.emit_func_output(out)
    return _legalizes(str(call.op.name), bb.get())


def legalizable_ops() -> list[str]:
    """The Relax ops with a legalization (``FLegalize``), less the distributed / gradient /
    inspection namespaces: what :func:`check_call` is asked about."""
    out = []
    for name in tvm.ir.Op.list_op_names():
        if name.startswith("relax.") and not name.startswith(_SKIPPED_NAMESPACES):
            if tvm.ir.Op.get(name).get_attr("FLegalize") is not None:
                out.append(name)
    return sorted(out)


_FLAGS = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}


def _flag(value: Any) -> bool:
    """``value`` as a bool (a bool, or 1/0, true/false, on/off in any case); RuleError otherwise."""
    if isinstance(value, bool):
        return value
    word = str(value).lower() if isinstance(value, (str, int)) else None
    if word not in _FLAGS:
        raise RuleError(f"tvm_cpu option fast_math: expected true or false, got {value!r}")
    return _FLAGS[word]


OPTIONS = {
    "schedule": Option("schedule", "dlight: the fixed CPU rules (schedule.py); meta_schedule: TVM's "
                       f"MetaSchedule searches the region's schedule ({meta_schedule.TRIALS} candidates, "
                       f"{meta_schedule.SECONDS:g} s at most; meta_schedule.py), its record kept in the tune's timing "
                       "cache; per region: JSON {region key: schedule}", "dlight", meta_schedule.check_schedule,
                       Tunable(meta_schedule.SCHEDULES, meta_schedule.TOLERANCE)),
    "fast_math": Option("fast_math", "float32 exp and softmax through a guarded polynomial exp that vectorizes "
                        f"(fast_math.py: relative error <= {fast_math.TOLERANCE:g} against float64, NaN and inf "
                        "kept); else exp is one scalar expf call per element; per region: JSON {region key: "
                        "true | false}", False, _flag, Tunable((False, True), fast_math.TOLERANCE)),
}
"""The options of backend ``tvm_cpu`` (docs/backends.md lists them; tests/test_tvm_cpu.py compares)."""


def register() -> Backend:
    """Register backend ``tvm_cpu``, its options and its op rules (idempotent)."""
    backend = register_target(TARGET, codegen=codegen.relax_ext_codegen, aliases=ALIASES, options=OPTIONS)
    for op in legalizable_ops():
        op_rule(op, TARGET)(check_call)
    return backend


BACKEND = register()
"""The ``tvm_cpu`` backend object."""

__all__ = ["ALIASES", "BACKEND", "OPTIONS", "TARGET", "build", "check_call", "codegen", "cpu_pipeline", "fast_math",
           "legalizable_ops", "meta_schedule", "register", "schedule", "schedule_cpu"]
