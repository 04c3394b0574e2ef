"""RMSNorm's statistic ``1 / sqrt(mean(x²) + eps)`` as one reduction node.

Both import paths write RMSNorm (Llama, Mistral, Qwen, Gemma, T5's layer norm) as separate steps
over ``x``: ``square`` (a full ``[S, hidden]`` pass writing a second tensor), ``mean`` over the
last axis, ``add eps`` with ``rsqrt`` (from_torch) or ``add eps`` with ``sqrt`` and ``1 / (.)``
(the ONNX exporter's ``Sqrt`` + ``Reciprocal`` as ``div``), each a region step: 3-4 steps per norm,
61 norms in a call of the SmolLM-135M decoder. oneDNN's reduction computes ``sum(|x|^p)`` (its
``norm_lp_power_p_sum``) in one read of ``x`` and applies eltwise post-ops to the ``[S, 1]``
result, so the runtime's ``reduce`` has the algorithm ``mean_square`` (that sum with p = 2 times
``1/n``) with a ``shift`` and an ``activation`` (``cpp/kernels/reduce.cc``).

What, each rewrite only where every intermediate tensor has that one reader and is no region
output:

* ``reduce mean(eltwise square(x))`` -> ``reduce mean_square(x)``, and ``reduce sum(eltwise
  square(x))`` -> ``reduce sum_square(x)`` (a ``sqrt`` after either, without a shift between, as
  the reduce's activation):
  an L2 norm's sum of squares in one read of ``x``. ConvNeXt-V2's Global Response Normalization
  (issue 39 item 7) takes ``vector_norm`` over H, W of ``[N, H, W, C]``: the square was a full
  pass writing a tensor of ``x``'s size, then the sum read it again (the host loop of
  ``cpp/kernels/reduce.cc`` squares as it reads). Where the square has another reader the match is
  declined, with the reason, for ``bh.report``;
* ``add(reduce(...), c)`` with ``c`` a one-element float constant, the reduce without a shift or
  activation yet -> the reduce with ``shift`` c and the add's activation;
* ``div(1, reduce(...))`` with the reduce's activation ``sqrt`` -> activation ``rsqrt``;
* ``mul(x, reduce(x))`` (either operand order) of that statistic over the last axis only -> the
  reduce with ``normalize`` 1, whose output is ``x * r`` in ``x``'s shape: the norm without its
  weight (``fold_dense_input_scales`` has put that into the dense layers reading it). The
  statistic and the broadcast multiply were two steps per norm; the host loop multiplies each row
  while it is in cache, the same float product the binary step wrote.

And :func:`fold_norm_weights` (a pass of its own, after those): ``mul(gamma, reduce normalize(x))`` ->
the reduce with a ``weight`` input, where the gamma did not go into the dense layers reading the norm
(int8 / int4 decoders' ``dense_wq``): one step per norm, not two.
"""

from __future__ import annotations

from ..lowering import Node, RegionGraph
from ..table import graph_pass
from .dense_input_scales import constant_multiplies

_FOLDABLE_ACTIVATIONS = ("none", "sqrt", "rsqrt")


def _only_reader(graph: RegionGraph, t: int) -> Node | None:
    """The one node reading tensor ``t`` (once), or None (no reader, several, or a region output)."""
    if t in graph.outputs:
        return None
    readers = [n for n in graph.nodes if t in n.inputs]
    return readers[0] if len(readers) == 1 and readers[0].inputs.count(t) == 1 else None


def _drop(graph: RegionGraph, node: Node, into: Node) -> None:
    """``into`` takes over ``node``'s output tensor and ``node`` is removed."""
    into.output = node.output
    graph.nodes[:] = [m for m in graph.nodes if m is not node]


#: reduce algorithm -> the algorithm of the same reduction of the data's squares
_OF_SQUARES = {"mean": "mean_square", "sum": "sum_square"}


def _is_square(node: Node | None) -> bool:
    """An ``eltwise square``, or a ``binary mul`` of a tensor by itself (``x * x``, TVM's ONNX
    ReduceL2 / ReduceSumSquare), without an activation."""
    if node is None:
        return False
    if node.op == "eltwise":
        return node.attrs.get("algorithm") == "square"
    return (node.op == "binary" and node.attrs.get("algorithm") == "mul" and len(node.inputs) == 2
            and node.inputs[0] == node.inputs[1] and node.attrs.get("activation", "none") == "none"
            and not node.attrs.get("shift"))


def _square_fold_reason(graph: RegionGraph, reduce: Node, square: Node) -> str | None:
    """Why ``reduce`` of the squares ``square`` computes cannot read their operand itself
    (algorithm ``mean_square`` / ``sum_square``); None when it can."""
    if reduce.attrs.get("shift") or reduce.attrs.get("activation", "none") != "none":
        return "the reduce already has a shift or an activation (applied after its statistic)"
    dtype = graph.tensors[square.inputs[0]]["dtype"]
    if dtype != "float32":
        return f"the squared data is {dtype}; the reduction of squares reads float32"
    if _only_reader(graph, square.output) is not reduce:
        return ("the squares have another reader or are a region output: the square is computed and "
                "stored anyway")
    return None


def _fold_square(graph: RegionGraph, reduce: Node) -> None:
    producer = graph.producers().get(reduce.inputs[0])
    if not _is_square(producer):
        return
    reason = _square_fold_reason(graph, reduce, producer)
    if reason is not None:
        graph.decline("fuse_rms_statistics", f"reduce {_OF_SQUARES.get(reduce.attrs.get('algorithm'), '')}",
                      reduce.output, reason)
        return
    reduce.inputs[0] = producer.inputs[0]
    reduce.attrs["algorithm"] = _OF_SQUARES[reduce.attrs["algorithm"]]
    graph.nodes[:] = [m for m in graph.nodes if m is not producer]


def _fold_sqrt(graph: RegionGraph, reduce: Node) -> None:
    """An ``eltwise sqrt`` read from the reduce alone becomes its activation (an L2 norm)."""
    sqrt = _only_reader(graph, reduce.output)
    if (sqrt is not None and sqrt.op == "eltwise" and sqrt.attrs.get("algorithm") == "sqrt"
            and reduce.attrs.get("activation", "none") == "none"):
        reduce.attrs["activation"] = "sqrt"
        _drop(graph, sqrt, reduce)


def _fold_shift(graph: RegionGraph, reduce: Node) -> bool:
    add = _only_reader(graph, reduce.output)
    if (add is None or add.op != "binary" or add.attrs.get("algorithm") != "add" or "shift" in reduce.attrs
            or reduce.attrs.get("activation", "none") != "none"
            or add.attrs.get("activation", "none") not in _FOLDABLE_ACTIVATIONS
            or graph.tensors[add.output]["shape"] != graph.tensors[reduce.output]["shape"]):
        return False
    other = add.inputs[1] if add.inputs[0] == reduce.output else add.inputs[0]
    if other not in graph.scalar_values:
        return False
    reduce.attrs["shift"] = graph.scalar_values[other]
    if add.attrs.get("activation", "none") != "none":
        reduce.attrs["activation"] = add.attrs["activation"]
    _drop(graph, add, reduce)
    return True


def _fold_reciprocal(graph: RegionGraph, reduce: Node) -> None:
    div = _only_reader(graph, reduce.output)
    if (div is not None and div.op == "binary" and div.attrs.get("algorithm") == "div"
            and div.attrs.get("activation", "none") == "none" and reduce.attrs.get("activation") == "sqrt"
            and div.inputs[1] == reduce.output and graph.scalar_values.get(div.inputs[0]) == 1.0
            and graph.tensors[div.output]["shape"] == graph.tensors[reduce.output]["shape"]):
        reduce.attrs["activation"] = "rsqrt"
        _drop(graph, div, reduce)


def _last_axis_only(graph: RegionGraph, reduce: Node) -> bool:
    data, out = graph.tensors[reduce.inputs[0]]["shape"], graph.tensors[reduce.output]["shape"]
    return len(data) == len(out) and list(out[:-1]) == list(data[:-1]) and out[-1] == 1 != data[-1]


def _fold_normalize(graph: RegionGraph, reduce: Node) -> None:
    mul = _only_reader(graph, reduce.output)
    x = reduce.inputs[0]
    if (mul is not None and mul.op == "binary" and mul.attrs.get("algorithm") == "mul"
            and mul.attrs.get("activation", "none") == "none" and sorted(mul.inputs) == sorted([x, reduce.output])
            and reduce.attrs.get("activation") == "rsqrt" and _last_axis_only(graph, reduce)
            and graph.tensors[mul.output]["shape"] == graph.tensors[x]["shape"]
            and graph.tensors[mul.output]["dtype"] == "float32"):
        reduce.attrs["normalize"] = 1
        _drop(graph, mul, reduce)


@graph_pass
def drop_abs_before_square(graph: RegionGraph) -> None:
    """An ``eltwise abs`` whose only reader is an ``eltwise square`` is dropped: the square reads the
    abs's operand (``|x|² = x²``, the same bits). ``torch.linalg.vector_norm`` (ConvNeXt-V2's Global
    Response Normalization, issue 39 item 7) reaches the region as abs, square, sum, sqrt: the abs
    was a pass over the whole activation tensor, writing a second one, that changes nothing. Runs
    before :func:`fuse_rms_statistics`, whose mean of a square then sees the square directly."""
    producers = graph.producers()
    for square in [n for n in graph.nodes if n.op == "eltwise" and n.attrs.get("algorithm") == "square"]:
        abs_node = producers.get(square.inputs[0])
        if (abs_node is not None and abs_node.op == "eltwise" and abs_node.attrs.get("algorithm") == "abs"
                and _only_reader(graph, abs_node.output) is square):
            square.inputs[0] = abs_node.inputs[0]
            graph.nodes[:] = [m for m in graph.nodes if m is not abs_node]


@graph_pass
def fuse_rms_statistics(graph: RegionGraph) -> None:
    """Square, mean, ``+ eps``, ``sqrt`` / ``rsqrt`` / ``1 / (.)`` and the product with the data over
    one tensor as one ``reduce`` node; square, sum and ``sqrt`` (an L2 norm) as another (see the
    module doc)."""
    for reduce in [n for n in graph.nodes if n.op == "reduce" and n.attrs.get("algorithm") in _OF_SQUARES]:
        _fold_square(graph, reduce)
        if reduce.attrs.get("algorithm") == "mean_square" and _fold_shift(graph, reduce):
            _fold_reciprocal(graph, reduce)
            _fold_normalize(graph, reduce)
        elif reduce.attrs.get("algorithm") in _OF_SQUARES.values():
            _fold_sqrt(graph, reduce)


@graph_pass
def fold_norm_weights(graph: RegionGraph) -> None:
    """``mul(c, reduce normalize(x))``, ``c`` a float32 constant of one value per feature of the last axis
    and the normalized tensor read by that multiply only, becomes the reduce's second input (attr
    ``has_weight``): the host loop writes ``(x * r) * c``, the multiply's own float32 product, where the
    multiply was a step of its own reading and writing the whole tensor. That is RMSNorm's gamma wherever
    :func:`.dense_input_scales.fold_dense_input_scales` (which runs first) could not put it into the
    weights of the denses reading the norm: the weight-only ``dense_wq`` of an int8 / int4 decoder
    (codes are not rescaled), or readers other than denses. Runs after :func:`fuse_rms_statistics`, which
    makes the normalize node."""
    for mul, scale, value in constant_multiplies(graph):
        reduce = graph.producers().get(value)
        shape, weight = graph.tensors[value]["shape"], graph.tensors[scale]["shape"]
        if (reduce is None or reduce.op != "reduce" or not reduce.attrs.get("normalize")
                or reduce.attrs.get("has_weight") or _only_reader(graph, value) is not mul
                or not shape or not isinstance(shape[-1], int) or graph.tensors[scale]["dtype"] != "float32"
                or not weight or weight[-1] != shape[-1] or any(d != 1 for d in weight[:-1])
                or graph.tensors[mul.output]["shape"] != shape):
            continue
        reduce.inputs.append(scale)
        reduce.attrs["has_weight"] = 1
        _drop(graph, mul, reduce)
