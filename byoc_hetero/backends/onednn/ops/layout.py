"""Layout ops: permute_dims on any axes, concat (any number of inputs), split and strided_slice.

* ``permute_dims`` becomes a ``permute`` node. The runtime's planner gives it no step: its output
  is the input's buffer under a permuted descriptor, and a consumer wanting another layout pays the
  one reorder (ConvNeXt's conv → NHWC → layer_norm → ... → NCHW → conv runs with no copy). A
  matmul that reads a permuted value (through reshapes, e.g. attention's
  ``permute_dims(reshape(x, [B, S, H, D]), [0, 2, 1, 3])`` and Kᵀ's ``[0, 2, 3, 1]``) reads the
  permute's input through strides instead (:func:`fold_views`), and the permute node is dropped
  when nothing else reads it. With symbolic dims the strides are not static: a permute read
  directly by a matmul (no reshape between) becomes attrs ``a_axes`` / ``b_axes``, whose strides
  the kernel computes from the bound shapes per plan; a matmul over operands whose batch dims a
  reshape merged (torch.export's ``[B * H, S, D]``) runs on the unmerged ones first
  (:func:`unmerge_batch_dims`), so that the permutes behind the merges fold the same way.
* ``concat`` becomes a ``concat`` node. In a batch-1 tensor, an input that only the concat reads
  is written by its producer straight into its slice of the concat's buffer (plain, or whole
  channel blocks: a conv feeding a channel concat writes channel blocks); the planner copies only
  the other inputs, and its plan notes say which were free.
* Graph passes fold what follows a dense through views into it: a per-feature constant scale
  (:func:`fold_channel_scales`), a residual add (:func:`fold_residual_adds`); an activation is
  folded by :func:`..epilogue.fuse_eltwise_into_producer`.
* ``split`` becomes one ``slice`` node per output and ``strided_slice`` one ``slice`` node (a
  reorder from a sub-memory of the input, strided where the steps are > 1); negative steps (which
  reverse) stay on TVM with their reason.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple, wildcard

from ...._relax import shape_of
from ....rules import Match, Variadic
from ..lowering import Node, RegionGraph
from ..precision import tensor_reason
from ..table import PatternSpec, graph_pass, lowers, pattern_rules

def _tensors_reason(values: list[tuple[relax.Expr, str]], symbolic: bool = False) -> str | None:
    for expr, name in values:
        reason = tensor_reason(expr, name, symbolic=symbolic)
        if reason:
            return reason
    return None


def _int(expr) -> int | None:
    """The integer of an IntImm / PrimValue / int, or None."""
    value = expr
    for _ in range(3):
        if isinstance(value, tvm.tirx.IntImm):
            return int(value.value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        value = getattr(value, "value", None)
    return None


def _ints(expr) -> list[int | None]:
    """The integers of a tuple/shape argument (strided_slice's axes, begin, end, strides)."""
    if isinstance(expr, relax.ShapeExpr):
        return [_int(v) for v in expr.values]
    if isinstance(expr, relax.Tuple):
        return [_int(f) for f in expr.fields]
    return [None]


# ----------------------------------------------------------------------------------------------
# permute_dims
# ----------------------------------------------------------------------------------------------
def permute_axes(call: relax.Call) -> list[int]:
    """The permutation of a permute_dims call, normalized (None = reverse all axes)."""
    rank = len(shape_of(call.args[0]))  # symbolic dims allowed: only the rank matters
    axes = call.attrs.axes
    if axes is None:
        return list(reversed(range(rank)))
    return [int(a) % rank for a in axes]


def check_permute(match: Match) -> str | None:
    """permute_dims of a float32 tensor of rank 1..12 (symbolic dims allowed: the runtime permutes the
    shapes of each binding)."""
    call = match.expr("root")
    reason = tensor_reason(call.args[0], "data", symbolic=True) or tensor_reason(call, "result", symbolic=True)
    if reason:
        return reason
    rank = len(shape_of(call.args[0]))
    if not 1 <= rank <= 12:
        return f"permute_dims of rank {rank}; the runtime permutes ranks 1..12"
    return None


@lowers("relax.permute_dims", check=check_permute)
def lower_permute_dims(ctx, var: relax.Var, call: relax.Call) -> int:
    """A ``permute`` node; a matmul reading it may read its input through strides instead."""
    return ctx.emit("permute", [ctx.data_of(call.args[0])], var, {"axes": permute_axes(call)})


def swapped_last(axes: list[int]) -> bool:
    """Whether a permutation only swaps the last two axes (a transposed matmul operand)."""
    rank = len(axes)
    return rank >= 2 and axes == list(range(rank - 2)) + [rank - 1, rank - 2]


# ----------------------------------------------------------------------------------------------
# concat
# ----------------------------------------------------------------------------------------------
def check_concat(match: Match) -> str | None:
    """concat of float32 tensors of one rank along one axis; other dims may be symbolic when the
    concatenated axis is static in every input (RoPE's rotate_half over [B, H, S, D])."""
    call = match.expr("root")
    fields = call.args[0].fields if isinstance(call.args[0], relax.Tuple) else []
    if not fields:
        return "concat of a tuple that is not written out in the graph"
    reason = _tensors_reason([(f, f"input {i}") for i, f in enumerate(fields)] + [(call, "result")],
                             symbolic=True)
    if reason:
        return reason
    if len(shape_of(call)) == 0:
        return "concat of scalars"
    if call.attrs.axis is not None and any(not isinstance(shape_of(f)[concat_axis(call)], int)
                                           for f in [*fields, call]):
        return f"concat along the symbolic axis {concat_axis(call)} of {list(shape_of(call))}"
    return None


def concat_axis(call: relax.Call) -> int:
    rank = len(shape_of(call))
    return int(call.attrs.axis) % rank if call.attrs.axis is not None else 0


@lowers("relax.concat", check=check_concat)
def lower_concat(ctx, var: relax.Var, call: relax.Call) -> int:
    if call.attrs.axis is None:
        raise ctx.fail("concat without an axis (flattening concat) is not supported")
    inputs = [ctx.data_of(f) for f in call.args[0].fields]
    return ctx.emit("concat", inputs, var, {"axis": concat_axis(call)})


# ----------------------------------------------------------------------------------------------
# split / strided_slice: slice nodes
# ----------------------------------------------------------------------------------------------
def check_split(match: Match) -> str | None:
    """split of a float32 tensor along a static axis into parts of static extent on that axis; the
    other dims may be symbolic (each part is a slice node the runtime plans per binding)."""
    call = match.expr("root")
    reason = tensor_reason(call.args[0], "data", symbolic=True)
    if reason:
        return reason
    shape = shape_of(call.args[0])
    if not shape:
        return "split of a scalar"
    axis = int(call.attrs.axis) % len(shape)
    if not isinstance(shape[axis], int):
        return f"split along the symbolic axis {axis} of {list(shape)}"
    parts = split_shapes(call)
    if not parts or any(p is None or not isinstance(p[axis], int) for p in parts):
        return "split parts without a static extent on the split axis"
    return None


def split_shapes(call: relax.Call) -> list[tuple[int | str, ...] | None]:
    """The shape of every part of a split, symbolic dims as expressions (None for a part without one)."""
    return [shape_of(field) for field in getattr(call.ty, "fields", [])]


@lowers("relax.split", check=check_split)
def lower_split(ctx, var: relax.Var, call: relax.Call) -> tuple[int, ...]:
    data = ctx.data_of(call.args[0])
    rank = len(shape_of(call.args[0]))
    axis = int(call.attrs.axis) % rank
    outs, offset = [], 0
    for shape in split_shapes(call):
        begin = [0] * rank
        begin[axis] = offset
        out = ctx.emit("slice", [data], None, {"begin": begin}, shape=shape)
        ctx.open_node.pop(out)
        outs.append(out)
        offset += shape[axis]
    return tuple(outs)


def slice_box(call: relax.Call) -> tuple[list[int], list[int]] | str:
    """Per-axis begin offsets and steps of a strided_slice with positive steps, or the reason it
    has none (the sliced axes must be static, the others may be symbolic; steps other than 1 are
    read with strides: Swin's patch merging ``x[:, 0::2, 1::2]``)."""
    shape = shape_of(call.args[0])
    axes, begin = _ints(call.args[1]), _ints(call.args[2])
    strides = _ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes)
    if None in axes or None in begin or None in strides:
        return "strided_slice with non-constant axes, begin or strides"
    if any(s < 1 for s in strides):
        return f"strided_slice with negative (reversing) or zero strides {strides}; the runtime slices with steps >= 1"
    out, steps = [0] * len(shape), [1] * len(shape)
    for axis, b, step in zip(axes, begin, strides):
        dim = shape[axis % len(shape)]
        if not isinstance(dim, int):
            return f"strided_slice along the symbolic axis {axis % len(shape)} of {list(shape)}"
        b = b + dim if b < 0 else b
        out[axis % len(shape)] = min(max(b, 0), dim)
        steps[axis % len(shape)] = step
    extent = shape_of(call)
    for axis, (b, step) in enumerate(zip(out, steps)):
        if step > 1 and (not isinstance(extent[axis], int) or b // step + extent[axis] > shape[axis] // step):
            return (f"strided_slice step {step} on axis {axis} of {shape[axis]} elements from {b} reaches into the "
                    "last partial step; the runtime reads whole steps (begin // step + extent <= dim // step)")
    return out, steps


def check_strided_slice(match: Match) -> str | None:
    """strided_slice of a float32 tensor with constant bounds and positive steps along static axes."""
    call = match.expr("root")
    reason = _tensors_reason([(call.args[0], "data"), (call, "result")], symbolic=True)
    if reason:
        return reason
    if len(shape_of(call.args[0])) == 0:
        return "strided_slice of a scalar"
    box = slice_box(call)
    return box if isinstance(box, str) else None


@lowers("relax.strided_slice", check=check_strided_slice)
def lower_strided_slice(ctx, var: relax.Var, call: relax.Call) -> int:
    box = slice_box(call)
    if isinstance(box, str):
        raise ctx.fail(box)
    begin, steps = box
    attrs = {"begin": begin, "steps": steps} if any(s != 1 for s in steps) else {"begin": begin}
    return ctx.emit("slice", [ctx.data_of(call.args[0])], var, attrs)


@pattern_rules
def _rules():
    for name, op, check in (("permute_dims", "relax.permute_dims", check_permute),
                            ("split", "relax.split", check_split)):
        data = wildcard()
        call = is_op(op)(data)
        yield PatternSpec(name, call, {"data": data, "root": call}, check, priority=15)
    data = wildcard()  # strided_slice(x, axes, begin, end[, strides]): one rule, with or without steps
    call = is_op("relax.strided_slice")(data, wildcard(), wildcard(), wildcard(), varg_default_wildcard=True)
    yield PatternSpec("strided_slice", call, {"data": data, "root": call}, check_strided_slice, priority=15)
    yield PatternSpec("concat", Variadic("relax.concat", _concat_pattern), {}, check_concat,
                      priority=15)


def _concat_pattern(n: int):
    """concat of an ``n``-tensor tuple written out in the graph (each tensor a parameter of the
    composite)."""
    call = is_op("relax.concat")(is_tuple([wildcard() for _ in range(n)]))
    return call, {"root": call}


# ----------------------------------------------------------------------------------------------
# Folding permutes into matmul operands (a pass over the lowered region graph)
# ----------------------------------------------------------------------------------------------
def row_major_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return strides[::-1]


def nocopy_reshape(dims: list[int], strides: list[int], new_dims: list[int]) -> list[int] | None:
    """Strides reading the strided view (dims, strides) as ``new_dims`` in row-major order without
    a copy, or None when no strides can (numpy's ``_attempt_nocopy_reshape``)."""
    old = [(d, s) for d, s in zip(dims, strides) if d != 1]
    new_strides = [0] * len(new_dims)
    oi, ni = 0, 0
    while oi < len(old) and ni < len(new_dims):
        if new_dims[ni] == 1:
            ni += 1
            continue
        oj, nj = oi + 1, ni + 1
        np_, op_ = new_dims[ni], old[oi][0]
        while np_ != op_:
            if np_ < op_:
                if nj >= len(new_dims):
                    return None
                np_ *= new_dims[nj]
                nj += 1
            else:
                if oj >= len(old):
                    return None
                op_ *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):  # the merged old dims must be contiguous relative to each other
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        new_strides[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            new_strides[k - 1] = new_strides[k] * new_dims[k]
        oi, ni = oj, nj
    for k in range(len(new_dims)):
        if new_dims[k] == 1:
            new_strides[k] = 1
    return new_strides


def strided_view(graph: RegionGraph, producers: dict[int, Node], t: int) -> tuple[int, list[int]] | None:
    """(base tensor, strides) reading tensor ``t`` from the plain bytes of a tensor before a
    permute (through reshapes and chained permutes), or None when ``t`` is no such view."""
    s = t
    while s in producers and producers[s].op == "reshape":
        s = producers[s].inputs[0]
    permuted = permute_source(producers, s)
    if permuted is None:
        return None
    base, axes = permuted
    base_shape = graph.tensors[base]["shape"]
    if not all(isinstance(d, int) for d in base_shape + graph.tensors[t]["shape"]):
        return None  # strides of symbolic dims are not static (see permute_source)
    plain = row_major_strides(base_shape)
    strides = nocopy_reshape([base_shape[a] for a in axes], [plain[a] for a in axes], graph.tensors[t]["shape"])
    return None if strides is None else (base, strides)


def permute_source(producers: dict[int, Node], t: int) -> tuple[int, list[int]] | None:
    """(base tensor, axes) when tensor ``t`` is ``permute_dims`` (of chained permutes, composed) of
    a base tensor; None otherwise. :func:`strided_view` turns that into static strides; in a
    symbolic region a matmul reads it as attr ``a_axes`` / ``b_axes`` instead, and the kernel
    computes the strides from the bound base shape when a plan is made (through a reshape the
    strides would need dim expressions: not done)."""
    node = producers.get(t)
    if node is None or node.op != "permute":
        return None
    axes, base = list(node.attrs["axes"]), node.inputs[0]
    while base in producers and producers[base].op == "permute":
        inner = producers[base].attrs["axes"]
        axes = [inner[a] for a in axes]
        base = producers[base].inputs[0]
    return base, axes


def _merge_copies(graph: RegionGraph, producers: dict[int, Node], t: int, source: int) -> bool:
    """Whether reading tensor ``t``, a reshape merging the leading dims of ``source``, costs a copy at run
    time that the unmerged ``source`` does not: ``source`` is (through reshapes) a permute whose strides
    do not merge those dims (:func:`strided_view` of ``t`` has none), or a slice, which the runtime's
    planner may hold as a view under its input's strides (cpp/plan/layouts.h ``SliceView``: torchvision
    Swin's ``q, k, v = qkv[0], qkv[1], qkv[2]`` of the permuted qkv dense output)."""
    if strided_view(graph, producers, t) is not None:
        return False
    s = source
    while s in producers and producers[s].op == "reshape":
        s = producers[s].inputs[0]
    return s in producers and producers[s].op in ("permute", "slice")


def unmerge_batch_dims(graph: RegionGraph) -> None:
    """A batched matmul over operands whose batch dims a reshape merged (``[B * H, S, D]`` from
    ``[B, H, S, D]``, torch.export's attention) runs on the unmerged operands (``[B, H, S, D]``), its
    output reshaped back: the merge is then no copy and a permute behind it becomes ``a_axes`` /
    ``b_axes`` (:func:`fold_views`). With symbolic dims always; with static ones where the merge of an
    operand would copy (:func:`_merge_copies`: static strides read the unmerged permute, and the
    runtime reads a slice's view where it lies).

    Reading ``permute_dims(x, [0, 2, 1, 3])`` of ``x: [B, S, H, D]`` as ``[B * H, S, D]`` needs a
    copy whenever ``B > 1`` (B and H are not adjacent in ``x``), so strides alone cannot do it;
    keeping B and H apart as batch dims of the matmul can. Applies when both operands are such
    reshapes of rank-4 values with the same two leading dims and the same last two dims as the
    operand (so the merged dim is their product), and the matmul has no residual or mask (whose
    shapes follow the merged output).
    """
    producers = {n.output: n for n in graph.nodes}
    shape = lambda t: graph.tensors[t]["shape"]  # noqa: E731
    for index, node in enumerate(list(graph.nodes)):
        if (node.op != "matmul" or len(shape(node.output)) != 3 or node.attrs.get("residual")
                or node.attrs.get("has_mask") or any(k in node.attrs for k in ("a_shape", "b_shape", "a_axes", "b_axes"))):
            continue
        static = all(isinstance(d, int) for t in node.inputs[:2] for d in shape(t))
        sources = []
        for t in node.inputs[:2]:
            reshape = producers.get(t)
            source = reshape.inputs[0] if reshape is not None and reshape.op == "reshape" else None
            if source is None or len(shape(source)) != 4 or shape(source)[2:] != shape(t)[1:]:
                break
            sources.append(source)
        if len(sources) != 2 or shape(sources[0])[:2] != shape(sources[1])[:2]:
            continue
        if static and not any(_merge_copies(graph, producers, t, s) for t, s in zip(node.inputs[:2], sources)):
            continue  # fold_views reads the merged operands through static strides
        merged = node.output
        out = shape(merged)
        graph.tensors.append({"shape": list(shape(sources[0])[:2]) + list(out[1:]),
                              "dtype": graph.tensors[merged]["dtype"]})
        node.inputs[:2] = sources
        node.output = len(graph.tensors) - 1
        graph.nodes.insert(graph.nodes.index(node) + 1, Node("reshape", [node.output], merged, {}))
        for reader in graph.nodes:
            if reader.op == "reshape" and reader.inputs == [merged]:
                # a reshape of the merged product reads the product itself (the same bytes in the same
                # order): torch.export's reshape back to [B, H, S, D] then needs no merged form, which
                # the layout the matmul may write (acbd, plan/layouts.h PermutedOutputLayout) cannot view
                reader.inputs = [node.output]


@graph_pass
def fold_views(graph: RegionGraph) -> None:
    """matmul operands that are permutes (of reshapes) read the permute's input through strides;
    then nodes nothing reads any more (such permutes) are dropped."""
    unmerge_batch_dims(graph)
    producers = {n.output: n for n in graph.nodes}
    for node in graph.nodes:
        if node.op != "matmul":
            continue
        for k, key in ((0, "a"), (1, "b")):
            if f"{key}_shape" in node.attrs or f"{key}_axes" in node.attrs:
                continue
            shape = list(graph.tensors[node.inputs[k]]["shape"])
            if not all(isinstance(d, int) for d in shape):
                permuted = permute_source(producers, node.inputs[k])
                if permuted is not None:
                    node.attrs[f"{key}_axes"] = permuted[1]
                    node.inputs[k] = permuted[0]
                continue
            view = strided_view(graph, producers, node.inputs[k])
            if view is not None:
                # the view has the output's rank (the kernel aligns operands with leading 1s)
                shape = list(graph.tensors[node.inputs[k]]["shape"])
                pad = len(graph.tensors[node.output]["shape"]) - len(shape)
                node.attrs[f"{key}_shape"] = [1] * pad + shape
                node.attrs[f"{key}_strides"] = [1] * pad + view[1]
                node.inputs[k] = view[0]
    drop_dead_nodes(graph)


def drop_dead_nodes(graph: RegionGraph) -> None:
    """Remove nodes whose output no node reads and the region does not return."""
    while True:
        read = {t for n in graph.nodes for t in n.inputs} | set(graph.outputs)
        alive = [n for n in graph.nodes if n.output in read]
        if len(alive) == len(graph.nodes):
            return
        graph.nodes[:] = alive


def _absorb(graph: RegionGraph, node: Node, dense: Node, chain: list[Node], before: list[Node],
            index: int, dead: set[int]) -> dict[int, Node]:
    """Finish folding ``node`` into ``dense``: the nodes ``before`` (its new constant inputs) go in
    at ``index`` (the dense's position), the last view of ``chain`` (or the dense) writes
    ``node``'s output, and ``node`` is marked dead; returns the producers of the live nodes."""
    graph.nodes[index:index] = before
    last = chain[0] if chain else dense
    last.output = node.output
    dead.add(id(node))
    return {m.output: m for m in graph.nodes if id(m) not in dead}


def _per_last_axis(shape: list, n: int) -> bool:
    """Whether ``shape`` holds one value per index of a last axis of size ``n`` (leading 1s)."""
    return len(shape) >= 1 and shape[-1] == n and all(d == 1 for d in shape[:-1])


@graph_pass
def fold_channel_scales(graph: RegionGraph) -> None:
    """A dense (no activation, no residual) whose output, through reshapes read once, is only
    multiplied by a constant holding one value per output feature has that scale folded into its
    weight and bias: ``(x·W + b)·c = x·(W·c) + b·c``. The two products are nodes on constants, so
    they run once at ``__init_``; the multiply node is gone.

    ConvNeXt's layer scale (``gamma * x`` after the second linear of every block) is such a
    multiply: one pass over [H·W, C] per block otherwise.
    """
    readers = graph.readers()  # an output counts once more, and is excluded below anyway
    outputs = set(graph.outputs)
    constants = {c["tensor"] for c in graph.constants}
    producers = {n.output: n for n in graph.nodes}
    dead: set[int] = set()
    for node in list(graph.nodes):
        if node.op != "binary" or node.attrs.get("algorithm") != "mul" or node.attrs.get("activation", "none") != "none":
            continue
        for k in (0, 1):
            scale, value = node.inputs[k], node.inputs[1 - k]
            if scale not in constants or value in constants:
                continue
            chain: list[Node] = []
            t = value
            while readers.get(t, 0) == 1 and t not in outputs and t in producers and producers[t].op == "reshape":
                chain.append(producers[t])
                t = producers[t].inputs[0]
            dense = producers.get(t)
            if dense is None or dense.op != "dense" or readers.get(t, 0) != 1 or t in outputs:
                continue
            if dense.attrs.get("activation", "none") != "none" or dense.attrs.get("residual"):
                continue
            n = graph.tensors[t]["shape"][-1]
            value_shape = graph.tensors[value]["shape"]
            if (not _per_last_axis(graph.tensors[scale]["shape"], n) or value_shape[-1] != n
                    or graph.tensors[node.output]["shape"] != value_shape
                    or any(not isinstance(d, int) for d in value_shape)):
                continue
            weight = dense.inputs[1]
            has_bias = bool(dense.attrs.get("has_bias", len(dense.inputs) >= 3))
            if weight not in constants or (has_bias and dense.inputs[2] not in constants):
                continue
            index = next(i for i, m in enumerate(graph.nodes) if m is dense)
            before = []

            def scaled(tensor: int, scale_shape: list[int]) -> int:
                shape = graph.tensors[tensor]["shape"]
                graph.tensors.append({"shape": list(scale_shape), "dtype": "float32"})
                view = len(graph.tensors) - 1
                before.append(Node("reshape", [scale], view, {}))
                graph.tensors.append({"shape": list(shape), "dtype": "float32"})
                out = len(graph.tensors) - 1
                before.append(Node("binary", [tensor, view], out, {"algorithm": "mul", "activation": "none"}))
                return out

            nk = dense.attrs.get("weight_layout") == "NK"
            dense.inputs[1] = scaled(weight, [n, 1] if nk else [1, n])
            if has_bias:
                bias = dense.inputs[2]
                dense.inputs[2] = scaled(bias, [1] * (len(graph.tensors[bias]["shape"]) - 1) + [n])
            producers = _absorb(graph, node, dense, chain, before, index, dead)
            break
    if dead:
        graph.nodes[:] = [m for m in graph.nodes if id(m) not in dead]


#: node op -> whether it applies an activation after its residual sum (``post_activation``): the ops whose
#: runtime kernel sums a residual input into its output (the kernel's ``sum_input``; cpp/kernels/kernel.h)
SUMS_RESIDUAL = {"dense": True, "dense_wq": False}


@graph_pass
def fold_residual_adds(graph: RegionGraph) -> None:
    """``add(view(dense(x)), r)``, with the dense's output reaching the add only through reshapes
    and permutes read once, becomes the dense's residual (a sum post-op; ``dense`` or ``dense_wq``,
    :data:`SUMS_RESIDUAL`): ``r`` is taken back
    through the inverse views (free relabels in the runtime), the dense accumulates into it, and
    the views then relabel the sum as the add's output. The add must not broadcast, and ``r``
    must be computed before the dense.

    ConvNeXt's ``shortcut + permute(dense(...))`` (the block's residual, across the permute back to
    channels-first) is such an add: one pass over [H·W, C] per block otherwise; with the runtime's
    in-place sum (the residual's buffer dies there) the dense writes the block's output directly.
    """
    readers = graph.readers()  # an output counts once more, and is excluded below anyway
    outputs = set(graph.outputs)
    producers = {n.output: n for n in graph.nodes}
    dead: set[int] = set()
    for node in list(graph.nodes):
        if node.op != "binary" or node.attrs.get("algorithm") != "add":
            continue
        for k in (0, 1):
            value, residual = node.inputs[k], node.inputs[1 - k]
            shape = graph.tensors[value]["shape"]
            if (value == residual or graph.tensors[residual]["shape"] != shape
                    or graph.tensors[node.output]["shape"] != shape or graph.tensors[residual]["dtype"] != "float32"):
                continue  # (symbolic dims compare as expressions: equal text, equal for every binding)
            chain: list[Node] = []  # nearest the add first
            t = value
            while (readers.get(t, 0) == 1 and t not in outputs and t in producers
                   and producers[t].op in ("reshape", "permute")):
                chain.append(producers[t])
                t = producers[t].inputs[0]
            dense = producers.get(t)
            act = node.attrs.get("activation", "none")
            if (dense is None or dense.op not in SUMS_RESIDUAL or readers.get(t, 0) != 1 or t in outputs
                    or dense.attrs.get("residual") or dense.attrs.get("post_activation", "none") != "none"
                    or (act != "none" and not SUMS_RESIDUAL[dense.op])):
                continue
            index = next(i for i, m in enumerate(graph.nodes) if m is dense)
            made_by = producers.get(residual)
            if made_by is not None and next(i for i, m in enumerate(graph.nodes) if m is made_by) > index:
                continue
            before = []
            r = residual
            for c in chain:  # back through the views, from the add towards the dense
                graph.tensors.append({"shape": list(graph.tensors[c.inputs[0]]["shape"]), "dtype": "float32"})
                back = len(graph.tensors) - 1
                if c.op == "reshape":
                    before.append(Node("reshape", [r], back, {}))
                else:
                    axes = list(c.attrs["axes"])
                    before.append(Node("permute", [r], back, {"axes": [axes.index(j) for j in range(len(axes))]}))
                r = back
            dense.inputs.append(r)
            dense.attrs["residual"] = 1
            if act != "none":
                dense.attrs["post_activation"] = act
                if "clip" in node.attrs:
                    dense.attrs["post_clip"] = node.attrs["clip"]
            producers = _absorb(graph, node, dense, chain, before, index, dead)
            break
    if dead:
        graph.nodes[:] = [m for m in graph.nodes if id(m) not in dead]
