"""Pass ``dynamic_quantize_per_reader`` (Relax, in ``partition`` after :mod:`.matmul_integer_qdq`):
each ``dequantize`` of a ``DynamicQuantizeLinear``'s output gets its own copy of the quantization.

What: the import of ``DynamicQuantizeLinear(x)`` (:mod:`.dynamic_quantize_linear`, then TVM's
importer) is 19 scalar ops computing ``s`` and ``z`` from ``min(x)`` / ``max(x)``, then
``q = quantize(x, s, z)``; :mod:`.matmul_integer_qdq` reads ``q`` back as ``dequantize(q, s, z)``
once per ``MatMulInteger``. Each such ``dequantize`` whose ``s`` and ``z`` are that computation of the
``quantize``'s own ``x`` (compared whole, :func:`dynamic_round_trip`) is rebuilt as a fresh copy of
``dequantize(quantize(x, s', z'), s', z')``; the shared original is then dead.

Why: ``quantize_dynamic`` quantizes a tensor read by three MatMuls (BERT's Q / K / V projections)
once. A pattern rule that offloads the whole round trip as one composite (the oneDNN backend's
``dynamic_quantize_dequantize``, whose node an int8 dense then absorbs) cannot take operations
another match also needs; with a copy per reader each match is whole. The values are the same
(the same ops on the same ``x``); on llvm the copy costs two more reductions of ``x`` per extra
reader.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from .._relax import bound_values, entry_functions, op_name, updated

DQL_CONSTANTS = {"zero_span": 0.0, "qmax": 255.0, "one": 1.0, "zero_lo": 0.0, "zero_zp": 0.0, "mask": 255}
"""The constants of the import's DynamicQuantizeLinear computation, by the names
:func:`dynamic_round_trip` gives them (``mask`` is the int32 ``& 255`` of TVM's uint8 cast); each
name is used once, so that a pattern has one constant pattern per occurrence."""


def dynamic_round_trip(x: Any, call: Callable[..., Any], const: Callable[[str], Any]) -> Any:
    """``dequantize(quantize(x, s, z), s, z)`` with ``s`` and ``z`` computed from ``x`` as TVM imports
    :mod:`.dynamic_quantize_linear`'s ONNX: ``call(op, *args)`` makes one call of the short op name
    (``"min"``, ``"astype_int32"``, ...), ``const(name)`` one constant of :data:`DQL_CONSTANTS`. With
    Relax ops it builds the expression; with DPL patterns the pattern matching it."""
    lo = call("negative", call("relu", call("negative", call("min", x))))
    span = call("subtract", call("relu", call("max", x)), lo)
    scale = call("where", call("equal", span, const("zero_span")), const("one"), call("divide", span, const("qmax")))
    rounded = call("round", call("subtract", const("zero_lo"), call("divide", lo, scale)))
    finite = call("where", call("logical_not", call("isfinite", rounded)), const("zero_zp"), rounded)
    zero = call("astype_uint8", call("bitwise_and", call("astype_int32", finite), const("mask")))
    return call("dequantize", call("quantize", x, scale, zero), scale, zero)


_RELAX_OPS: dict[str, Callable[..., relax.Expr]] = {
    "min": lambda a: relax.op.min(a, axis=None, keepdims=False),
    "max": lambda a: relax.op.max(a, axis=None, keepdims=False),
    "negative": relax.op.negative, "relu": relax.op.nn.relu, "subtract": relax.op.subtract,
    "equal": relax.op.equal, "divide": relax.op.divide, "where": relax.op.where, "round": relax.op.round,
    "isfinite": relax.op.isfinite, "logical_not": relax.op.logical_not, "bitwise_and": relax.op.bitwise_and,
    "astype_int32": lambda a: relax.op.astype(a, "int32"), "astype_uint8": lambda a: relax.op.astype(a, "uint8"),
    "quantize": lambda x, s, z: relax.op.quantize(x, s, z, axis=-1, out_dtype="uint8"),
    "dequantize": lambda q, s, z: relax.op.dequantize(q, s, z, axis=-1, out_dtype="float32"),
}


def _relax_const(name: str) -> relax.Constant:
    return relax.const(DQL_CONSTANTS[name], "int32" if name == "mask" else "float32")


def relax_round_trip(x: relax.Expr) -> relax.Expr:
    """:func:`dynamic_round_trip` of ``x`` as one nested Relax expression."""
    return dynamic_round_trip(x, lambda op, *args: _RELAX_OPS[op](*args), _relax_const)


_MAX_DEPTH = 24
"""Calls deeper than the round trip's own (17: dequantize, quantize, ..., min, x) are not inlined:
a run-time scale computed otherwise (a long chain, a DAG that would be walked once per path) is told
apart without walking it."""


def _inline(expr: relax.Expr, values: Mapping[relax.Var, Any], stop: relax.Expr, depth: int = 0) -> relax.Expr:
    """``expr`` with each bound variable replaced by its (inlined) value, up to ``stop`` and
    :data:`_MAX_DEPTH` calls deep."""
    if expr.same_as(stop) or depth > _MAX_DEPTH:
        return expr
    if isinstance(expr, relax.Var) and isinstance(values.get(expr), relax.Call):
        return _inline(values[expr], values, stop, depth)
    if isinstance(expr, relax.Call):
        args = [_inline(a, values, stop, depth + 1) for a in expr.args]
        return relax.Call(expr.op, args, expr.attrs, expr.ty_args)
    return expr


def _is_round_trip(values: Mapping[relax.Var, Any], call: relax.Call) -> relax.Expr | None:
    """The ``x`` of ``call`` when it is a dequantize of DynamicQuantizeLinear(x) (uint8, per tensor)."""
    if op_name(call) != "relax.dequantize" or not isinstance(call.args[0], relax.Var):
        return None
    quantize = values.get(call.args[0])
    if not isinstance(quantize, relax.Call) or op_name(quantize) != "relax.quantize":
        return None
    x = quantize.args[0]
    found = _inline(call, values, x)
    want = relax_round_trip(x)
    # the quantize / dequantize axis attrs do not matter for a scalar scale: compare the operands
    same = all(tvm_ffi.structural_equal(f, w) for f, w in zip(
        (*found.args[1:], *found.args[0].args), (*want.args[1:], *want.args[0].args)))
    return x if same else None


def _copy_bindings(x: relax.Expr, out: relax.Var, dataflow: bool) -> list[relax.VarBinding]:
    """The bindings of a fresh :func:`dynamic_round_trip` of ``x``, the last one binding ``out``
    (each intermediate value bound once: a nested expression would be normalized as a tree)."""
    bb, bindings = relax.BlockBuilder(), []
    make_var = relax.DataflowVar if dataflow else relax.Var

    def call(op: str, *args: relax.Expr) -> relax.Var:
        value = bb.normalize(_RELAX_OPS[op](*args))
        var = out if op == "dequantize" else make_var(f"dql_{op}", value.ty)
        bindings.append(relax.VarBinding(var, value))
        return var

    dynamic_round_trip(x, call, _relax_const)
    return bindings


def _rewrite(func: relax.Function) -> relax.Function:
    values = bound_values(func)
    if not isinstance(func.body, relax.SeqExpr):
        return func
    blocks, changed = [], False
    for block in func.body.blocks:
        dataflow = isinstance(block, relax.DataflowBlock)
        bindings = []
        for b in block.bindings:
            x = _is_round_trip(values, b.value) if isinstance(b, relax.VarBinding) and \
                isinstance(b.value, relax.Call) else None
            if x is None:
                bindings.append(b)
                continue
            bindings += _copy_bindings(x, b.var, dataflow)
            changed = True
        blocks.append((relax.DataflowBlock if dataflow else relax.BindingBlock)(bindings))
    if not changed:
        return func
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def dynamic_quantize_per_reader(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each dequantize of a DynamicQuantizeLinear's output rebuilt as its own copy (see
    the module docstring); ``mod`` itself when there is none."""
    changes = {}
    for name in entry_functions(mod):
        new = _rewrite(mod[name])
        if not new.same_as(mod[name]):
            changes[mod.get_global_var(name)] = new
    if not changes:
        return mod
    mod = relax.transform.Normalize()(updated(mod, changes))
    return relax.transform.DeadCodeElimination(entry_functions(mod))(mod)
