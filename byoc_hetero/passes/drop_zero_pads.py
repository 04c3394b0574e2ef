"""Drop ``nn.pad`` calls that pad nothing (every width zero): the call becomes its input.

Why: Swin's ``maybe_pad`` pads each window stage up to a multiple of the window size, and at the
sizes where nothing is needed torch.export still writes ``pad(x, [0, 0, 0, 0, 0, 0])``. The call is
the identity, but as a pad it matches no rule unless a conv2d reads it (which can absorb a pad into
its own padding), so it stayed on llvm and split Swin-T into 16 regions. (The ONNX path's zero
``Pad`` nodes are removed in the protobuf before import: :mod:`.fold_zero_pads`.)
"""

from __future__ import annotations

import tvm
from tvm import relax

from .._relax import op_name


def _is_zero_pad(call: relax.Call) -> bool:
    if op_name(call) != "relax.nn.pad":
        return False
    widths = getattr(call.attrs, "pad_width", None)
    return widths is not None and all(int(w) == 0 for w in widths)


def drop_zero_pads(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every zero-width ``nn.pad`` replaced by its input (``mod`` itself when none)."""

    @relax.expr_functor.mutator
    class _Dropper(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM's visitor name
            call = super().visit_call_(call)
            return call.args[0] if isinstance(call, relax.Call) and _is_zero_pad(call) else call

    found = any(_is_zero_pad(b.value) for f in mod.functions.values() if isinstance(f, relax.Function)
                for block in getattr(f.body, "blocks", []) for b in block.bindings
                if isinstance(b.value, relax.Call))
    if not found:
        return mod
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gvar] = _Dropper(mod).visit_expr(func)
    return relax.transform.CanonicalizeBindings()(out)
