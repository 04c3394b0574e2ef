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

import hashlib
import json
import re
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
    """The positional key of node ``index`` of region ``symbol`` in the option ``node_precisions``:
    a place in one partitioned model (what ``bh.report`` shows; a hand-written option may use it)."""
    return f"{symbol}#{int(index)}"


_CONTENT_KEY = re.compile(r"[a-z0-9_]+\.[0-9a-f]{12}\.[0-9]+")


def _field(item: Any, name: str) -> Any:
    """``name`` of a region document's node / graph (a dict) or of a lowering one (attributes)."""
    return item[name] if isinstance(item, dict) else getattr(item, name)


def _constant_sources(graph: Any) -> dict[int, str]:
    """Tensor -> the content digest it is made from, for each tensor known when the region is
    initialized: a constant's own digest; a node computing from such tensors alone (a batch norm
    folded into a weight, a dequantize of int8 weights) has its first input's."""
    found = {c["tensor"]: str(c.get("digest", c.get("name", ""))) for c in _field(graph, "constants")}
    for node in _field(graph, "nodes"):
        inputs = _field(node, "inputs")
        if inputs and all(t in found for t in inputs):
            found[_field(node, "output")] = found[inputs[0]]
    return found


def _content(graph: Any, node: Any, sources: dict[int, str]) -> str:
    """What a conv2d / dense / matmul node computes, in terms no region pass moves: its op and its
    weight's shape and content digest, or, for a product of two run-time values (attention's
    scores), its op and both operands' shapes."""
    tensors, inputs = _field(graph, "tensors"), _field(node, "inputs")[:2]
    if len(inputs) == 2 and inputs[1] in sources:
        parts = [_field(node, "op"), tensors[inputs[1]]["shape"], sources[inputs[1]]]
    else:
        parts = [_field(node, "op"), [tensors[t]["shape"] for t in inputs]]
    return json.dumps(parts, default=str)


def content_keys(symbol: str, graph: Any) -> list[str | None]:
    """The content key of each node of a region graph (a document or a lowering ``RegionGraph``) in
    the option ``node_precisions``, None for a node of no :data:`PRECISION_OPS` kind:
    ``<symbol>#<op>.<digest of what it computes>.<n>`` (``n``: how many earlier nodes of the region
    compute the same, usually 0).

    Why not the node's index: the region-graph passes between the partition a tuner measured and
    the one it applies its decisions to may differ (a bf16 region keeps attention unfused, an int8
    neighbour changes what fuses), which moves every later node (issue 35: BERT-base's keys met a
    reshape). A node's weight (its content digest) and shapes are the same in both."""
    sources, seen, out = _constant_sources(graph), {}, []
    for node in _field(graph, "nodes"):
        op = _field(node, "op")
        if op not in PRECISION_OPS:
            out.append(None)
            continue
        digest = hashlib.sha256(_content(graph, node, sources).encode()).hexdigest()[:12]
        n = seen[(op, digest)] = seen.get((op, digest), -1) + 1
        out.append(f"{symbol}#{op}.{digest}.{n}")
    return out


def locate_node(key: str, graph: Any) -> int | None:
    """The index of the node ``key`` names in region graph ``graph`` (a document or a lowering
    ``RegionGraph``): a content key (:func:`content_keys`) or a positional one (:func:`node_key`);
    None where no node of the graph has that content or index."""
    rest = str(key).rpartition("#")[2]
    if rest.isdigit():
        return int(rest) if int(rest) < len(_field(graph, "nodes")) else None
    symbol = str(key).rpartition("#")[0]
    keys = content_keys(symbol, graph)
    return keys.index(key) if key in keys else None


def check_node_precisions(value: Any) -> str:
    """Validate the option ``node_precisions``: JSON ``{"<region symbol>#<node>": "f32" | "bf16"}``,
    a node named by its index or by its content key (:func:`content_keys`)."""
    from ...errors import RuleError

    try:
        table = json.loads(str(value))
    except json.JSONDecodeError as err:
        raise RuleError(f"option node_precisions of backend 'onednn' must be JSON, got {str(value)[:60]!r}: "
                        f"{err}") from err
    if not isinstance(table, dict):
        raise RuleError(f"option node_precisions of backend 'onednn' must be a JSON object, got {type(table).__name__}")
    for key, precision in table.items():
        symbol, _, node = str(key).rpartition("#")
        if not symbol or not (node.isdigit() or _CONTENT_KEY.fullmatch(node)):
            raise RuleError(f"option node_precisions: key {key!r} is not '<region symbol>#<node index>' or "
                            "'<region symbol>#<op>.<12 hex digits>.<n>' (a content key)")
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
    symbol and content key, :func:`content_keys`, or node index) gets that ``precision`` attr, which
    the runtime honours over the region's (cpp/kernels/kernel.cc, NodeComputesBf16). Why: a whole
    model is often one region, and a tuner keeps only the layers whose bf16 rounding moves the
    output most in f32; the decision must reach the node the layer became, after every other pass:
    it runs last, so a node index is the one of the serialized graph (what ``bh.report`` and a
    tuner read), and it changes no node's place. A key naming another kind of node, or no node, is
    a RuleError (only anchors have a precision)."""
    chosen = graph.options.get("node_precisions")
    if not chosen:
        return
    from ...errors import RuleError

    found: dict[str, int] | None = None  # content key -> node index, worked out once
    for key, precision in json.loads(str(chosen)).items():
        if key.rpartition("#")[0] != graph.symbol:
            continue
        if found is None:
            found = {k: i for i, k in enumerate(content_keys(graph.symbol, graph)) if k is not None}
        index = found[key] if key in found else locate_node(key, graph)
        what = (node_precision_reason(graph.nodes, index) if index is not None else
                f"no node of the region (none with that index or content among its {len(graph.nodes)})")
        if what:
            raise RuleError(f"option node_precisions: node {key} is {what}; only float "
                            f"{', '.join(PRECISION_OPS)} nodes take a precision")
        graph.nodes[index].attrs["precision"] = precision
