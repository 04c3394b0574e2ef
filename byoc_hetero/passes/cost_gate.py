"""The cost gate (MergeCompilerRegions): which composites of regions too small to pay off go back.

As Torch-TensorRT's ``min_block_size``: a region with fewer than ``min_region_ops`` Relax ops, or
(``require_heavy_op``) without a conv/dense/matmul, goes back to TVM, as does a region whose
symbols the runtime could not bind from its arguments' shapes; the reason is recorded for every
op of it. :func:`gated_composites` names the composites; :mod:`.inline_composites` turns them
back into plain ops, and the stage merges again.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from .._relax import function_outputs, is_composite, is_region, op_calls, opaque_dims, region_composites, shape_of
from ..rules import CONST_DIGEST_ATTR, DecisionLog


HEAVY_OPS = frozenset({"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.matmul",
                       "relax.nn.conv2d_transpose", "relax.linear"})
"""Ops that make a region worth offloading (the cost gate's "compute-heavy" ops)."""


DEFAULT_MIN_REGION_OPS = 1
"""Default of the cost gate's minimum region size, in Relax ops (see docs/stages.md, "The cost gate")."""


def _gate_reason(ops: list[relax.Call], min_ops: int, require_heavy: bool) -> str | None:
    if len(ops) < min_ops:
        return f"region of {len(ops)} ops is below the cost gate (min_region_ops={min_ops})"
    if require_heavy and not any(c.op.name in HEAVY_OPS for c in ops):
        return "region has no compute-heavy op (conv, dense, matmul): cheaper left to llvm"
    return None


def gated_composites(before: tvm.IRModule, merged: tvm.IRModule, min_ops: int,
                      require_heavy: bool, log: DecisionLog) -> set[tvm.ir.GlobalVar]:
    """Composite functions of ``before`` that form regions of ``merged`` failing the cost gate."""
    # a region holds copies of the composites it calls: find each one's original among those of
    # the same rule and constants digest (so not every composite is compared with every other)
    composites: dict[tuple[str, str], list[tvm.ir.GlobalVar]] = {}
    for gv, f in before.functions.items():
        if is_composite(f):
            composites.setdefault(_composite_key(f), []).append(gv)
    gated = set()
    for func in merged.functions.values():
        if not is_region(func):
            continue
        inner = region_composites(func)
        ops = [c for f in inner for c in op_calls(f)]
        reason = _gate_reason(ops, min_ops, require_heavy) or _symbol_reason(func, inner)
        if reason is None:
            continue
        for local in inner:
            name = str(local.attrs["Composite"])
            for gv in composites.get(_composite_key(local), []):
                comp = before[gv]
                if tvm_ffi.structural_equal(comp.body, local.body, map_free_vars=True):
                    gated.add(gv)
                    for call in op_calls(comp):
                        log.add(name, call, reason)
    return gated


def _symbol_reason(region: relax.Function, inner: list[relax.Function]) -> str | None:
    """Why the runtime could not bind the symbols of ``region`` from its arguments' shapes (a
    symbol seen only inside expressions such as ``s77 * s27`` that are not all the same), else None."""
    def shapes(values):
        return [s for s in (shape_of(v) for v in values) if s is not None]

    boundary = shapes([p for p in region.params if isinstance(p.ty, relax.TensorType)] + function_outputs(region))
    inside = shapes([b.var for f in inner for block in f.body.blocks for b in block.bindings])
    return opaque_dims(boundary, inside)[1]


def _composite_key(func: relax.Function) -> tuple[str, str]:
    return str(func.attrs["Composite"]), str(func.attrs.get(CONST_DIGEST_ATTR, ""))
