"""Which dtypes the oneDNN runtime computes in: the one place checks and lowering ask.

Tensors the runtime reads and writes are float32 (:data:`RUNTIME_DTYPES`): a check asks
:func:`dtype_reason` instead of comparing with ``"float32"``. Separately, a partition has a compute
*precision* (:data:`PRECISIONS`): with ``"bf16"`` the codegen writes ``"precision": "bf16"`` into
each region graph and the runtime runs conv2d / dense / matmul on bf16 copies of their inputs
(weights converted once at load) with f32 accumulation, where the CPU has native bf16
(:func:`effective_precision`). A conv2d, dense or matmul node may carry its own ``precision``
(the backend option ``node_precisions``: a tuner's per-node decision, :func:`apply_node_precisions`),
which wins over the region's.
"""

from __future__ import annotations

import json
from typing import Any

from tvm import relax

from ..._relax import shape_of, static_shape, tensor_dtype
from .table import graph_pass

RUNTIME_DTYPES: tuple[str, ...] = ("float32",)
"""Tensor dtypes the runtime's kernels read and write."""

DEFAULT_DTYPE = RUNTIME_DTYPES[0]


def dtype_reason(dtype: str, name: str) -> str | None:
    """Why a tensor of ``dtype`` (named ``name`` in the message) cannot run; None if it can."""
    if dtype in RUNTIME_DTYPES:
        return None
    return f"{name} has dtype {dtype or 'non-tensor'}; the runtime runs {', '.join(RUNTIME_DTYPES)} only"


def out_dtype_reason(out_dtype, op: str) -> str | None:
    """Why an op's ``out_dtype`` attribute cannot be honoured; None if the default or supported."""
    if out_dtype is None or str(out_dtype) in ("", "void", *RUNTIME_DTYPES):
        return None
    return f"{op} out_dtype {out_dtype}; the runtime writes {', '.join(RUNTIME_DTYPES)}"


def tensor_reason(expr: relax.Expr, name: str, symbolic: bool = False,
                  static_dims: tuple[int, ...] = ()) -> str | None:
    """Why a value cannot be a runtime tensor; None if it can.

    By default its shape must be static. With ``symbolic=True`` (an op whose kernel plans any
    binding of the dims, docs/region-format.md "Symbolic shapes") dims may be symbolic when they
    are written in the region format's dim language (symbols, ints, + - * //), except the axes
    ``static_dims`` (negative: from the end), which the op needs static (e.g. a dense's K).
    """
    reason = dtype_reason(tensor_dtype(expr), name)
    if reason:
        return reason
    if static_shape(expr) is not None:
        return None
    if not symbolic:
        return f"{name} has a symbolic or unknown shape {expr.ty}; the runtime needs static shapes for this op"
    shape = shape_of(expr)
    if shape is None:
        return (f"{name} has the shape {expr.ty}, whose rank is unknown or whose dims use more than "
                "symbols, integers, + - * //; the runtime cannot evaluate it")
    for axis in static_dims:
        if -len(shape) <= axis < len(shape) and not isinstance(shape[axis], int):
            return f"{name} has the shape {list(shape)}, whose dim {axis} must be static for this op"
    return None


# -- compute precision of a partition (bf16) ------------------------------------------------------
PRECISIONS: tuple[str, ...] = ("f32", "bf16")
"""What ``precision=`` may say: ``f32`` (default) or ``bf16`` (bf16 weights and activations with f32
accumulation in conv2d / dense / matmul; region inputs and outputs, softmax, normalizations,
pooling and reductions stay float32)."""

DEFAULT_PRECISION = PRECISIONS[0]

_warned: set[str] = set()


def check_precision(precision: str) -> str:
    """``precision`` itself when it is one of :data:`PRECISIONS`; else a :class:`RuleError`."""
    from ...errors import RuleError

    if precision not in PRECISIONS:
        raise RuleError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def effective_precision(precision: str) -> tuple[str, str]:
    """``(precision the runtime computes in now, why it differs or "")`` for a request.

    A bf16 request runs float32 where oneDNN has no native bf16 (below ``avx512_core_bf16``: its
    emulation would be slower than float32) or where ``BYOC_HETERO_BF16=off`` switches it off.
    """
    from ..._native import _C

    effective, reason = _C.effective_precision(check_precision(precision))
    return effective, reason


def warn_if_fallback(precision: str) -> str:
    """The effective precision of a request; warns once per reason when bf16 runs as float32."""
    import warnings

    effective, reason = effective_precision(precision)
    if reason and reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"precision='bf16' requested, the regions run float32: {reason}",
                      RuntimeWarning, stacklevel=3)
    return effective


VNNI_ISAS: tuple[str, ...] = ("avx2_vnni", "avx2_vnni_2", "avx512_core_vnni", "avx512_core_bf16",
                              "avx512_core_fp16", "avx512_core_amx", "avx512_core_amx_fp16")
"""oneDNN ISAs with VNNI (``vpdpbusd``: u8 x s8 products summed in 32 bits)."""


def int8_kernels_reason() -> str | None:
    """Why oneDNN's int8 conv2d / dense / matmul would not be exact on this CPU; None where they are.

    Below VNNI (plain AVX2 or AVX-512: Zen 2/3, Skylake-SP), oneDNN 3.2's x86 int8 kernels add each
    pair of u8 x s8 products in 16 bits (``vpmaddubsw``), which saturates where two products exceed
    32767 (255 x 127 x 2 does): with ``ONEDNN_MAX_CPU_ISA=AVX2`` a one-conv QDQ model was 29
    quantization steps off numpy's exact result (tests/test_int8.py). There the int8 fusions do not
    fire: the conv / dense / matmul compute float32 between the Q/DQ steps inside the region (exact,
    slower). ``BYOC_HETERO_INT8=saturating`` keeps oneDNN's int8 kernels anyway.
    """
    import os

    from ..._native import _C

    isa = _C.isa()
    if isa in VNNI_ISAS or os.environ.get("BYOC_HETERO_INT8", "") == "saturating":
        return None
    return (f"oneDNN's int8 kernels on {isa} (no VNNI) sum u8 x s8 pairs in 16 bits and saturate; "
            "int8 conv2d / dense / matmul compute float32 between their Q/DQ steps")


def int8_kernels_exact() -> bool:
    """Whether the int8 fusions may run (see :func:`int8_kernels_reason`); warns once where not."""
    import warnings

    reason = int8_kernels_reason()
    if reason and reason not in _warned:
        _warned.add(reason)
        warnings.warn(reason, RuntimeWarning, stacklevel=3)
    return reason is None


# -- per-node precision (a tuner's decisions; backend option ``node_precisions``) -----------------
PRECISION_OPS: tuple[str, ...] = ("conv2d", "dense", "matmul")
"""The nodes whose compute precision a region's ``precision`` sets and a node's own may override."""


def node_key(symbol: str, index: int) -> str:
    """The key of node ``index`` of region ``symbol`` in the option ``node_precisions``: a place in
    one partitioned model (equal convolutions at two places may get two precisions)."""
    return f"{symbol}#{int(index)}"


def check_node_precisions(value: Any) -> str:
    """Validate the option ``node_precisions``: JSON ``{"<region symbol>#<node index>": "f32" | "bf16"}``."""
    from ...errors import RuleError

    try:
        table = json.loads(str(value))
    except json.JSONDecodeError as err:
        raise RuleError(f"option node_precisions of backend 'onednn' must be JSON, got {str(value)[:60]!r}: "
                        f"{err}") from err
    if not isinstance(table, dict):
        raise RuleError(f"option node_precisions of backend 'onednn' must be a JSON object, got {type(table).__name__}")
    for key, precision in table.items():
        symbol, _, index = str(key).rpartition("#")
        if not symbol or not index.isdigit():
            raise RuleError(f"option node_precisions: key {key!r} is not '<region symbol>#<node index>'")
        if precision not in PRECISIONS:
            raise RuleError(f"option node_precisions: node {key} asks for {precision!r}; "
                            f"expected one of {list(PRECISIONS)}")
    return json.dumps(table, sort_keys=True)


def node_precision_reason(nodes: list[Any], index: int) -> str | None:
    """Why node ``index`` of a region graph's ``nodes`` (:class:`~.lowering.Node` s or the
    document's node dicts) takes no ``precision``; None when it is a float conv2d / dense / matmul."""
    if index >= len(nodes):
        return f"no node (the region has {len(nodes)})"
    node = nodes[index]
    op, attrs = (node["op"], node.get("attrs", {})) if isinstance(node, dict) else (node.op, node.attrs)
    if op not in PRECISION_OPS:
        return f"{'an' if op[:1] in 'aeiou' else 'a'} {op}"
    if "src_scale" in attrs:
        return f"an int8 {op}"
    return None


@graph_pass
def apply_node_precisions(graph) -> None:
    """Each conv2d / dense / matmul node the backend option ``node_precisions`` names (by region
    symbol and node index) gets that ``precision`` attr, which the runtime honours over the
    region's (cpp/kernels/kernel.cc, NodeComputesBf16). Why: a whole model is often one region,
    and a tuner keeps only the layers whose bf16 rounding moves the output most in f32; the
    decision must reach the node the layer became, after every other pass: it runs last, so a
    node index is the one of the serialized graph (what ``bh.report`` and a tuner read), and it
    changes no node's place. A key naming another kind of node is a RuleError (only anchors have
    a precision)."""
    chosen = graph.options.get("node_precisions")
    if not chosen:
        return
    from ...errors import RuleError

    for key, precision in json.loads(str(chosen)).items():
        symbol, _, index = key.rpartition("#")
        if symbol != graph.symbol:
            continue
        what = node_precision_reason(graph.nodes, int(index))
        if what:
            raise RuleError(f"option node_precisions: node {key} is {what}; only float "
                            f"{', '.join(PRECISION_OPS)} nodes take a precision")
        graph.nodes[int(index)].attrs["precision"] = precision
