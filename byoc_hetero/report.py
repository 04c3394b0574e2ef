"""What went where, and why: the partition report.

``report(mod)`` after (any of) the partition stages gives the op counts per target, every region
(its ops, inputs, outputs, FLOPs and the rules that matched) and, for every op left to TVM (llvm),
the reason: no rule matched it; a rule's check rejected it (which rule, and what it said); or its
region fell below the cost gate. ``print()`` shows a table; ``to_dot()``/``render()`` draw the
partitioned graph with one colour per target (``.svg``/``.html`` with pip packages only).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import tvm
from tvm import relax

from ._relax import (
    document_tensor_text,
    called_function,
    local_functions,
    composite_name,
    describe,
    function_outputs,
    op_calls,
    op_name,
    RegionEntry,
    region_composites,
    region_table,
    region_target,
    short_op_name,
    static_shape,
)
from .errors import ByocError
from .picture import Graph, Node
from .profile import HOST, OpProfile, op_profile
from .rules import Rejection, latest_rejection, rejections

PALETTE = ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#c7e9c0")
HOST_COLOUR = "#e0e0e0"
_PLUMBING = {"call_dps_packed", "call_tir", "call_tir_with_grad", "call_pure_packed"}


@dataclass
class RegionReport:
    """One offloaded region."""

    symbol: str
    target: str
    ops: Counter
    rules: list[str]
    inputs: list[str]
    outputs: list[str]
    flops: int
    #: what the region computes in, as its runtime module says: "f32", "bf16", or
    #: "f32 (bf16 requested: <why not>)"; "" when unknown (not compiled yet, another runtime)
    precision: str = ""
    #: in a region with int8 ops: the node ops that compute in float32 inside it (between their
    #: own quantize / dequantize nodes), with counts; empty otherwise
    float32_ops: Counter = field(default_factory=Counter)
    #: matches the backend's region passes declined inside the region (they stay separate steps),
    #: as rejections of rule ``<target>:<pass>``: RoPE's ``fuse_rotary_embeddings`` writes them
    declined: list[Rejection] = field(default_factory=list)
    #: which algorithm the region's float32 2-D convolutions run (direct / Winograd) and why, from
    #: its runtime's plan: "winograd 4, direct 12 (...)"; "" without such convs or plan
    algorithms: str = ""


@dataclass
class FallbackOp:
    """An op left to TVM (llvm), with the reason."""

    op: str
    value: str
    reason: str
    rule: str | None = None


@dataclass
class PartitionReport:
    """The result of :func:`report`."""

    profile: OpProfile
    regions: list[RegionReport] = field(default_factory=list)
    fallbacks: list[FallbackOp] = field(default_factory=list)
    #: every rejection the partition stages recorded (including calls a larger rule took later),
    #: then the matches the regions' passes declined (:attr:`RegionReport.declined`)
    rejections: list[Rejection] = field(default_factory=list)
    dot: str = ""
    #: the same graph as data, for the pip-only pictures (:mod:`byoc_hetero.picture`)
    graph: Graph = field(default_factory=Graph, repr=False)

    @property
    def offloaded_flops(self) -> int:
        return sum(r.flops for r in self.regions)

    def __str__(self) -> str:
        lines = ["op counts per target", _indent(str(self.profile)), ""]
        lines.append(f"regions: {len(self.regions)}, {self.offloaded_flops / 1e6:.1f} MFLOP offloaded")
        header = f"  {'symbol':<44} {'target':<12} {'ops':>4} {'MFLOP':>9}  inputs -> outputs"
        lines.append(header)
        for r in self.regions:
            sym = r.symbol if len(r.symbol) <= 44 else r.symbol[:41] + "..."
            lines.append(
                f"  {sym:<44} {r.target:<12} {sum(r.ops.values()):>4} {r.flops / 1e6:>9.1f}  "
                f"{', '.join(r.inputs)} -> {', '.join(r.outputs)}"
            )
            lines.append(f"      rules: {', '.join(sorted(set(r.rules)))}")
            if r.precision:
                lines.append(f"      precision: {r.precision}")
            if r.float32_ops:
                inside = ", ".join(f"{op} {n}" for op, n in sorted(r.float32_ops.items()))
                lines.append(f"      float32 inside: {inside}")
            if r.algorithms:
                lines.append(f"      conv2d algorithms: {r.algorithms}")
            lines.extend("      " + line for line in _declined_lines(r))
        lines.append("")
        lines.append(f"left on {HOST}: {len(self.fallbacks)} ops")
        for f in self.fallbacks:
            rule = f" [{f.rule}]" if f.rule else ""
            lines.append(f"  {f.op:<22} {f.value:<28} {f.reason}{rule}")
        return "\n".join(lines)

    __repr__ = __str__

    def to_dot(self) -> str:
        """The partitioned ``main`` as a graphviz DOT graph, one fill colour per target."""
        return self.dot

    def render(self, path: str | Path, engine: str = "auto") -> Path:
        """Draw the graph into ``path``, by its suffix.

        ``.svg``: laid out with igraph (a pip dependency), no system package needed; ``.html``: an
        interactive page (zoom, pan, search by op, a node's ops and reasons on hover); ``.dot``/``.gv``:
        the DOT text; ``.png``/``.pdf`` (and ``.svg`` with ``engine="dot"``): through graphviz's
        ``dot`` program, which must be installed.
        """
        from . import picture

        path = Path(path)
        fmt = path.suffix.lstrip(".").lower()
        if engine not in ("auto", "dot"):
            raise ByocError(f"render engine must be 'auto' or 'dot', got {engine!r}")
        if fmt in ("dot", "gv"):
            path.write_text(self.dot)
        elif fmt in ("html", "htm"):
            path.write_text(picture.page(self.graph), encoding="utf-8")
        elif fmt == "svg" and engine == "auto":
            path.write_text(picture.svg(self.graph), encoding="utf-8")
        else:
            _render_with_dot(self.dot, path, fmt)
        return path


def _render_with_dot(dot_text: str, path: Path, fmt: str) -> None:
    dot = shutil.which("dot")
    if dot is None:
        raise ByocError(
            f"rendering {path.name} needs graphviz's 'dot' program (apt-get install graphviz); "
            ".svg and .html need nothing more than this package, .dot gives the graph as text"
        )
    subprocess.run([dot, f"-T{fmt}", "-o", str(path)], input=dot_text, text=True, check=True)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


# ----------------------------------------------------------------------------------------------
# FLOPs
# ----------------------------------------------------------------------------------------------
def _prod(dims) -> int:
    """The product of a shape's dims; a symbolic dim (a string, docs/region-format.md) counts as 1,
    so the FLOPs of a region with symbolic dims are per unit of each symbol (batch 1, ...)."""
    return int(math.prod(1 if isinstance(d, str) else int(d) for d in dims))


def relax_call_flops(call: relax.Call) -> int:
    """Multiply-adds × 2 of a conv2d/matmul call; one op per output element for anything else."""
    out = static_shape(call)
    if out is None:
        return 0
    name = op_name(call) or ""
    if name == "relax.nn.conv2d":
        w = static_shape(call.args[1])
        return 2 * _prod(out) * _prod(w[1:]) if w else 0
    if name == "relax.matmul":
        x = static_shape(call.args[0])
        return 2 * _prod(out) * x[-1] if x else 0
    if name in ("relax.reshape", "relax.permute_dims"):
        return 0
    return _prod(out)


def graph_node_flops(node: dict, tensors: list[dict]) -> int:
    """FLOPs of one node of a region graph (docs/region-format.md)."""
    out = tensors[node["output"]]["shape"]
    if node["op"] == "conv2d":
        return 2 * _prod(out) * _prod(tensors[node["inputs"][1]]["shape"][1:])
    if node["op"] == "dense":
        return 2 * _prod(out) * tensors[node["inputs"][0]]["shape"][-1]
    return _prod(out)


# ----------------------------------------------------------------------------------------------
# Building the report
# ----------------------------------------------------------------------------------------------
def _region_from_function(name: str, func: relax.Function) -> RegionReport:
    ops, rules, flops = Counter(), [], 0
    for comp in region_composites(func):
        rules.append(composite_name(comp))
        for call in op_calls(comp):
            ops[short_op_name(op_name(call))] += 1
            flops += relax_call_flops(call)
    return RegionReport(name, region_target(func), ops, rules, [describe(p) for p in func.params],
                        [describe(o) for o in function_outputs(func)], flops)


def _region_from_graph(region: RegionEntry) -> RegionReport:
    graph = region.graph
    tensors = graph["tensors"]

    def desc(tid):
        return document_tensor_text(tensors[tid])

    precision, float32_ops = _int8_precision(graph)
    declined = [Rejection(f"{region.target}:{d['pass']}", str(d["op"]), str(d["reason"]), str(d["value"]))
                for d in graph.get("source", {}).get("declined", [])]
    return RegionReport(
        region.symbol, region.target, region.ops, region.composites, [desc(i) for i in graph["inputs"]],
        [desc(o) for o in graph["outputs"]], sum(graph_node_flops(n, tensors) for n in graph["nodes"]),
        precision or _region_precision(region), float32_ops, declined, _conv_algorithms(region),
    )


def _conv_algorithms(region: RegionEntry) -> str:
    """The oneDNN runtime's direct / Winograd choice for the region's convs (its ``get_plan``), with
    the reason where ``auto`` chose direct for accuracy; "" for another runtime."""
    import os

    from .backends.onednn.ops.conv2d import algorithm_summary

    try:
        from ._native import _C

        plan = [str(line) for line in region.module["get_plan"]()]
        max_taps = int(_C.winograd_auto_max_taps())
    except (AttributeError, KeyError, ImportError, RuntimeError):  # another runtime; TVM 0.27 errors are RuntimeErrors
        return ""
    return algorithm_summary(region.graph or {}, plan, max_taps, os.environ.get("BYOC_HETERO_CONV_ALGO", ""))


_QUANTIZED = ("uint8", "int8")
_ANCHOR_OPS = ("conv2d", "dense", "matmul")


def _int8_precision(graph: dict) -> tuple[str, Counter]:
    """For a region with quantized values: ``"int8"`` when every conv2d / dense / matmul reads 8-bit
    data, else ``"mixed"``; and the ops that compute float32 inside it (``"pool2d avg"``,
    ``"softmax"``, ...). ``("", Counter())`` for a region without 8-bit values. An anchor that
    quantizes its float32 source per call (attr ``src_dynamic``: ``quantize_dynamic``'s dense layers)
    computes int8 too, and a region with a per-call quantization round trip has quantized values."""
    tensors, nodes = graph["tensors"], graph["nodes"]
    if not any(tensors[n["output"]].get("dtype") in _QUANTIZED or n["attrs"].get("src_dynamic")
               or n["op"] in ("quantize_dequantize", "dynamic_quantize_dequantize") for n in nodes):
        return "", Counter()
    anchors = [n for n in nodes if n["op"] in _ANCHOR_OPS]
    int8 = [n for n in anchors if tensors[n["inputs"][0]].get("dtype") in _QUANTIZED or n["attrs"].get("src_dynamic")]
    float32_ops: Counter = Counter()
    for n in nodes:
        if n["op"] in ("quantize", "dequantize", "quantize_dequantize", "dynamic_quantize_dequantize") or tensors[n["output"]].get("dtype", "float32") != "float32":
            continue
        if n["op"] in _ANCHOR_OPS and n in int8:
            continue  # an int8 anchor writing float32 (no quantize after it) still computes int8
        algorithm = n["attrs"].get("algorithm")
        float32_ops[f"{n['op']} {algorithm}" if algorithm else n["op"]] += 1
    label = "int8" if anchors and len(int8) == len(anchors) else "mixed"
    return f"{label} ({len(int8)} of {len(anchors)} conv2d/dense/matmul int8)", float32_ops


def _region_precision(region: RegionEntry) -> str:
    """The precision the region's module computes in (its get_runtime_info), with the reason when
    a bf16 request runs as float32."""
    try:
        info = json.loads(str(region.module["get_runtime_info"]()))
    except (AttributeError, KeyError, ValueError, RuntimeError):  # TVM 0.27 errors are RuntimeErrors
        return ""  # a module of another runtime
    precision = str(info.get("precision", ""))
    requested = str(info.get("precision_requested", precision))
    if requested != precision:
        return f"{precision} (bf16 requested, ran {precision}: {info.get('precision_note', '')})"
    return _per_node_precision(region.graph or {}, precision) or precision


def _per_node_precision(graph: dict, precision: str) -> str:
    """``"mixed (k of n conv2d/dense/matmul bf16)"`` when the anchors' own ``precision`` attrs (a
    tuner's per-node decisions, docs/region-format.md) make them compute in two precisions; else ""."""
    from .backends.onednn.precision import effective_precision

    anchors = [n for n in graph.get("nodes", []) if n["op"] in _ANCHOR_OPS and "src_scale" not in n.get("attrs", {})]
    asked = [n.get("attrs", {}).get("precision", precision) for n in anchors]
    bf16 = asked.count("bf16") if not effective_precision("bf16")[1] else 0
    if 0 < bf16 < len(anchors):
        return f"mixed ({bf16} of {len(anchors)} conv2d/dense/matmul bf16, per-node precision)"
    return ""


def _fallback(call: relax.Call, decisions: list[Rejection]) -> FallbackOp:
    op, value = op_name(call), describe(call)
    rej = latest_rejection(decisions, op, value)
    if rej is not None:
        return FallbackOp(short_op_name(op), value, rej.reason, rej.rule)
    return FallbackOp(short_op_name(op), value, "no offload rule matches it")


_TIR_CALLS = {"call_tir", "call_tir_inplace"}


def _tir_fallback(call: relax.Call) -> FallbackOp:
    """A TIR function called from ``main``: one the importer emitted (TVM's ONNX frontend writes Pad, and
    ops it has no Relax op for, as ``call_tir``) or one written by hand (docs/relax-kernels.md): it runs on
    llvm and, between offloaded ops, splits their regions."""
    callee = call.args[0]
    name = getattr(callee, "name_hint", None) or str(callee)
    return FallbackOp(f"call_tir {name}", describe(call),
                      f"TIR function {name!r} (from the importer or written by hand): rules match Relax ops, "
                      "not TIR functions")


class _Dot:
    """Collects the picture of ``main``: one node per binding, coloured by where it runs, with its
    details (for the tooltip); gives the DOT text and the :class:`~byoc_hetero.picture.Graph`."""

    def __init__(self):
        self.lines = ["digraph partitioned {", '  rankdir=TB; node [shape=box, style="rounded,filled", '
                      'fontname="Helvetica", fontsize=10];']
        self.ids: dict = {}
        self.colours: dict[str, str] = {HOST: HOST_COLOUR}
        self.graph = Graph()

    def colour(self, target: str) -> str:
        if target not in self.colours:
            self.colours[target] = PALETTE[(len(self.colours) - 1) % len(PALETTE)]
        return self.colours[target]

    def node(self, key, label: str, target: str, shape: str = "box", details: str = "",
             ops: list[str] | None = None) -> None:
        nid = f"n{len(self.ids)}"
        self.ids[key] = len(self.graph.nodes)
        self.graph.nodes.append(Node(nid, label.split("\\n"), target, self.colour(target), shape,
                                     details, ops or []))
        label = label.replace('"', "'")
        self.lines.append(f'  {nid} [label="{label}", fillcolor="{self.colour(target)}", shape={shape}];')

    def edges(self, key, expr) -> None:
        used = []
        relax.analysis.post_order_visit(expr, lambda e: used.append(e) if isinstance(e, relax.Var) else None)
        seen = set()
        for var in used:
            src = self.ids.get(var)
            if src is not None and src not in seen:
                seen.add(src)
                self.graph.edges.append((src, self.ids[key]))
                self.lines.append(f"  n{src} -> n{self.ids[key]};")

    def text(self) -> str:
        legend = " ".join(f"{t}" for t in self.colours)
        self.lines.append(f'  label="colours: {legend}"; labelloc=b;')
        for target, colour in self.colours.items():
            self.lines.append(f'  "legend_{target}" [label="{target}", fillcolor="{colour}", shape=note];')
        self.graph.legend = dict(self.colours)
        return "\n".join(self.lines + ["}"])


def _region_details(region: RegionReport) -> str:
    ops = ", ".join(f"{op} x{n}" for op, n in sorted(region.ops.items()))
    lines = [f"{region.target} region {region.symbol}", f"ops: {ops}", f"rules: {', '.join(sorted(set(region.rules)))}",
             f"inputs: {', '.join(region.inputs)}", f"outputs: {', '.join(region.outputs)}",
             f"{region.flops / 1e6:.1f} MFLOP"]
    if region.precision:
        lines.append(f"precision: {region.precision}")
    if region.algorithms:
        lines.append(f"conv2d algorithms: {region.algorithms}")
    return "\n".join(lines + _declined_lines(region))


def _declined_lines(region: RegionReport) -> list[str]:
    """The region passes' declined matches, one line per (rule, node, reason) with its count."""
    groups = Counter((d.rule, d.op, d.reason) for d in region.declined)
    return [f"not one {op} step{f' (x{n})' if n > 1 else ''}: {reason} [{rule}]"
            for (rule, op, reason), n in groups.items()]


def report(mod: tvm.IRModule, entry: str = "main") -> PartitionReport:
    """Report how ``mod`` (the output of any partition stage) is split between targets.

    Example
    -------
    >>> m = bh.partition(mod, params)
    >>> rep = bh.report(m)
    >>> print(rep)                     # op counts, regions, what stayed on llvm and why
    >>> rep.render("vgg11.svg")        # the graph, one colour per target (.html: interactive)
    """
    decisions = rejections(mod)
    graphs = region_table(mod)
    rep = PartitionReport(op_profile(mod, entry), rejections=list(decisions))
    dot = _Dot()
    func = mod[entry]
    for param in func.params:
        dot.node(param, f"{param.name}\\n{describe(param)}", HOST, shape="ellipse",
                 details=f"input {param.name}: {describe(param)}")
    local_funcs = local_functions(func)
    for block in func.body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            if isinstance(value, relax.Function):
                continue
            target, label, details, ops = _binding(mod, value, local_funcs, graphs, decisions, rep)
            dot.node(var, label + f"\\n{describe(var)}", target,
                     details=f"{details}\n= {var.name}: {describe(var)}", ops=ops)
            dot.edges(var, value)
    rep.dot = dot.text()
    rep.graph = dot.graph
    return rep


def _binding(mod, value, local_funcs, graphs, decisions, rep: PartitionReport):
    """What one binding of ``main`` is: (target, label, details, op names); regions and ops left
    on llvm are added to ``rep`` on the way."""
    target, label = HOST, type(value).__name__
    if not isinstance(value, relax.Call):
        return target, label, label, []
    callee = called_function(mod, value, local_funcs)
    if op_name(value) == "relax.call_dps_packed":
        symbol = str(value.args[0].global_symbol)
        if symbol not in graphs:
            return target, f"packed {symbol}", f"packed function {symbol}", []
        region = _region_from_graph(graphs[symbol])
    elif region_target(callee) is not None:
        region = _region_from_function(value.op.name_hint, callee)
    elif composite_name(callee) is not None:
        name = composite_name(callee)
        ops = [short_op_name(op_name(c)) for c in op_calls(callee)]
        return name.split(".", 1)[0], name, f"composite {name}: {', '.join(ops)}", ops
    else:
        if op_name(value) is None:
            return target, label, label, []
        short = short_op_name(op_name(value))
        fallback = None
        if short in _TIR_CALLS:
            fallback = _tir_fallback(value)
        elif short not in _PLUMBING:
            fallback = _fallback(value, decisions)
        if fallback is None:
            return target, short, short, [short]
        rep.fallbacks.append(fallback)
        rule = f" [{fallback.rule}]" if fallback.rule else ""
        return target, short, f"{short} on {HOST}: {fallback.reason}{rule}", [short]
    rep.regions.append(region)
    rep.rejections.extend(region.declined)
    return region.target, _region_label(region), _region_details(region), sorted(region.ops)


def _region_label(region: RegionReport) -> str:
    ops = ", ".join(f"{op}x{n}" if n > 1 else op for op, n in sorted(region.ops.items()))
    return f"{region.target} region\\n{ops}\\n{region.flops / 1e6:.1f} MFLOP"
