"""Pass ``resolve_shape_tensors`` (Relax, after the ONNX import): symbols TVM's ONNX importer reads
back from int64 shape tensors with ``match_cast`` are replaced by the expressions those tensors hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

#: the largest int64 tensor whose elements are followed (shapes and scalars are a handful)
_MAX_ELEMENTS = 16

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "relax.add": lambda a, b: a + b,
    "relax.subtract": lambda a, b: a - b,
    "relax.multiply": lambda a, b: a * b,
    "relax.floor_divide": tvm.tirx.floordiv,
    "relax.maximum": tvm.tirx.max,
    "relax.minimum": tvm.tirx.min,
}
#: ops that keep the elements (in row-major order) and only change the rank or the integer type
_SAME_ELEMENTS = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.tensor_to_shape", "relax.astype")


def resolve_shape_tensors(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each symbol that ``main`` binds by ``match_cast`` from a shape tensor replaced by
    the expression the tensor holds, where the tensor is computed from shapes and integer constants
    (``shape_to_tensor``, reshapes, ``+ - * //``, ``max``/``min``, negation); the ``match_cast`` goes
    and every type after it is inferred again.

    Why: with a symbolic dim, TVM's ONNX importer computes an integer ``Range`` (the position ids
    ``arange(S)`` every transformers model builds) as a length *tensor* and reads it back with
    ``match_cast`` into a fresh symbol (``range_len_0``). That symbol is unrelated to ``S``, so the
    position embeddings and masks built from it have shapes that differ from the hidden states', and
    adding them gives tensors of unknown shape (BERT's attention scores); and TVM's
    ``MergeCompositeFunctions`` rejects the ``match_cast`` itself ("Invalid type:
    relax.expr.MatchCast"). The length is ``max(-((0 - S) // 1), 0)``, which simplifies to ``S``
    since dims are not negative. A tensor computed from anything else (data) is left as it is.
    """
    func = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return mod
    substitution = _symbols_from_shape_tensors(func)
    if not substitution:
        return mod
    bound = _reinfer(func.bind_symbolic_vars(substitution))
    out = mod.clone()
    out["main"] = _drop_redundant_match_casts(bound)
    return relax.transform.DeadCodeElimination(["main"])(out)


def _analyzer(func: relax.Function) -> Any:
    """A TIR analyzer that knows the symbols of ``func``'s parameter shapes are dims (>= 0)."""
    analyzer = tvm.sym.Analyzer()
    for p in func.params:
        for d in getattr(getattr(p.ty, "shape", None), "values", []):
            if isinstance(d, tvm.tirx.Var):
                analyzer.bind(d, tvm.ir.Range(tvm.tirx.IntImm("int64", 0), tvm.tirx.IntImm("int64", 2**40)))
    return analyzer


def _symbols_from_shape_tensors(func: relax.Function) -> dict[Any, Any]:
    """{symbol a match_cast binds: the expression its shape tensor holds}."""
    analyzer = _analyzer(func)
    # symbols the parameters define are the model's own dims: a match_cast on them is a check
    given = {d for p in func.params for d in getattr(getattr(p.ty, "shape", None), "values", [])
             if isinstance(d, tvm.tirx.Var)}
    values: dict[relax.Var, list[Any]] = {}
    substitution: dict[Any, Any] = {}
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b, relax.MatchCast):
                held = _elements(b.value, values)
                if held is None:
                    continue
                shape = getattr(b.ty, "values", None) if isinstance(b.ty, relax.ShapeType) else None
                if shape is not None and len(shape) == len(held):
                    for symbol, value in zip(shape, held):
                        if isinstance(symbol, tvm.tirx.Var) and symbol not in substitution and symbol not in given:
                            substitution[symbol] = analyzer.simplify(value)
                values[b.var] = held
            elif isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call):
                held = _evaluate(b.value, values)
                if held is not None:
                    values[b.var] = held
    return substitution


def _elements(expr: Any, values: dict[relax.Var, list[Any]]) -> list[Any] | None:
    """The int64 elements ``expr`` holds, as TIR expressions; None when unknown."""
    if isinstance(expr, relax.Var):
        return values.get(expr)
    if isinstance(expr, relax.Call):  # the importer's match_cast casts a call written in place
        return _evaluate(expr, values)
    if isinstance(expr, relax.ShapeExpr):
        return list(expr.values)  # shape dims are int64
    if isinstance(expr, tvm.ir.GenericConst):
        array = expr.value.numpy()
        if array.dtype.kind in "iu" and array.size <= _MAX_ELEMENTS:
            return [tvm.tirx.IntImm("int64", int(v)) for v in array.reshape(-1)]
    return None


def _evaluate(call: relax.Call, values: dict[relax.Var, list[Any]]) -> list[Any] | None:
    """The elements of the int64 tensor ``call`` computes from known ones; None when unknown."""
    if not isinstance(call.op, tvm.ir.Op) or not call.args:
        return None
    name = call.op.name
    first = _elements(call.args[0], values)
    if first is None:
        return None
    if name == "relax.shape_to_tensor" or name in _SAME_ELEMENTS:
        if name == "relax.astype" and str(call.attrs.dtype) not in ("int64", "int32"):
            return None
        return first
    if name == "relax.negative":
        return [-a for a in first]
    if name in _BINARY and len(call.args) == 2:
        second = _elements(call.args[1], values)
        if second is None or (len(first) != len(second) and 1 not in (len(first), len(second))):
            return None
        n = max(len(first), len(second))
        first, second = (first * n if len(first) == 1 else first), (second * n if len(second) == 1 else second)
        return [_BINARY[name](a, b) for a, b in zip(first, second)]
    return None


def _reinfer(func: relax.Function) -> relax.Function:
    """``func`` with the type of every call inferred again (shapes that were unknown because two
    operands had unrelated symbols are known once the symbols are the same)."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Reinfer(PyExprMutator):

        def visit_call_(self, call):  # noqa: N802 - TVM's visitor naming
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op) or call.ty_args:
                return call
            return relax.Call(call.op, call.args, call.attrs, call.ty_args)

    return Reinfer().visit_expr(func)


def _drop_redundant_match_casts(func: relax.Function) -> relax.Function:
    """``func`` with each ``match_cast`` nothing reads dropped (the symbols it bound are substituted)
    and each one whose value already has the target type made a plain binding."""
    read = _read_vars(func)
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            if isinstance(b, relax.MatchCast):
                if b.var not in read:
                    continue
                if tvm_ffi.structural_equal(b.value.ty, b.ty):
                    b = relax.VarBinding(b.var, b.value)
            bindings.append(b)
        blocks.append((relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock)(bindings))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs)


def _read_vars(func: relax.Function) -> set[relax.Var]:
    """The variables some binding's value or the function's result reads."""
    from tvm.relax.expr_functor import PyExprVisitor, visitor

    read: set[relax.Var] = set()

    @visitor
    class Reads(PyExprVisitor):

        def visit_var_(self, var):  # noqa: N802 - TVM's visitor naming
            read.add(var)

        def visit_dataflow_var_(self, var):  # noqa: N802
            read.add(var)

    reads = Reads()
    for block in func.body.blocks:
        for b in block.bindings:
            reads.visit_expr(b.value)
    reads.visit_expr(func.body.body)
    return read
