"""Pass ``gather_elements_as_take`` (Relax, before the stages): ``gather_elements`` with constant
indices becomes a ``take`` of constant flat indices, which the runtime runs.

Why: DeBERTa-v2/v3's disentangled attention reads its content-to-position and position-to-content
scores with ``torch.gather(scores, -1, index)`` (ONNX ``GatherElements``; issue 39), the index a
bucketed relative position that :mod:`.fold_int_constants` turns into a constant when the sequence
length is static. The runtime has no element-wise gather, but it has ``take`` (slices of a table
along one axis by int64 / int32 indices, every index checked): ``out[p] = x[p with p[axis] :=
index[p]]`` is ``take`` of ``x`` read flat, at the flat offset of each such position.

What: ``gather_elements(x, index, axis)`` with a static ``x`` and a constant ``index`` whose values
all lie in ``[0, n)`` (``n`` = ``x``'s extent on ``axis``) is
``reshape(take(reshape(x, [outer, rest]), offsets, axis=1), index.shape)``. ``outer`` covers the
leading dims along which ``index`` does not change and spans all of ``x`` (DeBERTa's heads: one
index broadcast to every head), so the constant ``offsets`` hold one copy, not one per head. The
index is a constant, or ``broadcast_to`` of one (:mod:`.fold_int_constants` writes an index too large
to store in full so: DeBERTa-v3-base's, one table for 12 heads).
Anything else (an index computed at run time, one out of range) stays as it is: on llvm, the report
naming the op.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .._relax import constant_value, op_name, static_shape
from ._ir import map_entry_calls
from .fold_int_constants import stored


def _shared_prefix(index: np.ndarray, data_shape: tuple[int, ...], axis: int) -> int:
    """How many leading dims of ``index`` (before ``axis``, each as long as ``data_shape``'s) it does
    not change along (a broadcast view's repeated dims without comparing)."""
    prefix = 0
    while (prefix < axis and index.shape[prefix] == data_shape[prefix]
           and (index.strides[prefix] == 0 or (index == index.take([0], axis=prefix)).all())):
        prefix += 1
    return prefix


def flat_offsets(index: np.ndarray, data_shape: tuple[int, ...], axis: int) -> tuple[int, np.ndarray] | None:
    """``(prefix, offsets)``: the offsets into ``data`` read flat from dim ``prefix`` on, of each
    element ``gather_elements(data, index, axis)`` reads (the same for every leading ``prefix`` index),
    or None when an index is out of range or ``index`` is larger than ``data`` off ``axis``."""
    rank, n = len(data_shape), data_shape[axis]
    if index.ndim != rank or any(i > d for a, (i, d) in enumerate(zip(index.shape, data_shape)) if a != axis):
        return None
    values = stored(index)
    if values.size and (values.min() < 0 or values.max() >= n):
        return None  # what the op makes of them is not for this pass to guess
    prefix = _shared_prefix(index, data_shape, axis)
    inner = index[(0,) * prefix]
    coords = list(np.indices(inner.shape, dtype=np.int64))
    coords[axis - prefix] = inner.astype(np.int64)
    offsets = np.ravel_multi_index(coords, data_shape[prefix:]) if inner.size else inner.astype(np.int64)
    return prefix, np.asarray(offsets, dtype=np.int64)


def _index_value(index: relax.Expr, lookup) -> np.ndarray | None:
    """A constant index, or one bound to ``broadcast_to(constant, shape)`` (how
    :mod:`.fold_int_constants` writes a folded index repeated over heads) as a numpy view."""
    value = constant_value(index)
    bound = lookup(index) if value is None and isinstance(index, relax.Var) else None
    if isinstance(bound, relax.Call) and op_name(bound) == "relax.broadcast_to":
        part, shape = constant_value(bound.args[0]), static_shape(bound)
        if part is not None and shape is not None:
            value = np.broadcast_to(part, shape)
    return value


def _as_take(_var: relax.Var, call: relax.Call, lookup) -> relax.Expr | None:
    if op_name(call) != "relax.gather_elements":
        return None
    data, index = call.args
    shape, values = static_shape(data), _index_value(index, lookup)
    if shape is None or values is None or not shape or np.asarray(values).dtype.kind not in "iu":
        return None
    axis = int(call.attrs.axis) % len(shape)
    found = flat_offsets(np.asarray(values), shape, axis)
    if found is None:
        return None
    prefix, offsets = found
    outer = int(np.prod(shape[:prefix], dtype=np.int64))
    dtype = "int32" if offsets.size == 0 or offsets.max() < 2**31 else "int64"
    table = relax.op.reshape(data, [outer, int(np.prod(shape[prefix:], dtype=np.int64))])
    taken = relax.op.take(table, relax.const(offsets.astype(dtype), dtype), axis=1)
    return relax.op.reshape(taken, [int(d) for d in np.asarray(values).shape])


def gather_elements_as_take(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``gather_elements`` of constant in-range indices on a static tensor read as a
    ``take`` of flat offsets (see the module doc)."""
    out = map_entry_calls(mod, _as_take)
    return out if out is mod else relax.transform.Normalize()(out)
