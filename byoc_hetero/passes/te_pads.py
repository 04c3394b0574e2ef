"""te_pads: a TIR constant pad (TVM's ONNX importer's ``Pad``) is an ``nn.pad``.

Why: TVM's ONNX importer writes ``Pad`` of mode ``constant`` as ``call_tir`` of the TE function
``topi.nn.pad``; no rule sees a ``call_tir``, so a pad that :mod:`.fold_zero_pads` could not merge
into a convolution ran on llvm and split its region in two. torch's default exporter writes
torchvision Swin-V2's ``F.pad`` of the channels-last activations (``[N, H, W, C]`` padded on H and W
up to a multiple of the window) so: 10 of them on Swin-V2-T (issue 39). ``from_torch`` writes the same
pad as ``nn.pad``, which the rules read (``backends/onednn/ops/pad.py``).

What: in the entry functions, ``call_tir(f, (x,))`` where ``f`` is structurally the PrimFunc
``emit_te(topi.nn.pad, x, before, after, value)`` writes for ``x``'s type (widths >= 0, a scalar
value), with the widths and the value read from ``f`` itself (the offsets of its loads of ``x``, the
else branch of its ``if_then_else``) and the reading confirmed by building that PrimFunc again,
becomes ``nn.pad(x, widths, "constant", value)``. Any other ``call_tir`` is left as it is.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, topi

from ._ir import map_entry_calls


def _te_pad(x_ty: relax.TensorType, before: list[int], after: list[int], value: float) -> tvm.tirx.PrimFunc:
    """The PrimFunc ``emit_te(topi.nn.pad, x, before, after, value)`` writes for a tensor of ``x_ty``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", x_ty)
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit_te(topi.nn.pad, x, before, after, value))
    return next(f for _, f in bb.get().functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def _offset(index) -> int | None:
    """``b`` of a load index ``i - b`` (0 for a bare ``i``), else None."""
    if isinstance(index, (tvm.tirx.Sub, tvm.tirx.Add)) and isinstance(index.b, tvm.tirx.IntImm):
        return int(index.b.value) * (1 if isinstance(index, tvm.tirx.Sub) else -1)
    if isinstance(index, (tvm.tirx.Sub, tvm.tirx.Add, tvm.tirx.IntImm)) or not hasattr(index, "name"):
        return None
    return 0


def _store(stmt) -> tvm.tirx.BufferStore | None:
    """The store under a nest of loops and blocks (a TE compute's body), else None."""
    while not isinstance(stmt, tvm.tirx.BufferStore):
        stmt = getattr(stmt, "block", None) or getattr(stmt, "body", None)
        if stmt is None:
            return None
    return stmt


def pad_of(func: tvm.tirx.PrimFunc, x_ty: relax.TensorType, out_ty: relax.TensorType) -> tuple[list[int], float] | None:
    """``(widths, value)`` (``widths`` in ``nn.pad``'s order: before / after per axis) when ``func``
    is TE's constant pad of a tensor of ``x_ty`` to ``out_ty``; else None."""
    x_shape, out_shape = x_ty.shape, out_ty.shape
    if not isinstance(x_shape, relax.ShapeExpr) or not isinstance(out_shape, relax.ShapeExpr) \
            or len(x_shape.values) != len(out_shape.values):
        return None
    dims = [(int(a), int(b)) for a, b in zip(x_shape.values, out_shape.values)
            if isinstance(a, tvm.tirx.IntImm) and isinstance(b, tvm.tirx.IntImm)]
    store = _store(func.body)
    value = store.value if store is not None else None
    if len(dims) != len(x_shape.values) or not isinstance(value, tvm.ir.Call) \
            or not str(getattr(value.op, "name", "")).endswith(".if_then_else") or len(value.args) != 3 \
            or not isinstance(value.args[1], tvm.ir.expr.TensorLoad) \
            or not isinstance(value.args[2], (tvm.tirx.FloatImm, tvm.tirx.IntImm)):
        return None
    before = [_offset(i) for i in value.args[1].indices]
    if len(before) != len(dims) or any(b is None for b in before):
        return None
    after = [o - i - b for (i, o), b in zip(dims, before)]
    if any(w < 0 for w in before + after):
        return None
    pad_value = float(value.args[2].value)
    if not tvm_ffi.structural_equal(func, _te_pad(x_ty, before, after, pad_value)):
        return None
    return [w for pair in zip(before, after) for w in pair], pad_value


def _as_nn_pad(mod: tvm.IRModule, call: relax.Call) -> relax.Expr | None:
    """``call`` as ``nn.pad`` when it is ``call_tir`` of TE's constant pad of its one argument; else None."""
    if getattr(call.op, "name", None) != "relax.call_tir" or not isinstance(call.args[0], relax.GlobalVar):
        return None
    func, args = mod.functions.get(call.args[0]), call.args[1]
    if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(args, relax.Tuple) or len(args.fields) != 1:
        return None
    x = args.fields[0]
    if not isinstance(x.ty, relax.TensorType) or not isinstance(call.ty, relax.TensorType) \
            or x.ty.dtype != call.ty.dtype:
        return None
    found = pad_of(func, x.ty, call.ty)
    if found is None:
        return None
    widths, value = found
    return relax.op.nn.pad(x, widths, "constant", value)


def te_pads(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each TIR constant pad written as ``nn.pad`` (see the module doc); ``mod`` itself
    when there is none."""
    return map_entry_calls(mod, lambda _var, call, _get: _as_nn_pad(mod, call))
