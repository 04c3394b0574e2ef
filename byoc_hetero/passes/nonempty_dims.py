"""Pass ``nonempty_dims`` (Relax, after the torch import): a declared lower bound of 0 becomes 1."""

from __future__ import annotations

import tvm

from ..inputs import LOWER_BOUND_ATTR


def nonempty_dims(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each declared lower bound of 0 raised to 1.

    Why: ``torch.export.Dim("S", max=2048)`` declares ``0 <= S`` (torch's default min), but the
    regions' documents (and the runtime's kernels) take dims of at least 1: a bound of 0 made the
    codegen fail on a model that is otherwise fine ("field 'dim_ranges.s70': expected [min, max]
    (integers >= 1 or null), got [0,2048]"). With 1, a call with an empty dim gets the range
    check's :class:`InputError` instead.
    """
    func = mod["main"]
    attrs = func.attrs if func.attrs is not None else {}
    if LOWER_BOUND_ATTR not in attrs or all(int(v) >= 1 for v in attrs[LOWER_BOUND_ATTR].values()):
        return mod
    lower = {str(k): max(1, int(v)) for k, v in attrs[LOWER_BOUND_ATTR].items()}
    out = mod.clone()
    out["main"] = func.with_attr(LOWER_BOUND_ATTR, lower)
    return out
