"""A multiply by a broadcast factor and the element-wise steps after it as one binary pass.

``y = x * r`` with ``r`` broadcast over ``x`` (a per-channel ``[1, 1, 1, C]``: a runtime statistic or
a constant), followed, each step the only reader of the one before, by multiplies by broadcast
constants ``c``, adds of broadcast constants ``b`` and an add of ``x`` itself, is ``y = x * s + t``
with ``s`` and ``t`` of the broadcast operands' small shapes:

* ``* c``: ``s = s * c``, ``t = t * c``;
* ``+ b``: ``t = t + b``;
* ``+ x``: ``s = s + 1`` (the ``shift`` of the binary node that computed ``s``).

So the chain becomes the small steps computing ``s`` (on ``[1, 1, 1, C]``; steps on constants only
run once, at ``__init_``) and ONE ``binary mul`` of ``x`` by ``s`` whose third input ``t`` is added
as a oneDNN binary post-op (cpp/kernels/binary.cc): one read of ``x`` and one write, where each
step was a full pass reading and writing a tensor of ``x``'s size.

ConvNeXt-V2's Global Response Normalization (issue 39 item 7) ends in
``gamma * (x * Nx) + beta + x``: from_torch and the ONNX exporter both write it as four full
binaries over ``[N, H, W, C]`` (``x * Nx``, ``* gamma``, ``+ beta``, ``+ x``), here one pass
``x * (gamma * Nx + 1) + beta``. The products are those of another association (``x * (gamma *
Nx)`` against ``gamma * (x * Nx)``), within float32 rounding of torch's.

Where oneDNN 3.2 runs the binary with that post-op on its reference kernel only (:func:`addend_reason`:
a per-batch ``s`` with a shared ``t``, per-channel maps of NCHW data), ``t`` is a second binary after
it: two passes, still fewer than the chain's. Declined, with the reason for ``bh.report``, where
that saves nothing (``x * r + b`` of such shapes), and an add of ``x`` before any multiply by a
constant (``x * r + x``: no step computing ``s`` to carry the ``+ 1``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..lowering import Node, RegionGraph
from ..table import graph_pass

PASS = "fuse_affine_tails"
NO_CARRIER = ("x * r + x before any multiply by a constant: no small step to carry the + 1 "
              "(x * (r + 1) would need one of its own)")


@dataclass
class AffineTail:
    """A matched chain: ``nodes[0]`` is ``x * r``, ``steps`` what follows (``("mul", c)``,
    ``("add", b)``, ``("add_x", None)``), one per later node of ``nodes``."""

    x: int
    r: int
    nodes: list[Node]
    steps: list[tuple[str, int | None]] = field(default_factory=list)


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def _numel(shape) -> int:
    return math.prod(shape)


def _plain_binary(node: Node | None, algorithm: str) -> bool:
    """A two-input binary of ``algorithm`` without shift or activation."""
    return (node is not None and node.op == "binary" and node.attrs.get("algorithm") == algorithm
            and len(node.inputs) == 2 and not node.attrs.get("shift")
            and node.attrs.get("activation", "none") == "none")


def _sole_reader(graph: RegionGraph, t: int) -> Node | None:
    """The one node reading tensor ``t`` once, or None (several readers, or a region output)."""
    if t in graph.outputs:
        return None
    readers = [n for n in graph.nodes if t in n.inputs]
    return readers[0] if len(readers) == 1 and readers[0].inputs.count(t) == 1 else None


def _head(graph: RegionGraph, node: Node) -> AffineTail | None:
    """``node`` as ``x * r`` (either operand order): ``x`` of the output's static shape, ``r`` a
    smaller float32 operand broadcasting over it."""
    if not _plain_binary(node, "mul") or node.inputs[0] == node.inputs[1]:
        return None
    full = graph.tensors[node.output]["shape"]
    if not _static(full) or graph.tensors[node.output]["dtype"] != "float32":
        return None
    for k in (0, 1):
        x, r = node.inputs[k], node.inputs[1 - k]
        xs, rs = graph.tensors[x]["shape"], graph.tensors[r]["shape"]
        if (list(xs) == list(full) and _static(rs) and _numel(rs) < _numel(full)
                and graph.tensors[r]["dtype"] == "float32" and graph.tensors[x]["dtype"] == "float32"):
            return AffineTail(x, r, [node])
    return None


def _next_step(graph: RegionGraph, tail: AffineTail, constants: set[int]) -> tuple[Node, tuple[str, int | None]] | None:
    """The node after the chain's last and the step it is, or None where the chain ends."""
    t = tail.nodes[-1].output
    node = _sole_reader(graph, t)
    full = graph.tensors[tail.nodes[0].output]["shape"]
    if node is None or len(node.inputs) != 2 or graph.tensors[node.output]["shape"] != full:
        return None  # a unary reader (gelu, erf, ...) or a third input ends the chain
    other = node.inputs[1] if node.inputs[0] == t else node.inputs[0]
    if _plain_binary(node, "add") and other == tail.x:
        return node, ("add_x", None)
    if other not in constants or graph.tensors[other]["dtype"] != "float32":
        return None
    for algorithm, step in (("mul", "mul"), ("add", "add")):
        if _plain_binary(node, algorithm):
            return node, (step, other)
    return None


def _factor_shapes(graph: RegionGraph, tail: AffineTail, steps) -> tuple[tuple, tuple | None]:
    """The shapes of ``s`` and ``t`` (None: no ``t``) after ``steps``."""
    s_shape, t_shape = tuple(graph.tensors[tail.r]["shape"]), None
    for kind, k in steps:
        if kind == "add_x":
            continue
        k_shape = tuple(graph.tensors[k]["shape"])
        if kind == "mul":
            s_shape = np.broadcast_shapes(s_shape, k_shape)
        if kind == "add" or t_shape is not None:
            t_shape = k_shape if t_shape is None else np.broadcast_shapes(t_shape, k_shape)
    return s_shape, t_shape


def _step_reason(graph: RegionGraph, tail: AffineTail, step: tuple[str, int | None]) -> str | None:
    """Why ``step`` cannot join the chain ``tail`` (None: it can)."""
    full = graph.tensors[tail.nodes[0].output]["shape"]
    if step[0] == "add_x" and not any(done == "mul" for done, _ in tail.steps):
        return NO_CARRIER
    s_shape, _ = _factor_shapes(graph, tail, tail.steps + [step])
    if _numel(s_shape) >= _numel(full):
        return "the multiply by the constant would make the factor s as large as x"
    return None


def _grow(graph: RegionGraph, tail: AffineTail, constants: set[int]) -> str | None:
    """Extend ``tail`` while the next node is a step that can join; why the last one could not
    (None: the chain simply ends)."""
    while True:
        found = _next_step(graph, tail, constants)
        if found is None:
            return None
        node, step = found
        reason = _step_reason(graph, tail, step)
        if reason:
            return reason
        tail.nodes.append(node)
        tail.steps.append(step)


def _jitted_form(shape, full) -> bool:
    """Whether an operand of ``shape`` broadcast over ``full`` is the output's own shape, one element,
    or one value per index of the last axis (``[1, ..., 1, C]``: GRN's gamma and beta over
    channels-last data)."""
    shape = [1] * (len(full) - len(shape)) + list(shape)
    return shape == list(full) or _numel(shape) == 1 or (all(d == 1 for d in shape[:-1]) and shape[-1] == full[-1])


def addend_reason(s_shape, t_shape, full) -> str | None:
    """Why ``x * s`` cannot take ``+ t`` as its binary-add post-op (None: it can). It can where ``s``
    and ``t`` each are of a :func:`_jitted_form`: measured on oneDNN 3.2 (avx512_core), the binary
    with that post-op then runs jitted (the kernel reads them as ``[H * W, C]`` and ``[1, C]``),
    where a per-batch ``s`` with a shared ``t`` (``[N, 1, 1, C]`` and ``[1, 1, 1, C]``) or an
    ``[N, C, H, W]`` map with a per-channel ``t`` and a spatial ``s`` ran its reference kernel."""
    if _jitted_form(s_shape, full) and _jitted_form(t_shape, full):
        return None
    return (f"x * s + t with s {list(s_shape)} and t {list(t_shape)} over {list(full)} runs oneDNN's reference "
            "binary as one step with a post-op: two steps (x * s, then + t)")


def _new_tensor(graph: RegionGraph, shape) -> int:
    graph.tensors.append({"shape": [int(d) for d in shape], "dtype": "float32"})
    return len(graph.tensors) - 1


def _rewrite(graph: RegionGraph, tail: AffineTail, fused: bool) -> None:
    """Replace the chain by the steps computing ``s`` and ``t`` and one ``binary mul`` of ``x`` (with
    ``t`` its addend when ``fused``, else a ``binary add`` of ``t`` after it)."""
    made: list[Node] = []
    s, s_node, t = tail.r, None, None

    def emit(inputs: list[int], algorithm: str) -> Node:
        shape = np.broadcast_shapes(*(tuple(graph.tensors[i]["shape"]) for i in inputs))
        node = Node("binary", inputs, _new_tensor(graph, shape), {"algorithm": algorithm, "activation": "none"})
        made.append(node)
        return node

    for kind, k in tail.steps:
        if kind == "mul":
            s_node = emit([s, k], "mul")
            s = s_node.output
            if t is not None:
                t = emit([t, k], "mul").output
        elif kind == "add":
            t = k if t is None else emit([t, k], "add").output
        else:  # add_x: s + 1, the shift of the step that computed s (after a mul: _step_reason)
            s_node.attrs["shift"] = float(s_node.attrs.get("shift", 0.0)) + 1.0
    last = tail.nodes[-1]
    if t is not None and not fused:
        y = _new_tensor(graph, graph.tensors[last.output]["shape"])
        made.append(Node("binary", [tail.x, s], y, {"algorithm": "mul", "activation": "none"}))
        made.append(Node("binary", [y, t], last.output, {"algorithm": "add", "activation": "none"}))
    else:
        made.append(Node("binary", [tail.x, s] + ([t] if t is not None else []), last.output,
                         {"algorithm": "mul", "activation": "none"}))
    index = graph.nodes.index(tail.nodes[0])
    dropped = {id(n) for n in tail.nodes}
    graph.nodes[index:index] = made
    graph.nodes[:] = [n for n in graph.nodes if id(n) not in dropped]


@graph_pass
def fuse_affine_tails(graph: RegionGraph) -> None:
    """``x * r`` and the multiplies / adds of broadcast constants and the add of ``x`` after it as
    ``x * s + t`` in one binary pass (see the module doc)."""
    constants = {c["tensor"] for c in graph.constants}
    for node in list(graph.nodes):
        if not any(n is node for n in graph.nodes):
            continue
        tail = _head(graph, node)
        if tail is None:
            continue
        reason = _grow(graph, tail, constants)
        full = graph.tensors[node.output]["shape"]
        s_shape, t_shape = _factor_shapes(graph, tail, tail.steps)
        fused = t_shape is None or addend_reason(s_shape, t_shape, full) is None
        if len(tail.nodes) > (1 if fused else 2):  # fewer passes over x
            _rewrite(graph, tail, fused)
        elif tail.steps:  # x * r + b whose t cannot be a post-op
            graph.decline(PASS, "binary", tail.nodes[-1].output, addend_reason(s_shape, t_shape, full))
        elif reason == NO_CARRIER:
            graph.decline(PASS, "binary", tail.nodes[-1].output, reason)
