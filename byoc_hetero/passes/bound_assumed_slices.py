"""Pass ``bound_assumed_slices`` (Relax, after the ONNX import): a slice TVM's importer assumes in bound
declares the range of the symbol that keeps it so; one whose bound cannot be said is clipped instead."""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from ..inputs import dim_ranges, with_dim_ranges


def bound_assumed_slices(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with, for each ``strided_slice`` of ``main`` marked ``assume_inbound`` whose begin and
    end are a symbol ``S`` of the inputs plus a constant (or constants), the range of ``S`` that keeps
    it within the sliced dim declared on ``main`` (narrowing a declared one); a slice whose bounds are
    anything else loses the mark (TVM then clips it, as for constant bounds).

    Why: TVM's ONNX importer marks every ``Slice`` with symbolic bounds ``assume_inbound`` and its
    kernel then reads without clipping. BERT's ``position_ids[:, :S]`` slices a buffer of
    ``max_position_embeddings`` (128 in the small test config): a dynamic-sequence file run at a longer
    ``S`` read past the buffer and crashed the process (ONNX Runtime raises on the same input). The
    declared range makes ``bh.partition`` check it at the start of ``main``: ``S`` = 140 is now an
    :class:`~byoc_hetero.errors.InputError` naming the dim and the range, and within the range the
    slice has the shape ``S`` the rest of the model expects (a clipped slice would make it unknown).
    """
    func = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
    if not isinstance(func, relax.Function):
        return mod
    symbols = {str(d.name): d for p in func.params for d in getattr(getattr(p.ty, "shape", None), "values", [])
               if isinstance(d, tvm.tirx.Var)}
    ranges = {n: list(r) for n, r in dim_ranges(func).items()}
    analyzer = tvm.sym.Analyzer()
    slices = _assumed_slices(func)
    unproven = []
    for call in slices:  # static dims: the range that keeps the slice in them
        bounds = _bounds_that_keep_in(call, symbols, analyzer)
        if bounds is None:
            unproven.append(call)
            continue
        for name, (lo, hi) in bounds.items():
            old = ranges.setdefault(name, [None, None])
            old[0] = lo if old[0] is None else max(old[0], lo)
            old[1] = hi if old[1] is None else min(old[1], hi)
    # symbolic dims (a slice of a concat of S + 1 positions): proven within the ranges, dims >= 1
    for name, symbol in symbols.items():
        lo, hi = ranges.get(name, [None, None])
        analyzer.bind(symbol, tvm.ir.Range(tvm.tirx.IntImm("int64", max(lo or 1, 1)),
                                           tvm.tirx.IntImm("int64", (hi if hi is not None else 2**40) + 1)))
    unbounded = [c for c in unproven if not _proven_in_bound(c, analyzer)]
    for call in slices:  # what was proven assumed dims >= 1: declared, so that it is checked
        for name in _symbols_in(call, symbols) if call not in unbounded else []:
            lo_hi = ranges.setdefault(name, [None, None])
            lo_hi[0] = lo_hi[0] or 1
    if not unbounded and ranges == {n: list(r) for n, r in dim_ranges(func).items()}:
        return mod
    if unbounded:
        func = _clip(func, unbounded)
    out = mod.clone()
    out["main"] = with_dim_ranges(func, {n: (lo, hi) for n, (lo, hi) in ranges.items()})
    return out


def _assumed_slices(func: relax.Function) -> list[relax.Call]:
    """The ``strided_slice`` calls of ``func`` marked ``assume_inbound`` with tuple bounds."""
    found = []
    for block in getattr(func.body, "blocks", []):
        for b in block.bindings:
            call = b.value
            if (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                    and call.op.name == "relax.strided_slice" and bool(call.attrs.assume_inbound)):
                found.append(call)
    return found


def _bounds_that_keep_in(call: relax.Call, symbols: dict[str, Any], analyzer: Any) -> dict[str, tuple[int, int]] | None:
    """{symbol: (lo, hi)} such that ``0 <= begin <= end <= dim`` on every sliced axis (static dims,
    step 1, begin and end a constant or one symbol plus a constant); None when it cannot be said."""
    shape = getattr(call.args[0].ty, "shape", None)
    if len(call.args) < 4 or not isinstance(shape, relax.ShapeExpr):
        return None
    fields = [getattr(a, "fields", None) for a in call.args[1:]]
    if any(f is None for f in fields):
        return None
    axes, begins, ends = fields[:3]
    steps = fields[3] if len(fields) > 3 else [tvm.tirx.IntImm("int64", 1)] * len(axes)
    bounds: dict[str, list[int]] = {}
    for axis, begin, end, step in zip(axes, begins, ends, steps):
        dim = shape.values[int(axis.value) % len(shape.values)]
        if not isinstance(dim, tvm.tirx.IntImm) or not isinstance(step, tvm.tirx.IntImm) or int(step.value) != 1:
            return None
        for value, low in ((begin, 0), (end, None)):
            # 0 <= begin and end <= dim; begin <= end holds for a symbol's own shifts (begin's offset <=
            # end's) and is checked below for constants
            term = _symbol_plus_constant(value, symbols, analyzer)
            if term is None:
                return None
            name, offset = term
            if name is None:
                if not (0 <= offset <= int(dim.value)):
                    return None
                continue
            lo_hi = bounds.setdefault(name, [1, int(dim.value) - offset])
            lo_hi[1] = min(lo_hi[1], int(dim.value) - offset)
            if low is not None:
                lo_hi[0] = max(lo_hi[0], low - offset)
        b, e = (_symbol_plus_constant(v, symbols, analyzer) for v in (begin, end))
        if b[0] != e[0] and b[0] is not None:
            return None  # begin follows a symbol and end does not (or another one): not said here
        if b[0] == e[0] and b[1] > e[1]:
            return None
        if b[0] is None and e[0] is not None:  # begin <= end: the symbol at least begin - end's offset
            bounds[e[0]][0] = max(bounds[e[0]][0], b[1] - e[1])
    if any(lo > hi for lo, hi in bounds.values()):
        return None
    return {n: (lo, hi) for n, (lo, hi) in bounds.items()}


def _proven_in_bound(call: relax.Call, analyzer: Any) -> bool:
    """Whether ``0 <= begin <= end <= dim`` on every axis of the slice ``call`` (step 1), as
    ``analyzer`` (which knows the symbols' ranges) proves it."""
    shape = getattr(call.args[0].ty, "shape", None)
    fields = [getattr(a, "fields", None) for a in call.args[1:]]
    if len(call.args) < 4 or not isinstance(shape, relax.ShapeExpr) or any(f is None for f in fields):
        return False
    steps = fields[3] if len(fields) > 3 else [tvm.tirx.IntImm("int64", 1)] * len(fields[0])
    for axis, begin, end, step in zip(fields[0], fields[1], fields[2], steps):
        dim = shape.values[int(axis.value) % len(shape.values)]
        if not (isinstance(step, tvm.tirx.IntImm) and int(step.value) == 1 and analyzer.can_prove(begin >= 0)
                and analyzer.can_prove(begin <= end) and analyzer.can_prove(end <= dim)):
            return False
    return True


def _symbols_in(call: relax.Call, symbols: dict[str, Any]) -> list[str]:
    """The input symbols the bounds of the slice ``call`` use."""
    used = {str(v.name) for a in call.args[1:] for f in getattr(a, "fields", [])
            for v in tvm.tirx.analysis.undefined_vars(f)}
    return [n for n in symbols if n in used]


def _symbol_plus_constant(value: Any, symbols: dict[str, Any], analyzer: Any) -> tuple[str | None, int] | None:
    """``(name, c)`` when ``value`` is ``symbol + c`` for one input symbol, ``(None, c)`` for a
    constant, None otherwise."""
    if isinstance(value, tvm.tirx.IntImm):
        return None, int(value.value)
    for name, symbol in symbols.items():
        rest = analyzer.simplify(value - symbol)
        if isinstance(rest, tvm.tirx.IntImm):
            return name, int(rest.value)
    return None


def _clip(func: relax.Function, calls: list[relax.Call]) -> relax.Function:
    """``func`` with ``calls`` (assumed-in-bound slices) clipping instead, every type after them
    inferred again."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    targets = list(calls)

    @mutator
    class Clip(PyExprMutator):

        def visit_call_(self, call):  # noqa: N802 - TVM's visitor naming
            new = super().visit_call_(call)
            if any(call.same_as(t) for t in targets):
                x, axes, begin, end, *strides = new.args
                return relax.op.strided_slice(x, axes, begin, end, strides[0] if strides else None,
                                              assume_inbound=False)
            return new

    return Clip().visit_expr(func)
