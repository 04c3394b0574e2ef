"""The cost gate (MergeCompilerRegions): which composites of regions too small to pay off go back.

As Torch-TensorRT's ``min_block_size``: a region with fewer than ``min_region_ops`` Relax ops, or
(``require_heavy_op``) without a conv/dense/matmul, goes back to TVM, as does a region whose
symbols the runtime could not bind from its arguments' shapes; the reason is recorded for every
op of it. :func:`gated_composites` names the composites; :mod:`.inline_composites` turns them
back into plain ops, and the stage merges again.

A *codegen map* (``region_codegen``: :func:`region_key` → ``"llvm"`` or the region's backend)
overrides the fixed rule for the regions it names: ``bh.tune`` writes one from timings of each
region offloaded and on llvm (``byoc_hetero/tune/codegen.py``), a user may write one by hand. A
region the runtime cannot bind symbols for goes back whatever the map says (that is correctness,
not cost).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import tvm
import tvm_ffi
from tvm import relax

from .._relax import function_outputs, is_composite, is_region, op_calls, opaque_dims, region_composites, shape_of
from ..errors import RuleError
from ..rules import CONST_DIGEST_ATTR, DecisionLog, get_target


HEAVY_OPS = frozenset({"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.matmul",
                       "relax.nn.conv2d_transpose", "relax.linear"})
"""Ops that make a region worth offloading (the cost gate's "compute-heavy" ops)."""


DEFAULT_MIN_REGION_OPS = 1
"""Default of the cost gate's minimum region size, in Relax ops (see docs/stages.md, "The cost gate")."""


def gate_reason(ops: list[relax.Call], min_ops: int, require_heavy: bool) -> str | None:
    if len(ops) < min_ops:
        return f"region of {len(ops)} ops is below the cost gate (min_region_ops={min_ops})"
    if require_heavy and not any(c.op.name in HEAVY_OPS for c in ops):
        return "region has no compute-heavy op (conv, dense, matmul): cheaper left to llvm"
    return None


HOST = "llvm"
"""The codegen a codegen map names for "leave this region to TVM"."""


def region_key(region: relax.Function) -> str:
    """A digest of what a region computes and at which shapes — its backend, parameter types, and
    for each composite in order its rule and each op's name, attributes and argument types — but
    not its weights' values nor its variables' names: a ResNet's repeated blocks share a key, so a
    codegen map or a timing names them once."""
    def arg(a: relax.Expr) -> str:
        if isinstance(a, tvm.ir.Constant):
            return f"const {a.ty}"
        return str(a.ty) if isinstance(a, relax.Var) else str(a)  # a shape or prim value: as written

    parts = [str(region.attrs["Codegen"])] + [str(p.ty) for p in region.params]
    for comp in region_composites(region):
        parts.append(str(comp.attrs["Composite"]))
        parts.extend(f"{c.op.name} {c.attrs} ({', '.join(arg(a) for a in c.args)})" for c in op_calls(comp))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def gated_composites(before: tvm.IRModule, merged: tvm.IRModule, min_ops: int,
                      require_heavy: bool, log: DecisionLog,
                      codegen: Mapping[str, str] | None = None, used: set[str] | None = None) -> set[tvm.ir.GlobalVar]:
    """Composite functions of ``before`` that form regions of ``merged`` failing the cost gate
    (or sent to llvm by the codegen map ``codegen``; the keys it applied are added to ``used``)."""
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
        reason = _symbol_reason(func, inner)
        key = region_key(func) if codegen and reason is None else None
        if key is not None and key in codegen:
            reason = _mapped_reason(func, key, codegen[key])
            if used is not None:
                used.add(key)
        elif reason is None:
            reason = gate_reason(ops, min_ops, require_heavy)
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


def _mapped_reason(region: relax.Function, key: str, codegen: str) -> str | None:
    """The codegen map's verdict on a region: the reason for llvm, else None (offload: on its own
    backend, or on another one, which :mod:`.retarget_regions` hands it to after merging)."""
    own = get_target(str(region.attrs["Codegen"])).name
    if codegen == own:
        return None
    if codegen == HOST:
        return f"region_codegen keeps region {key} on {HOST}"
    get_target(codegen)  # a RuleError naming an unknown backend; a known one gets the region after merging
    return None


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
