"""compose_permutes: a chain of ``permute_dims`` is one ``permute_dims`` (none when it is the identity).

What it rewrites. ``permute_dims(permute_dims(x, a), b)`` reads element ``x[a[b[i]]]`` along output
axis ``i``: it is ``permute_dims(x, [a[j] for j in b])``. Each ``permute_dims`` whose input is
another one (through any number of them) becomes one ``permute_dims`` of the chain's first input
with the composed axes, or that input itself when the composed axes are the identity. The inner
permutes stay for their other readers; those nobody reads any more go (dead code).

Why. TVM's torch frontend writes the output of ``scaled_dot_product_attention`` as three
permutes in a row (``[B, H, S, D]`` to ``[S, B, H, D]``, back to ``[B, H, S, D]``, then the
transformers model's own ``transpose(1, 2)``): each is a copy in the region, two of them undoing
each other. In a Llama decoder from ``bh.from_torch`` that was two copies of the attention output
per layer that the ``bh.from_onnx`` build of the same model did not make (per-step profile: the
from_torch region ran 3 permutes per layer, the from_onnx one 1).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._ir import map_entry_calls

__all__ = ["compose_permutes"]


def _axes(call: relax.Call) -> list[int] | None:
    """The axes of a ``permute_dims`` call (its default, None, reverses the dims), else None."""
    if not (isinstance(call, relax.Call) and getattr(call.op, "name", None) == "relax.permute_dims"):
        return None
    if call.attrs.axes is not None:
        return [int(a) for a in call.attrs.axes]
    ndim = getattr(call.args[0].ty, "ndim", -1)
    return list(range(ndim - 1, -1, -1)) if ndim >= 0 else None


def _composed(call: relax.Call, lookup) -> relax.Expr | None:
    """One ``permute_dims`` (or its input) for a chain of them ending in ``call``; None when
    ``call`` is not a permute of a permute."""
    axes = _axes(call)
    if axes is None:
        return None
    source, depth = call.args[0], 0
    while isinstance(source, relax.Var):
        inner = _axes(lookup(source))
        if inner is None or len(inner) != len(axes):
            break
        axes = [inner[j] for j in axes]
        source, depth = lookup(source).args[0], depth + 1
    if depth == 0:
        return None
    if axes == list(range(len(axes))):
        return source
    return relax.op.permute_dims(source, axes)


def compose_permutes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each chain of ``permute_dims`` in its entry functions composed into one (see the
    module docstring); ``mod`` itself when there is none."""
    return map_entry_calls(mod, lambda _var, call, lookup: _composed(call, lookup))
