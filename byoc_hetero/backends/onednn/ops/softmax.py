"""softmax along any axis: a ``softmax`` node; torch's safe softmax chain: a ``softmax`` node with
``safe`` 1.

* ``softmax(x, axis)`` -> ``softmax`` (rule ``softmax``);
* torch's ``_safe_softmax(x, axis)`` (what ``torch.export`` writes for ``scaled_dot_product_attention``
  with a mask, e.g. transformers' BertModel): softmax, except that a row whose inputs are all -inf
  gives zeros instead of NaN. Its decomposition arrives in Relax as

      out  = softmax(x, axis)
      rows = logical_not(astype(max(astype(logical_not(equal(x, -inf)), int8), axis, keepdims), bool))
      where(rows, full_like(out, 0), out)        # or where(rows, 0, out)

  -> rule ``safe_softmax`` / ``safe_softmax_scalar_zero`` -> one ``softmax`` node with ``safe`` 1,
  whose kernel zeroes those rows after oneDNN's softmax (cpp/kernels/softmax.cc);
* the same step as torch's default (dynamo) ONNX exporter writes it, ``where(isnan(y), 0, y)`` with
  ``y = softmax(x, axis)`` (transformers' sdpa attention: Llama, BERT, GPT-2...) -> rule
  ``isnan_softmax`` -> one ``softmax`` node with ``safe`` 2: every NaN of the result written 0, which
  is what the ONNX graph computes (for finite inputs with -inf masks, the same values as ``safe`` 1).

Why: the runtime runs no isnan (the ONNX form: Llama-family decoders 61 regions, BERT and GPT-2 13)
and no int8 and no logical_not, so op by op the chain left six ops per attention
on llvm between two regions: the transformers BertModel exported with dynamic batch and sequence
was 3 regions (tests/test_symbolic.py), each boundary a copy of the [B, heads, S, S] scores.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from ....rules import Match
from ..epilogue import tensors_reason
from ..table import PatternSpec, lowers, lowers_composite, pattern_rules


def check_softmax(match: Match) -> str | None:
    """softmax of a float32 tensor (not a scalar) with a static shape."""
    reason = tensors_reason(match, ["data", "root"], symbolic=True)
    if reason:
        return reason
    if len(match.shape("data")) == 0:
        return "softmax of a scalar"
    return None


def _scalar(expr: relax.Expr) -> float | None:
    """The value of a one-element float constant, or None."""
    if isinstance(expr, (tvm.ir.Constant, tvm.ir.GenericConst)):
        data = (expr.value if isinstance(expr, tvm.ir.GenericConst) else expr.data).numpy()
        if data.size == 1 and data.dtype.kind == "f":
            return float(data.reshape(()))
    return None


def _is_positive_zero(value: float | None) -> bool:
    return value == 0.0 and math.copysign(1.0, value) > 0


def _axes(attr, rank: int) -> list[int] | None:
    """An axis attr (an int, a list of ints, or None = every axis) as sorted non-negative ints."""
    if attr is None:
        return list(range(rank))
    values = [int(a) for a in attr] if isinstance(attr, (list, tuple, tvm.ir.Array)) else [int(attr)]
    if any(not -rank <= a < rank for a in values):
        return None
    return sorted(a % rank for a in values)


def check_safe_softmax(match: Match) -> str | None:
    """torch's _safe_softmax chain over float32 data: the rows the chain zeroes are exactly those
    along the softmax's axis whose inputs all equal -inf, with the zeros +0.0."""
    reason = tensors_reason(match, ["data", "softmax", "root"], symbolic=True)
    if reason:
        return reason
    rank = len(match.shape("data"))
    if rank == 0:
        return "softmax of a scalar"
    if _scalar(match.expr("minus_inf")) != -math.inf:
        return f"the safe softmax chain compares with {_scalar(match.expr('minus_inf'))}, not -inf"
    axis = _axes(match.expr("softmax").attrs.axis, rank)
    reduce = match.expr("any")
    reduce_axes = _axes(reduce.attrs.axis, rank)
    if axis is None or reduce_axes != axis:
        return f"the safe softmax chain reduces over axes {reduce_axes}, the softmax runs over {axis}"
    if not reduce.attrs.keepdims:
        return "the safe softmax chain's max drops the reduced axis (keepdims False)"
    if match.dtype("flag") != "bool" or match.dtype("kept") != "bool":
        return f"the safe softmax chain casts to {match.dtype('flag')}, not bool"
    if not _is_positive_zero(_scalar(match.expr("zero"))):
        return f"the safe softmax chain writes {_scalar(match.expr('zero'))} for masked rows, not 0"
    return None


def _safe_chain(scalar_zero: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    data, minus_inf, zero = wildcard(), is_const(), is_const()
    softmax = is_op("relax.nn.softmax")(data)
    kept = is_op("relax.logical_not")(is_op("relax.equal")(data, minus_inf))
    any_kept = is_op("relax.max")(is_op("relax.astype")(kept))
    flag = is_op("relax.astype")(any_kept)
    rows = is_op("relax.logical_not")(flag)
    zeros = zero if scalar_zero else is_op("relax.full_like")(softmax, zero)
    root = is_op("relax.where")(rows, zeros, softmax)
    names = {"data": data, "softmax": softmax, "minus_inf": minus_inf, "kept": kept, "any": any_kept,
             "flag": flag, "zero": zero, "root": root}
    return root, names


SAFE_RULES = {"safe_softmax": False, "safe_softmax_scalar_zero": True}


def check_isnan_softmax(match: Match) -> str | None:
    """``where(isnan(y), 0, y)`` over ``y = softmax(x)`` of float32 data, the zero a +0.0 scalar."""
    reason = tensors_reason(match, ["data", "softmax", "root"], symbolic=True)
    if reason:
        return reason
    if len(match.shape("data")) == 0:
        return "softmax of a scalar"
    zero = _scalar(match.expr("zero"))
    if not _is_positive_zero(zero):
        return f"the isnan-guarded softmax writes {zero} for NaN, not 0"
    return None


def _isnan_chain() -> tuple[DFPattern, dict[str, DFPattern]]:
    data, zero = wildcard(), is_const()
    softmax = is_op("relax.nn.softmax")(data)
    root = is_op("relax.where")(is_op("relax.isnan")(softmax), zero, softmax)
    return root, {"data": data, "softmax": softmax, "zero": zero, "root": root}


@pattern_rules
def _rules():
    data = wildcard()
    call = is_op("relax.nn.softmax")(data)
    yield PatternSpec("softmax", call, {"data": data, "root": call}, check_softmax, priority=50)
    # above the softmax alone and the mask ops (10): the chain is one node
    for name, scalar_zero in SAFE_RULES.items():
        root, names = _safe_chain(scalar_zero)
        yield PatternSpec(name, root, names, check_safe_softmax, priority=55)
    root, names = _isnan_chain()
    yield PatternSpec("isnan_softmax", root, names, check_isnan_softmax, priority=55)


@lowers("relax.nn.softmax", check=check_softmax)
def lower_softmax(ctx, var: relax.Var, call: relax.Call) -> int:
    return ctx.emit("softmax", [ctx.data_of(call.args[0])], var, {"axis": int(call.attrs.axis)})


@lowers_composite(*SAFE_RULES, "isnan_softmax")
def lower_safe_softmax(ctx, func: relax.Function) -> int:
    """The chain as its softmax with ``safe`` 1 (torch's chain) or 2 (the isnan guard); the
    composite's one parameter is x."""
    softmax = next((b.value for block in func.body.blocks for b in block.bindings
                    if isinstance(b.value, relax.Call) and b.value.op == tvm.ir.Op.get("relax.nn.softmax")),
                   None)
    if softmax is None or len(func.params) != 1:
        raise ctx.fail(f"a safe softmax composite with {len(func.params)} parameters and "
                       f"{'a' if softmax is not None else 'no'} softmax (expected x only and one softmax)")
    return ctx.emit("softmax", [ctx.data_of(func.params[0])], func.body.body,
                    {"axis": int(softmax.attrs.axis), "safe": 2 if _has_isnan(func) else 1})


def _has_isnan(func: relax.Function) -> bool:
    return any(isinstance(b.value, relax.Call) and b.value.op == tvm.ir.Op.get("relax.isnan")
               for block in func.body.blocks for b in block.bindings)
