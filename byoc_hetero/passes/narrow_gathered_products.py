"""Pass ``narrow_gathered_products`` (Relax, before the stages): a ``gather_elements`` along the last
axis of a ``matmul``, with constant indices that read only columns ``lo..hi`` of the product, reads
them from a narrower product: the matmul of the same rows against columns ``lo..hi`` of its right
operand.

Why: DeBERTa-v2/v3's disentangled attention scores every query against every relative position
embedding (``Q @ pos_key^T``: 2 x 256 buckets, 512 columns per head) and then gathers, per query
and key, the column of their bucketed distance. At a sequence of 128 the distances are -127..127
and only 255 of the 512 columns are ever read (the rest belong to distances the sequence does not
have): half of the content-to-position and position-to-content products, 2 x 100 MFLOP per layer
of DeBERTa-v3-base, computed and thrown away. The indices are constants once
:mod:`.fold_int_constants` has folded the bucketing, so the used columns are known at build time.

What: ``gather_elements(matmul(a, b), index, axis=-1)`` with a constant ``index`` (or
``broadcast_to`` of one) whose values lie in ``[lo, hi]``, ``0 <= lo <= hi < n`` and
``hi - lo + 1 < n`` (``n``: ``b``'s last extent), becomes
``gather_elements(matmul(a, strided_slice(b, [-1], [lo], [hi + 1])), index - lo, axis=-1)``.
``b`` is usually a weight (DeBERTa's position keys, bound constants): :mod:`.fold_weight_subgraphs`
runs next and folds the slice into a smaller constant. A matmul read by anything else is left
whole (the full product is needed anyway); so is any other gather (an index computed at run time,
one out of range).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .._relax import constant_value, entry_functions, op_name, static_shape
from ._ir import map_entry_calls, readers_of
from .fold_int_constants import stored


def _index(index: relax.Expr, lookup) -> tuple[np.ndarray, tuple[int, ...] | None] | None:
    """The stored values of a constant index and, for ``broadcast_to(constant, shape)``, the shape."""
    value = constant_value(index)
    if value is not None:
        return np.asarray(value), None
    bound = lookup(index) if isinstance(index, relax.Var) else None
    if isinstance(bound, relax.Call) and op_name(bound) == "relax.broadcast_to":
        part, shape = constant_value(bound.args[0]), static_shape(bound)
        if part is not None and shape is not None:
            return np.asarray(part), tuple(int(d) for d in shape)
    return None


def _column_range(values: np.ndarray, n: int) -> tuple[int, int] | None:
    """``(lo, hi)`` of integer indices that read fewer than all ``n`` columns, else None."""
    part = stored(values)
    if part.dtype.kind not in "iu" or part.size == 0:
        return None
    lo, hi = int(part.min()), int(part.max())
    return (lo, hi) if 0 <= lo <= hi < n and hi - lo + 1 < n else None


def _narrowed(call: relax.Call, lookup, readers: dict[relax.Var, int]) -> relax.Expr | None:
    if op_name(call) != "relax.gather_elements":
        return None
    data, index = call.args
    product = lookup(data) if isinstance(data, relax.Var) and readers.get(data, 0) == 1 else None
    shape, found = static_shape(data), _index(index, lookup)
    if op_name(product) != "relax.matmul" or shape is None or found is None:
        return None
    if int(call.attrs.axis) % len(shape) != len(shape) - 1:
        return None
    a, b = product.args
    b_shape = static_shape(b)
    if b_shape is None or len(b_shape) < 2 or int(b_shape[-1]) != int(shape[-1]):
        return None
    values, broadcast = found
    span = _column_range(values, int(shape[-1]))
    if span is None:
        return None
    lo, hi = span
    sliced = relax.op.strided_slice(b, axes=[len(b_shape) - 1], begin=[lo], end=[hi + 1])
    narrow = relax.op.matmul(a, sliced, out_dtype=product.attrs.out_dtype)
    moved = relax.const((values - values.dtype.type(lo)).astype(values.dtype), str(values.dtype))
    new_index = moved if broadcast is None else relax.op.broadcast_to(moved, broadcast)
    return relax.op.gather_elements(narrow, new_index, axis=call.attrs.axis)


def narrow_gathered_products(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``gather_elements`` of constant indices that reads only some columns of a
    matmul's product reading them from the matmul of only those columns (see the module doc)."""
    readers = {}
    for name in entry_functions(mod):
        readers.update(readers_of(mod[name]))
    out = map_entry_calls(mod, lambda _var, call, lookup: _narrowed(call, lookup, readers))
    return out if out is mod else relax.transform.Normalize()(out)
