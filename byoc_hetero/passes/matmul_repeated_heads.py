"""matmul_repeated_heads: a matmul of heads repeated by ``broadcast_to`` reads the heads once.

What it rewrites. Grouped-query attention (Llama, Mistral, Qwen, SmolLM: ``repeat_kv`` in
transformers) repeats each of the ``G`` key / value heads ``n`` times for the ``G * n`` query heads:
``R = reshape(broadcast_to(X, [.., G, n, S, D]), [.., G * n, S, D])`` with ``X`` of shape
``[.., G, 1, S, D]``. The attention matmuls then read ``R``. Two steps:

* ops that commute with the repetition are moved before it: ``permute_dims`` of the last two axes
  (``K^T``) and a multiplication or division by a scalar (the exporters' split of ``1/sqrt(d)``
  into ``sqrt`` on each side) on ``R`` become the same op on ``X``, repeated after;
* ``matmul(A, R)`` with ``A`` of shape ``[.., G * n, M, K]`` becomes
  ``reshape(matmul(reshape(A, [.., G, n, M, K]), X'), shape)``, ``X'`` the un-repeated operand
  (``[.., G, 1, K, N]``): the matmul broadcasts ``X'`` along the ``n`` axis as a batch dim, which
  oneDNN's matmul does in the kernel (brgemm, no copy). The reshapes are views.

The ``broadcast_to`` copies nobody reads any more go (dead code). Shapes may be symbolic (the
sequence length of a dynamic export): equal extents are proven with TVM's arithmetic analyzer.

Why. The repetition was a copy step per K and per V in every layer (a host loop in the region:
``G * n * S * D`` floats written and read again by the matmul); the issue asks for the repeat to be
read by the consumer instead. Both import paths write it: ``expand`` + ``reshape`` from torch,
``Expand`` + ``Reshape`` from the default ONNX exporter.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .._relax import constant_value as _constant
from .._relax import entry_functions

__all__ = ["matmul_repeated_heads"]

_ANALYZER = tvm.sym.Analyzer()


def _op(expr, name: str) -> bool:
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == f"relax.{name}"


def _shape(expr) -> list | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    return list(shape.values) if isinstance(shape, relax.ShapeExpr) else None


def _equal(a, b) -> bool:
    return bool(_ANALYZER.can_prove_equal(a, b))


def _product(dims):
    out = tvm.tirx.IntImm("int64", 1)
    for d in dims:
        out = out * d
    return out


def _same_dims(a, b) -> bool:
    return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))


@mutator
class _Rewrite(PyExprMutator):
    """The rewrite of the module docstring; ``changed`` counts the matmuls rewritten."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.changed = 0

    def _value(self, expr):
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else None

    def _repeat(self, expr):
        """``(X, repeated shape, shape)`` when ``expr`` is ``reshape(broadcast_to(X, [.., G, n, K, N]),
        [.., G * n, K, N])`` (through reshapes and same-shape broadcasts), else None."""
        out, value, reshaped = _shape(expr), self._value(expr), False
        while _op(value, "reshape") or self._same_shape_broadcast(value):
            reshaped = reshaped or _op(value, "reshape")
            value = self._value(value.args[0])
        if not (reshaped and _op(value, "broadcast_to")):
            return None
        bcast = value
        x, full = bcast.args[0], _shape(bcast)
        xs = _shape(x)
        if out is None or full is None or xs is None or len(xs) != len(full) or len(full) < 4 or len(out) < 3:
            return None
        g = len(full) - 3
        repeats_one_axis = _same_dims(xs[:g] + xs[g + 1:], full[:g] + full[g + 1:])
        if not (_equal(xs[g], 1) and not _equal(full[g], 1) and repeats_one_axis):
            return None
        if not (_same_dims(out[-2:], full[-2:]) and _equal(out[-3], full[g - 1] * full[g])
                and _equal(_product(out[:-3]), _product(full[:g - 1]))):
            return None
        return x, full, out

    @staticmethod
    def _same_shape_broadcast(value) -> bool:
        if not _op(value, "broadcast_to"):
            return False
        a, b = _shape(value.args[0]), _shape(value)
        return a is not None and b is not None and _same_dims(a, b)

    def _repeated(self, x, full, out):
        """``reshape(broadcast_to(x, full), out)``: the repetition, after the op moved before it."""
        return relax.op.reshape(self.builder_.emit(relax.op.broadcast_to(x, relax.ShapeExpr(full))),
                                relax.ShapeExpr(out))

    def _sink(self, call: relax.Call):
        """The permute / scalar op on a repetition, moved before it; else None."""
        if _op(call, "permute_dims") and call.attrs.axes is not None:
            rep = self._repeat(call.args[0])
            axes = [int(a) for a in call.attrs.axes]
            rank = len(axes)
            if rep is None or axes[:-2] != list(range(rank - 2)):
                return None
            x, full, out = rep
            swap = axes[-2:] == [rank - 1, rank - 2]
            r5 = len(full)
            axes5 = list(range(r5 - 2)) + ([r5 - 1, r5 - 2] if swap else [r5 - 2, r5 - 1])
            new_x = self.builder_.emit(relax.op.permute_dims(x, axes5))
            full = [full[a] for a in axes5]
            out = out[:-2] + ([out[-1], out[-2]] if swap else out[-2:])
            return self._repeated(new_x, full, out)
        if _op(call, "multiply") or _op(call, "divide"):
            for i in (0, 1) if _op(call, "multiply") else (0,):
                rep, scalar = self._repeat(call.args[i]), call.args[1 - i]
                value = _constant(scalar)
                if rep is None or value is None or value.size != 1 or value.ndim > len(rep[2]):
                    continue
                x, full, out = rep
                op = relax.op.multiply if _op(call, "multiply") else relax.op.divide
                return self._repeated(self.builder_.emit(op(x, scalar)), full, out)
        return None

    def _matmul(self, call: relax.Call):
        """``matmul(A, repetition)`` as a matmul broadcasting the un-repeated operand; else None."""
        if not _op(call, "matmul"):
            return None
        rep, a_shape, result = self._repeat(call.args[1]), _shape(call.args[0]), _shape(call)
        if rep is None or a_shape is None or result is None or len(a_shape) < 3:
            return None
        x, full, _out = rep
        if not _equal(_product(a_shape[:-2]), _product(full[:-2])):
            return None
        a5 = self.builder_.emit(relax.op.reshape(call.args[0], relax.ShapeExpr(full[:-2] + a_shape[-2:])))
        product = self.builder_.emit(relax.op.matmul(a5, x, out_dtype=call.attrs.out_dtype))
        self.changed += 1
        return relax.op.reshape(product, relax.ShapeExpr(result))

    def visit_call_(self, call):  # noqa: N802 - TVM's visitor naming
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        new = self._matmul(call)
        if new is None:
            new = self._sink(call)
        return call if new is None else new


def matmul_repeated_heads(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each matmul of repeated heads reading the heads once (see the module docstring);
    ``mod`` itself when there is none."""
    rewrite = _Rewrite(mod)
    out = mod.clone()
    for name in entry_functions(mod):
        before = rewrite.changed
        new = rewrite.visit_expr(mod[name])
        if rewrite.changed > before:
            out[name] = new
    if not rewrite.changed:
        return mod
    return relax.transform.DeadCodeElimination(entry_functions(out))(out)
