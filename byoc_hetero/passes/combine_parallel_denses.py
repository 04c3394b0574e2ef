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

Biases (opt-in, ``BYOC_HETERO_COMBINE_BIASES=1``, read when the pass runs; off by default: session 16's
quiet A/B measured it slower, bench/GENERATE.md): a member whose product is read only by an ``add`` of a
float32 constant of its width (``[N_i]``, or ``[1, ..., N_i]``: one bias per output column, Qwen2's and
BERT's Q / K / V) is combined too; the wide product then gets one ``add`` of the concatenated biases
(zeros for the members without one), which the dense takes as its own bias, and each member's ``add``
is bound to its part of the split.
Each column is the same dot product plus the same bias as before. Qwen2.5-0.5B's Q / K / V
(``[896, 896]``, ``[896, 128]`` twice, each with a bias) are then one ``[896, 1152]`` dense.

Why. The Llama-family decoder projects each layer's normalized input three times (Q, K, V:
SmolLM-135M's ``[576, 576]``, ``[576, 192]``, ``[576, 192]``). On 2 threads oneDNN runs the two
192-wide projections at ~60 % of the throughput of one 960-wide product (bare primitives,
weights flushed from cache before each call, loaded machine: minima 0.18-0.25 ms each against
0.59-0.69 ms for the 960-wide one, 0.40-0.46 ms for the 576-wide; see bench/LLM.md, session 6):
one dense and a split are fewer, fuller steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

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
BIASES_VARIABLE = "BYOC_HETERO_COMBINE_BIASES"
"""``1``: members with a per-column constant bias are combined too (module docstring); ``0`` / unset: not."""


def combine_biases() -> bool:
    """Whether ``BYOC_HETERO_COMBINE_BIASES`` asks for biased members to be combined; another value than
    ``0`` / ``1`` (or empty) is a ValueError naming the variable."""
    value = os.environ.get(BIASES_VARIABLE, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{BIASES_VARIABLE} must be 0 or 1, got {value!r}")
    return value == "1"


@dataclass
class _Member:
    """One dense of a group: its matmul binding, ``[K, N]`` weight, and (biased members) the binding of the
    ``add`` that reads it and the bias as ``[N]``."""
    binding: relax.VarBinding
    weight: np.ndarray
    bias_binding: relax.VarBinding | None = None
    bias: np.ndarray | None = None

    @property
    def out(self) -> relax.Var:
        """The variable the member's readers read: the bias add's, else the product's."""
        return (self.bias_binding or self.binding).var


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


def _bias(var: relax.Var, width: int, readers: dict, bindings: dict) -> tuple | None:
    """(the add binding, the bias as ``[width]`` float32) when ``var``'s only reader is an ``add`` of it and a
    float32 constant of one value per output column; else None."""
    found = readers.get(var, [])
    if len(found) != 1 or _op(found[0][1]) != "relax.add":
        return None
    reader_var, add = found[0]
    others = [a for a in add.args if not (isinstance(a, relax.Var) and a.same_as(var))]
    if len(others) != 1 or not isinstance(others[0], tvm.ir.GenericConst):
        return None
    bias = tensor_view(others[0].value)
    if bias.dtype != np.float32 or bias.ndim < 1 or bias.shape[-1] != width or bias.size != width:
        return None
    if getattr(reader_var.ty, "ndim", -1) != getattr(var.ty, "ndim", -2):  # the add broadcasts no further
        return None
    return bindings[reader_var], bias.reshape(width)


def _readers(func: relax.Function) -> dict:
    out: dict = {}
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call):
                for arg in b.value.args:
                    if isinstance(arg, relax.Var):
                        out.setdefault(arg, []).append((b.var, b.value))
    return out


def _groups(block: relax.DataflowBlock, lookup: Callable, readers: dict, biases: bool) -> list[list[_Member]]:
    """Members of each group to combine, in binding order (biased ones only when ``biases``)."""
    by_key: dict = {}
    bindings = {b.var: b for b in block.bindings if isinstance(b, relax.VarBinding)}
    for b in block.bindings:
        if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call):
            found = _candidate(b.value, lookup)
            if found is not None:
                by_key.setdefault(found[0], []).append(_Member(b, found[1]))
    groups = []
    for members in by_key.values():
        kept = []
        for m in members:
            if not _has_epilogue(m.binding.var, readers):
                kept.append(m)
                continue
            bias = _bias(m.binding.var, m.weight.shape[1], readers, bindings) if biases else None
            if bias is not None and bias[0].var in bindings and not _has_epilogue(bias[0].var, readers):
                m.bias_binding, m.bias = bias
                kept.append(m)
        if len(kept) >= 2 and len({m.weight.shape[0] for m in kept}) == 1:
            groups.append(kept)
    return groups


def _combine(block: relax.DataflowBlock, groups: list[list[_Member]]) -> relax.DataflowBlock:
    """``block`` with each group's first member replaced by the combined matmul (and its bias add), its
    split and the member's part, and the other members by their parts (a biased member's product dropped,
    its add bound to its part)."""
    bb = relax.BlockBuilder()
    replace: dict = {}
    for members in groups:
        first = members[0].binding
        weight = np.ascontiguousarray(np.concatenate([m.weight for m in members], axis=1))
        call = bb.normalize(relax.op.matmul(first.value.args[0], relax.const(weight), out_dtype="float32"))
        wide = relax.DataflowVar(first.var.name + "_combined", call.ty)
        new = [relax.VarBinding(wide, call)]
        if any(m.bias is not None for m in members):
            bias = np.concatenate([m.bias if m.bias is not None else np.zeros(m.weight.shape[1], "float32")
                                   for m in members])
            add = bb.normalize(relax.op.add(wide, relax.const(bias)))
            wide = relax.DataflowVar(first.var.name + "_biased", add.ty)
            new.append(relax.VarBinding(wide, add))
        ends = np.cumsum([m.weight.shape[1] for m in members])[:-1]
        split = bb.normalize(relax.op.split(wide, [int(e) for e in ends], axis=-1))
        parts = relax.DataflowVar(first.var.name + "_parts", split.ty)
        new.append(relax.VarBinding(parts, split))
        replace[first.var] = new
        for i, m in enumerate(members):
            if m.bias_binding is not None and i > 0:
                replace[m.binding.var] = []
            replace.setdefault(m.out, [])
            replace[m.out] = replace[m.out] + [relax.VarBinding(m.out, relax.TupleGetItem(parts, i))]
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
        lookup, readers, biases = bound_values(func).get, _readers(func), combine_biases()
        blocks, changed = [], False
        for block in func.body.blocks:
            groups = _groups(block, lookup, readers, biases) if isinstance(block, relax.DataflowBlock) else []
            blocks.append(_combine(block, groups) if groups else block)
            changed = changed or bool(groups)
        if changed:
            out = out if out is not None else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
            out[name] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                       func.is_pure, func.attrs)
    if out is None:
        return mod
    return relax.transform.DeadCodeElimination(entry_functions(out))(out)
