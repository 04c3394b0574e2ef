"""combine_parallel_denses: matmuls of one input by constant weights as one wider matmul and a split.

What it rewrites. In each dataflow block of the entry functions, the calls ``matmul(a_i, W_i)``
whose ``a_i`` are one tensor (the same variable, or reshapes of one variable to one shape, as
torch.export writes ``x.view(-1, K)`` once per projection) and whose ``W_i`` are float32
constants of rank 2 (``[K, N_i]``, or ``permute_dims`` of an ``[N_i, K]`` constant: torch's
``Linear``) become one ``matmul(a, W)`` with ``W = [W_0 | W_1 | ...]`` concatenated on the host at
bind time (one ``[K, sum N_i]`` constant), then ``split`` along the last axis; each original
variable is bound to its part of the split. Each output column is the same dot product over
``K`` as before, in the same order, so the values do not change.

Left as they are: a member whose output (directly or through reshapes) is read by what the
dense runs as its epilogue: an activation (SwiGLU's ``silu(x W_gate)``) or an add / subtract /
multiply by a constant (BERT's and GPT-2's Q / K / V biases); the others of its group are still
combined. Separate, that dense applies it as a bias or post-op of its own output; combined, it
would read a column slice and be a step of its own. Groups of one; weights that are no
constants; other dtypes.

Why. The Llama-family decoder projects each layer's normalized input three times (Q, K, V:
SmolLM-135M's ``[576, 576]``, ``[576, 192]``, ``[576, 192]``). On 2 threads oneDNN runs the two
192-wide projections at ~60 % of the throughput of one 960-wide product (bare primitives,
weights flushed from cache before each call, loaded machine: minima 0.18-0.25 ms each against
0.59-0.69 ms for the 960-wide one, 0.40-0.46 ms for the 576-wide; see bench/LLM.md, session 6):
one dense and a split are fewer, fuller steps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from .._relax import bound_values, entry_functions, tensor_view
from .._relax import op_name as _op

__all__ = ["combine_parallel_denses"]

_ACTIVATIONS = frozenset({
    "relax.nn.silu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.relu", "relax.nn.leakyrelu",
    "relax.sigmoid", "relax.tanh", "relax.nn.softplus", "relax.nn.selu", "relax.exp", "relax.erf",
})
_CONSTANT_EPILOGUES = frozenset({"relax.add", "relax.subtract", "relax.multiply"})


def _weight(w: relax.Expr, lookup: Callable) -> np.ndarray | None:
    """The ``[K, N]`` float32 array a matmul's second operand holds, or None (not a constant)."""
    if isinstance(w, relax.Var):
        value = lookup(w)
        if _op(value) != "relax.permute_dims" or not isinstance(value.args[0], tvm.ir.GenericConst):
            return None
        axes = value.attrs.axes
        if axes is not None and [int(a) for a in axes] != [1, 0]:
            return None
        w, transpose = value.args[0], True
    elif isinstance(w, tvm.ir.GenericConst):
        transpose = False
    else:
        return None
    data = tensor_view(w.value)  # no copy: every dense weight of the block is read here (issue 36)
    if data.ndim != 2 or data.dtype != np.float32:
        return None
    return data.T if transpose else data


def _lhs_key(a: relax.Expr, lookup: Callable):
    """What identifies the left operand: the variable, or (source, shape) for a reshape of one."""
    value = lookup(a) if isinstance(a, relax.Var) else None
    if _op(value) == "relax.reshape" and isinstance(value.args[0], relax.Var):
        shape = getattr(a.ty, "shape", None)
        if shape is not None and all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            return (value.args[0], tuple(int(d) for d in shape))
    return (a, None)


def _candidate(call: relax.Call, lookup: Callable):
    """(lhs key, [K, N] weight) of a matmul this pass may combine, or None."""
    if _op(call) != "relax.matmul" or getattr(call.ty, "dtype", None) != "float32":
        return None
    a, w = call.args
    if getattr(a.ty, "dtype", None) != "float32" or getattr(a.ty, "ndim", -1) < 2:
        return None
    weight = _weight(w, lookup)
    if weight is None or weight.shape[1] == 0:
        return None
    return _lhs_key(a, lookup), weight


def _has_epilogue(var: relax.Var, readers: dict) -> bool:
    """Whether ``var`` (or a reshape of it, at any depth) is read by what a dense runs as its
    epilogue: an activation, or a bias / scale (add, subtract, multiply by a constant)."""
    for reader_var, reader in readers.get(var, []):
        if _op(reader) in _ACTIVATIONS:
            return True
        if _op(reader) in _CONSTANT_EPILOGUES and any(isinstance(a, tvm.ir.GenericConst) for a in reader.args):
            return True
        if _op(reader) == "relax.reshape" and _has_epilogue(reader_var, readers):
            return True
    return False


def _readers(func: relax.Function) -> dict:
    out: dict = {}
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call):
                for arg in b.value.args:
                    if isinstance(arg, relax.Var):
                        out.setdefault(arg, []).append((b.var, b.value))
    return out


def _groups(block: relax.DataflowBlock, lookup: Callable, readers: dict) -> list[list[tuple]]:
    """Members (binding, weight) of each group to combine, in binding order."""
    by_key: dict = {}
    for b in block.bindings:
        if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call):
            found = _candidate(b.value, lookup)
            if found is not None:
                by_key.setdefault(found[0], []).append((b, found[1]))
    groups = []
    for members in by_key.values():
        members = [(b, w) for b, w in members if not _has_epilogue(b.var, readers)]
        if len(members) >= 2 and len({w.shape[0] for _, w in members}) == 1:
            groups.append(members)
    return groups


def _combine(block: relax.DataflowBlock, groups: list[list[tuple]]) -> relax.DataflowBlock:
    """``block`` with each group's first member replaced by the combined matmul, its split and
    the member's part, and the other members by their parts."""
    bb = relax.BlockBuilder()
    replace: dict = {}
    for members in groups:
        first = members[0][0]
        weight = np.ascontiguousarray(np.concatenate([w for _, w in members], axis=1))
        call = bb.normalize(relax.op.matmul(first.value.args[0], relax.const(weight), out_dtype="float32"))
        wide = relax.DataflowVar(first.var.name + "_combined", call.ty)
        ends = np.cumsum([w.shape[1] for _, w in members])[:-1]
        split = bb.normalize(relax.op.split(wide, [int(e) for e in ends], axis=-1))
        parts = relax.DataflowVar(first.var.name + "_parts", split.ty)
        new = [relax.VarBinding(wide, call), relax.VarBinding(parts, split)]
        for i, (b, _) in enumerate(members):
            part = relax.VarBinding(b.var, relax.TupleGetItem(parts, i))
            replace[b.var] = new + [part] if i == 0 else [part]
    bindings = []
    for b in block.bindings:
        bindings.extend(replace.get(getattr(b, "var", None), [b]))
    return relax.DataflowBlock(bindings)


def combine_parallel_denses(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each group of matmuls of one input by constant weights as one matmul and a
    split (see the module docstring); ``mod`` itself when there is none."""
    out = None
    for name in entry_functions(mod):
        func = mod[name]
        if not isinstance(func.body, relax.SeqExpr):
            continue
        lookup, readers = bound_values(func).get, _readers(func)
        blocks, changed = [], False
        for block in func.body.blocks:
            groups = _groups(block, lookup, readers) if isinstance(block, relax.DataflowBlock) else []
            blocks.append(_combine(block, groups) if groups else block)
            changed = changed or bool(groups)
        if changed:
            out = out if out is not None else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
            out[name] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                       func.is_pure, func.attrs)
    if out is None:
        return mod
    return relax.transform.DeadCodeElimination(entry_functions(out))(out)
