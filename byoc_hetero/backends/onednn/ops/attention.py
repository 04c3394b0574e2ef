"""Attention scores and transformer residuals as post-ops of the matmul / dense before them (a pass
over the lowered region graph, :func:`fuse_matmul_epilogues`).

* ``binary`` multiply (or divide) of a matmul's output by a one-element constant -> the matmul's
  ``scale`` attr (an eltwise_linear post-op): attention's ``Q @ K^T * (1/sqrt(d))``;
* ``binary`` add of a value broadcasting to a matmul's output -> the matmul's mask input
  (``has_mask``, a binary_add post-op after the scale): attention's additive mask;
* ``binary`` add of a value of the output's shape to a dense / matmul output -> its residual (a sum
  post-op), as the composites already do for an add in the same composite;
* ``binary`` multiply (or divide) of a matmul's *operand* by a one-element constant, before a matmul
  without a bias -> the matmul's ``scale`` attr too (its own pass :func:`fold_operand_scales`, after the
  rope pass, which takes a multiply of its output first): torchvision
  Swin's ``q = q * scale`` before ``q @ k^T`` (``(c q) k^T`` equals ``c (q k^T)`` within rounding), so
  that the matmul reads q where it lies (a view of the qkv dense's output) instead of a scaled copy.

Each looks through reshapes between the anchor and the binary node (TVM's torch frontend writes a
3-D ``linear`` as reshape, matmul, reshape and a batched matmul's output reshaped to 4-D) and fires
only when the anchor's output, and every reshape on the way, is read by nothing else. The anchor
(with those reshapes) moves down to where the binary node was, so the added operand is computed
before it. All heads stay one batched matmul.

Why: per-step profiles of BERT-base and ViT-B/16 showed the scores [heads, S, S] written by the
matmul, read and written by the scale multiply, read and written by the mask add, then read by the
softmax; and every residual add of the torch path a separate pass. Now the matmul writes the
masked, scaled scores once.
"""

from __future__ import annotations

from ..lowering import Node, RegionGraph
from ..table import graph_pass


def _strip_leading_ones(shape: list) -> list:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return list(shape[i:])


def in_anchor_frame(shape: list, chain: list, out: list) -> list | None:
    """``shape`` (broadcasting to ``chain``, a reshape of ``out`` that adds or drops leading 1s
    only) as the shape broadcasting the same way to ``out``; None when there is none."""
    if len(shape) > len(chain):
        return None
    aligned = [1] * (len(chain) - len(shape)) + list(shape)
    core = _strip_leading_ones(chain)
    if core != _strip_leading_ones(out):
        return None
    lead_chain, lead_out = len(chain) - len(core), len(out) - len(core)
    if any(d != 1 for d in aligned[:lead_chain]):
        return None
    if any(d not in (1, c) for d, c in zip(aligned[lead_chain:], core)):
        return None
    return [1] * lead_out + aligned[lead_chain:]


def _move_down(graph: RegionGraph, nodes: list[Node], before: Node) -> None:
    """Move ``nodes`` (in their order) to just before ``before``."""
    for n in nodes:
        graph.nodes.remove(n)
    index = graph.nodes.index(before)
    graph.nodes[index:index] = nodes


def reshaped_operand(graph: RegionGraph, t: int, shape: list, before: Node) -> int:
    """Tensor ``t`` read as ``shape`` (a reshape node inserted before ``before``; no copy)."""
    if list(graph.tensors[t]["shape"]) == list(shape):
        return t
    graph.tensors.append({"shape": list(shape), "dtype": graph.tensors[t]["dtype"]})
    out = len(graph.tensors) - 1
    graph.nodes.insert(graph.nodes.index(before), Node("reshape", [t], out, {}))
    return out


def _leading_ones(frame: list, shape: list) -> bool:
    """Whether ``frame`` is ``shape`` with leading 1s added (a view of it whatever its symbolic dims:
    the mask of a GQA matmul, [1, 1, S, S] read as [1, 1, 1, S, S])."""
    lead = len(frame) - len(shape)
    return lead >= 0 and list(frame[lead:]) == list(shape) and all(d == 1 for d in frame[:lead])


def _static(*shapes: list) -> bool:
    return all(isinstance(d, int) for s in shapes for d in s)


def _fuse_one(graph: RegionGraph, node: Node) -> bool:
    """Fold the binary ``node`` into the anchor one of its operands comes from; whether it did."""
    alg = node.attrs.get("algorithm")
    act = node.attrs.get("activation", "none")
    count = graph.readers()
    out_shape = list(graph.tensors[node.output]["shape"])
    for k in (0, 1):
        chain, other = node.inputs[k], node.inputs[1 - k]
        if chain == other:
            return False
        if count.get(chain, 0) != 1 or chain in graph.outputs:
            continue  # another reader needs the value without this binary
        found = graph.producer_through(chain)
        if found is None:
            continue
        anchor, reshapes = found[0], found[1][::-1]  # in graph order
        if anchor.op not in ("matmul", "dense") or count.get(anchor.output, 0) != 1 \
                or anchor.output in graph.outputs or anchor.attrs.get("residual"):
            continue
        chain_shape = list(graph.tensors[chain]["shape"])
        anchor_shape = list(graph.tensors[anchor.output]["shape"])
        if chain_shape != out_shape:
            continue  # the binary broadcasts the chain itself
        other_shape = list(graph.tensors[other]["shape"])
        plain = anchor.attrs.get("activation", "none") == "none"
        if anchor.op == "matmul" and plain and act == "none" and not anchor.attrs.get("has_mask") \
                and other in graph.scalar_values and (alg == "mul" or (alg == "div" and k == 0)):
            value = graph.scalar_values[other]
            if alg == "div" and value == 0:
                continue
            anchor.attrs["scale"] = anchor.attrs.get("scale", 1.0) * (value if alg == "mul" else 1.0 / value)
        elif alg == "add" and anchor.op == "matmul" and plain and act == "none" \
                and not anchor.attrs.get("has_mask") and other_shape != out_shape:
            if len(chain_shape) > len(anchor_shape) and chain_shape[len(chain_shape) - len(anchor_shape):] == anchor_shape \
                    and all(d == 1 for d in chain_shape[:len(chain_shape) - len(anchor_shape)]):
                # the matmul writes the chain's [1, H, S, S] directly (same bytes): oneDNN 3.2 runs
                # a broadcast binary post-op over 3-D [H, S, S] scores only in its reference matmul
                # (measured: 4.5 of BERT-base's 5 s per call), over 4-D ones in gemm:jit
                graph.tensors[anchor.output]["shape"] = list(chain_shape)
                anchor_shape = list(chain_shape)
            frame = in_anchor_frame(other_shape, chain_shape, anchor_shape)
            if frame is None or (frame != other_shape and not _static(frame, other_shape)
                                 and not _leading_ones(frame, other_shape)):
                continue
            if any(d != 1 for d in frame[:-2]):
                # a mask that differs per batch / head (e.g. [1, H, 1, S]) is a broadcast oneDNN 3.2
                # runs only in its reference matmul (measured): it stays a binary node
                continue
            _move_down(graph, [anchor, *reshapes], node)
            mask = reshaped_operand(graph, other, frame, anchor)
            anchor.inputs.insert(2 + int(bool(anchor.attrs.get("has_bias"))), mask)
            anchor.attrs["has_mask"] = 1
        elif alg == "add" and other_shape == out_shape:
            if chain_shape != anchor_shape and not _static(chain_shape, anchor_shape):
                continue
            _move_down(graph, [anchor, *reshapes], node)
            anchor.inputs.append(reshaped_operand(graph, other, anchor_shape, anchor))
            anchor.attrs["residual"] = 1
            anchor.attrs["post_activation"] = act
            if "clip" in node.attrs:
                anchor.attrs["post_clip"] = node.attrs["clip"]
        else:
            continue
        graph.nodes.remove(node)
        graph.replace_tensor(node.output, chain)
        return True
    return False


def absorb_operand_scalar(graph: RegionGraph, node: Node, k: int) -> bool:
    """Operand ``k`` of ``node`` (a matmul or an attention) computed as ``x * c`` or ``x / c`` (a one-element
    constant; through reshapes, each value read by the next step only): ``node`` reads x and its ``scale``
    is multiplied by c. Whether it did."""
    count = graph.readers()
    t = node.inputs[k]
    if count.get(t, 0) != 1 or t in graph.outputs:
        return False
    found = graph.producer_through(t)
    if found is None or found[0].op != "binary" or found[0].attrs.get("activation", "none") != "none":
        return False
    binary, chain = found
    if count.get(binary.output, 0) != 1 or binary.output in graph.outputs:
        return False
    alg, (a, b) = binary.attrs.get("algorithm"), binary.inputs
    for data, c in ((a, b), (b, a)):
        value = graph.scalar_values.get(c)
        if value is None or data in graph.scalar_values \
                or graph.tensors[data]["shape"] != graph.tensors[binary.output]["shape"]:
            continue
        if alg == "mul":
            factor = value
        elif alg == "div" and data == a and value != 0:
            factor = 1.0 / value
        else:
            continue
        node.attrs["scale"] = node.attrs.get("scale", 1.0) * factor
        if chain:
            chain[-1].inputs[0] = data
        else:
            node.inputs[k] = data
        graph.nodes.remove(binary)
        return True
    return False


def _absorb_operand_scale(graph: RegionGraph, matmul: Node, k: int) -> bool:
    """:func:`absorb_operand_scalar` for operand ``k`` of a float ``matmul`` with no bias, two plain
    operands and no int8 scales. Whether it did."""
    plain_inputs = len(matmul.inputs) - int(bool(matmul.attrs.get("residual"))) - int(bool(matmul.attrs.get("has_mask")))
    if matmul.attrs.get("has_bias") or plain_inputs != 2 or "a_scale" in matmul.attrs \
            or matmul.inputs[0] == matmul.inputs[1]:
        return False
    return absorb_operand_scalar(graph, matmul, k)


@graph_pass
def fold_operand_scales(graph: RegionGraph) -> None:
    """A scalar multiply of a matmul's operand becomes the matmul's scale (after the rope pass, which
    takes such a multiply of its own output first)."""
    for node in list(graph.nodes):
        if node.op == "matmul":
            for k in (0, 1):
                _absorb_operand_scale(graph, node, k)


@graph_pass
def fuse_matmul_epilogues(graph: RegionGraph) -> None:
    """Scale, mask and residual binary nodes after a matmul / dense become its post-ops."""
    for node in list(graph.nodes):
        if node.op == "binary" and node in graph.nodes:
            _fuse_one(graph, node)
