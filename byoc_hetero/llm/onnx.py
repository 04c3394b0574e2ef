"""ONNX decoders with a past / present KV cache, read into a :class:`~.model.DecoderSpec` and weights.

:func:`read_decoder` is a strict recognizer, not an importer: it walks the graph of a decoder file
with ``past_key_values.N.key / value`` inputs and ``present.N.key / value`` outputs from the
embedding to the logits, checks that every block is the one it expects, and reads the initializers
into the parameters of our own decoder step (:func:`.model.step_module`). The file's graph is never
run or imported: the step that runs is the same one :func:`byoc_hetero.llm.from_hf` builds (one
build for prefill and decode, the cache kept in place by ``kv_attention``), so the file gets the
same runtime. What it reads is the layout ONNX Runtime GenAI's model builder writes
(``python -m onnxruntime_genai.models.builder``) for Llama-style decoders (Llama / SmolLM, Qwen2,
Mistral with its window as ``local_window_size``)::

    Gather(embed | Transpose(lm_head), input_ids)                    # tied embedding: the LM head's weight
    | GatherBlockQuantized(Reshape(lm_head codes), input_ids, scales) # tied to an int4 LM head: dequantized
    per layer:  [Skip]SimplifiedLayerNormalization                    # RMSNorm (+ residual add)
                MatMul | MatMulNBits (q, k, v packed or separate) [+ Add bias]
                GroupQueryAttention(com.microsoft)                    # cos / sin caches, rotary in the op
                MatMul | MatMulNBits (o)
                SkipSimplifiedLayerNormalization                      # residual + RMSNorm
                gate, up: MatMul | MatMulNBits; Mul(gate, Sigmoid(gate)) * up; down
    SkipSimplifiedLayerNormalization (final norm); MatMul | MatMulNBits -> logits

From ``GroupQueryAttention`` it takes the heads, kv heads and scale (which must be 1/sqrt(head_dim));
from its cos / sin caches the rotary inverse frequencies (the phase of each column, refined over
positions 1, 2, 4, ...) and the attention scaling (their magnitude), checked by recomputing the
caches. ``MatMulNBits`` weights stay quantized (:class:`~byoc_hetero.quant.weight_only.WeightCodes`,
decoded as :mod:`byoc_hetero.passes.matmul_nbits` decodes them; the step runs them as ``dense_wq``)
or are dequantized when asked. Anything else (another op, an attribute the step does not implement:
softcap, interleaved rotary, rotary outside the op, a bias where the step has none,
a file without past / present) raises :class:`~byoc_hetero.errors.FrontendError` naming the node,
its op type and what was expected. optimum-style files (attention spelled in plain ops) are not
read yet.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FrontendError, QuantizationError
from .model import DecoderSpec

WHO = "bh.llm.from_onnx"
LINEAR_OPS = ("MatMul", "MatMulNBits")


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _Graph:
    """The graph's producers, consumers and initializers, with errors that name the node."""

    def __init__(self, model: Any, layers: int):
        from onnx import numpy_helper

        self.graph, self.layers = model.graph, layers
        self.producer = {o: n for n in self.graph.node for o in n.output if o}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.graph.node:
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self._inits = {i.name: i for i in self.graph.initializer}
        self._arrays: dict[str, np.ndarray] = {}
        self._to_array = numpy_helper.to_array
        self.taken: set[int] = set()

    def take(self, *nodes: Any) -> None:
        """Mark ``nodes`` as read into the spec (see :meth:`check_all_read`)."""
        self.taken.update(id(n) for n in nodes)

    def check_all_read(self) -> None:
        """A FrontendError naming the first node that is neither read into the spec nor computes an
        input of one that is (the attention mask's reformatting, a shape constant): a branch the walk
        did not follow, whose meaning the step would drop."""
        needed, stack = set(self.taken), [n for n in self.graph.node if id(n) in self.taken]
        while stack:
            for i in stack.pop().input:
                src = self.producer.get(i)
                if src is not None and id(src) not in needed:
                    needed.add(id(src))
                    stack.append(src)
        for n in self.graph.node:
            if id(n) not in needed:
                raise self.fail(n, f"nothing the decoder step does not read: it is no part of the blocks read "
                                   f"(its outputs {list(n.output)} go to {self.readers(n.output[0])})")

    def fail(self, node: Any, expected: str) -> FrontendError:
        name = node.name or (node.output[0] if node.output else "?")
        return FrontendError(f"{WHO}: node {name!r} ({node.op_type}): expected {expected}")

    def init(self, name: str, node: Any, what: str) -> np.ndarray:
        """The initializer ``name`` (an input of ``node``) as numpy, or an error naming ``what``."""
        if name not in self._inits:
            raise self.fail(node, f"{what} as an initializer, got {name!r} computed in the graph")
        if name not in self._arrays:
            self._arrays[name] = self._to_array(self._inits[name])
        return self._arrays[name]

    def only_consumer(self, value: str, ops: tuple[str, ...], after: Any) -> Any:
        """The one node reading ``value`` (an output of ``after``); its op type must be in ``ops``."""
        readers = self.consumers.get(value, [])
        if len(readers) != 1 or readers[0].op_type not in ops:
            raise self.fail(after, f"its output {value!r} read by one {' / '.join(ops)} node, got "
                                   f"{self.readers(value)}")
        return readers[0]

    def readers(self, value: str) -> str:
        """The nodes reading ``value``, as text for an error."""
        return ", ".join(f"{r.op_type} {r.name!r}" for r in self.consumers.get(value, [])) or "nothing"

    def consumers_of(self, value: str, op: str) -> list[Any]:
        return [n for n in self.consumers.get(value, []) if n.op_type == op]


def _codes(g: _Graph, node: Any) -> Any:
    """The WeightCodes of a MatMulNBits node (B [N, K] as codes), or a FrontendError saying why not."""
    from ..passes.matmul_nbits import codes_of

    inputs = list(node.input) + [""] * (6 - len(node.input))
    inits = {x: g.init(x, node, "B / scales / zero_points") for x in inputs[1:4] if x}
    try:
        found = codes_of(node, inits)
    except QuantizationError as err:
        raise g.fail(node, f"well-formed MatMulNBits values: {err}") from None
    if found is None or found[1]:
        raise g.fail(node, "MatMulNBits with bits 4 / 8, a block size >= 16 dividing K, uint8 zero points or "
                           f"none, no g_idx and no bias; got {_attrs(node)} with inputs {inputs}")
    return found[0]


def _linear(g: _Graph, node: Any, data: str) -> Any:
    """The weight [N, K] (float32 array, or WeightCodes for MatMulNBits) of a MatMul / MatMulNBits
    node that reads ``data``."""
    if node.op_type not in LINEAR_OPS or node.input[0] != data:
        raise g.fail(node, f"a MatMul / MatMulNBits reading {data!r}")
    g.take(node)
    if node.op_type == "MatMulNBits":
        return _codes(g, node)
    w = g.init(node.input[1], node, "the weight")
    if w.ndim != 2 or w.dtype != np.float32:
        raise g.fail(node, f"a float32 [K, N] weight, got {w.dtype}{list(w.shape)}")
    return np.ascontiguousarray(w.T)


def rows(weight: Any, start: int, stop: int) -> Any:
    """Output rows ``start:stop`` of a weight [N, K] (array or WeightCodes)."""
    from ..quant.weight_only import WeightCodes

    if isinstance(weight, WeightCodes):
        zp = weight.zero_points
        return WeightCodes(weight.bits, weight.block, np.ascontiguousarray(weight.codes[start:stop]),
                           np.ascontiguousarray(weight.scales[start:stop]),
                           None if zp is None else np.ascontiguousarray(zp[start:stop]))
    return np.ascontiguousarray(weight[start:stop])


def _projection(g: _Graph, value: str, data: str) -> tuple[Any, Any, np.ndarray | None]:
    """(node, weight, bias or None) of the linear layer whose output is ``value``, reading ``data``."""
    node = g.producer.get(value)
    if node is None:
        raise FrontendError(f"{WHO}: {value!r} is a graph input or initializer; expected a projection of {data!r}")
    bias = None
    if node.op_type == "Add":
        src = [x for x in node.input if x in g.producer and g.producer[x].op_type in LINEAR_OPS]
        if len(src) != 1:
            raise g.fail(node, "Add(MatMul(x, W), bias) with the bias an initializer")
        bias = g.init(next(x for x in node.input if x != src[0]), node, "the bias").astype(np.float32).ravel()
        g.take(node)
        node = g.producer[src[0]]
    return node, _linear(g, node, data), bias


def _norm(g: _Graph, node: Any, skip: bool, residual: str | None, x: str | None) -> tuple[np.ndarray, float]:
    """(weight, epsilon) of a SimplifiedLayerNormalization (``skip``: SkipSimplified..., adding
    ``residual`` and ``x``) node."""
    op = "SkipSimplifiedLayerNormalization" if skip else "SimplifiedLayerNormalization"
    a = _attrs(node)
    if node.op_type != op or a.get("axis", -1) != -1:
        raise g.fail(node, f"{op} over the last axis")
    g.take(node)
    if skip:
        if len([i for i in node.input if i]) != 3 or sorted(node.input[:2]) != sorted([residual, x]):
            raise g.fail(node, f"inputs (residual {residual!r}, {x!r}, weight) and no bias, got {list(node.input)}")
        weight = node.input[2]
    else:
        if node.input[0] != residual or len([i for i in node.input if i]) != 2:
            raise g.fail(node, f"inputs ({residual!r}, weight), got {list(node.input)}")
        weight = node.input[1]
    return g.init(weight, node, "the norm weight").astype(np.float32), float(a.get("epsilon", 1e-5))


def rotary(g: _Graph, node: Any, head_dim: int) -> tuple[list[float], float]:
    """(inverse frequencies, attention scaling) that ``cos / sin`` caches [positions, head_dim / 2]
    of a GroupQueryAttention ``node`` were computed from, checked by recomputing the caches. Every node must be read into the spec or compute an input of one
that is (the attention mask's reformatting): a branch off a block is refused, not dropped."""
    cos = g.init(node.input[7], node, "cos_cache").astype(np.float64)
    sin = g.init(node.input[8], node, "sin_cache").astype(np.float64)
    if cos.shape != sin.shape or cos.ndim != 2 or cos.shape[1] != head_dim // 2 or cos.shape[0] < 2:
        raise g.fail(node, f"cos / sin caches [positions >= 2, head_dim / 2 = {head_dim // 2}] (rotary over the "
                           f"whole head), got {list(cos.shape)} / {list(sin.shape)}")
    magnitude = np.hypot(cos, sin)
    scale = float(magnitude.mean())
    scale = 1.0 if math.isclose(scale, 1.0, rel_tol=1e-6) else scale
    angle = np.arctan2(sin, cos)
    inv = angle[1].copy()
    p = 2
    while p < cos.shape[0]:  # unwrap the phase at ever further positions: each refines the frequency
        turns = np.round((inv * p - angle[p]) / (2 * math.pi))
        inv = (angle[p] + 2 * math.pi * turns) / p
        p *= 2
    pos = np.arange(cos.shape[0], dtype=np.float64)[:, None] * inv[None, :]
    tol = max(1e-4, 3e-7 * cos.shape[0])  # float32 angles of the builder at the furthest position
    err = max(float(np.abs(np.cos(pos) * scale - cos).max()), float(np.abs(np.sin(pos) * scale - sin).max()))
    if not np.allclose(magnitude, scale, atol=1e-4) or err > tol:
        raise g.fail(node, f"cos / sin caches of RoPE, cos(p * f) and sin(p * f) times one scale, position p "
                           f"by row (off by {err:.2g} from the frequencies read from them)")
    return [float(f) for f in inv], scale


GQA_ATTRS = {"do_rotary": 1, "rotary_interleaved": 0, "softcap": 0.0}
"""GroupQueryAttention attributes the step implements, with the one value it implements."""


def _window(g: _Graph, node: Any, a: dict[str, Any]) -> int:
    """The step's ``sliding_window`` (keys a query attends, itself included; 0: all) for the
    attribute ``local_window_size``: the same count (what ONNX Runtime 1.32's CPU kernel attends,
    measured in tests/test_llm_onnx.py; the builder writes transformers' ``sliding_window`` there)."""
    w = int(a.get("local_window_size", -1))
    if w == 0 or w < -1:
        raise g.fail(node, f"local_window_size -1 (none) or > 0, got {w}")
    return max(w, 0)


def _attention(g: _Graph, i: int, node: Any, normed: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(sizes, weights) of layer ``i``'s GroupQueryAttention ``node`` and the q / k / v projections
    reading ``normed``."""
    a = _attrs(node)
    heads, kv_heads = int(a.get("num_heads", 0)), int(a.get("kv_num_heads", 0))
    for key, want in GQA_ATTRS.items():
        if a.get(key, want) != want:
            raise g.fail(node, f"{key} = {want} (what the step implements), got {a[key]}")
    inputs = list(node.input) + [""] * (12 - len(node.input))
    past = [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
    present = [f"present.{i}.key", f"present.{i}.value"]
    if inputs[3:5] != past or list(node.output[1:3]) != present or any(inputs[9:]):
        raise g.fail(node, f"past {past}, present {present}, no position_ids / attention_bias / head_sink; got "
                           f"inputs {inputs} outputs {list(node.output)}")
    if any(inputs[1:3]):
        (nq, q, bq), (nk, k, bk), (nv, v, bv) = (_projection(g, x, normed) for x in inputs[:3])
    else:
        _, qkv, bias = _projection(g, inputs[0], normed)
        n = qkv.shape[0]  # WeightCodes.shape is (N, K) too
        head_dim = n // (heads + 2 * kv_heads) if heads else 0
        cut = [0, heads * head_dim, (heads + kv_heads) * head_dim, n]
        q, k, v = (rows(qkv, cut[j], cut[j + 1]) for j in range(3))
        bq, bk, bv = (None,) * 3 if bias is None else (bias[cut[j]:cut[j + 1]] for j in range(3))
    n_q = q.shape[0]
    if not heads or not kv_heads or n_q % heads:
        raise g.fail(node, f"num_heads and kv_num_heads dividing the projections, got {heads}, {kv_heads}")
    head_dim = n_q // heads
    scale = float(a.get("scale", 0.0)) or head_dim ** -0.5
    if not math.isclose(scale, head_dim ** -0.5, rel_tol=1e-5):
        raise g.fail(node, f"scale 1 / sqrt(head_dim {head_dim}) = {head_dim ** -0.5:.6g}, got {scale:.6g}")
    weights = {"q": q, "k": k, "v": v}
    if bq is not None:
        weights.update({"q_bias": bq, "k_bias": bk, "v_bias": bv})
    inv_freq, rope_scale = rotary(g, node, head_dim)
    sizes = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "window": _window(g, node, a),
             "inv_freq": inv_freq,
             "rope_scale": rope_scale, "positions": g.init(node.input[7], node, "cos_cache").shape[0]}
    return sizes, weights


def _mlp(g: _Graph, normed: str, after: Any) -> tuple[dict[str, Any], str, Any]:
    """(weights, output, down node) of the SiLU MLP reading ``normed`` (an output of ``after``)."""
    linears = [n for n in g.consumers.get(normed, []) if n.op_type in LINEAR_OPS]
    gate = [n for n in linears if g.consumers_of(n.output[0], "Sigmoid")]
    if len(linears) != 2 or len(gate) != 1:
        got = "; ".join(f"{n.op_type} {n.name!r} read by {g.readers(n.output[0])}" for n in linears)
        raise g.fail(after, f"its output {normed!r} read by two MatMul / MatMulNBits (gate, up) with "
                            f"Sigmoid(gate) * gate (SiLU) after the gate; got {got or 'no MatMul'}")
    gate = gate[0]
    up = next(n for n in linears if n is not gate)
    sig = g.consumers_of(gate.output[0], "Sigmoid")[0]
    act = g.only_consumer(sig.output[0], ("Mul",), sig)
    if sorted(act.input) != sorted([gate.output[0], sig.output[0]]):
        raise g.fail(act, "Mul(gate, Sigmoid(gate)) (SiLU)")
    prod = g.only_consumer(act.output[0], ("Mul",), act)
    if sorted(prod.input) != sorted([act.output[0], up.output[0]]):
        raise g.fail(prod, "Mul(SiLU(gate), up)")
    down = g.only_consumer(prod.output[0], LINEAR_OPS, prod)
    g.take(sig, act, prod)
    weights = {"gate": _linear(g, gate, normed), "up": _linear(g, up, normed), "down": _linear(g, down, prod.output[0])}
    return weights, down.output[0], down


def _quantized_table(g: _Graph, node: Any) -> np.ndarray:
    """The float32 table [vocab, hidden] a ``GatherBlockQuantized`` node (com.microsoft; uint8 codes,
    4-bit two a byte as MatMulNBits packs them, blocks along the hidden axis) gathers from, dequantized
    (the embedding the builder ties to an int4 LM head: its codes, reshaped, and its scales)."""
    from ..quant.weight_only import WeightCodes, dequantize_codes

    a = _attrs(node)
    bits, block = int(a.get("bits", 4)), int(a.get("block_size", 128))
    inputs = list(node.input) + [""] * (4 - len(node.input))
    if a.get("gather_axis", 0) != 0 or a.get("quantize_axis", 1) not in (1, -1) or bits not in (4, 8) or (
            node.input[1] != "input_ids"):
        raise g.fail(node, f"GatherBlockQuantized(codes, input_ids, scales) on gather_axis 0, quantize_axis 1, "
                           f"bits 4 / 8; got {a}")
    src, reshape = inputs[0], g.producer.get(inputs[0])
    if reshape is not None:  # the LM head's [N, K / block, block * bits / 8] codes reshaped to [N, K * bits / 8]
        if reshape.op_type != "Reshape":
            raise g.fail(reshape, "the codes as an initializer or Reshape of one")
        src = reshape.input[0]
        g.take(reshape)
    data = g.init(src, reshape or node, "the embedding codes")
    scales = g.init(inputs[2], node, "the embedding scales")
    zero = g.init(inputs[3], node, "the zero points") if inputs[3] else None
    if data.dtype != np.uint8 or scales.ndim != 2 or (zero is not None and zero.dtype != np.uint8):
        raise g.fail(node, f"uint8 codes, scales [vocab, hidden / block] and uint8 zero points; got "
                           f"{data.dtype}{list(data.shape)}, {scales.dtype}{list(scales.shape)}")
    vocab, blocks = scales.shape
    if data.size != vocab * blocks * block * bits // 8:
        raise g.fail(node, f"codes of vocab {vocab} x hidden {blocks * block} at {bits} bits, got {data.size} bytes")
    if zero is not None and bits == 4:
        zero = np.stack([zero & 0x0F, zero >> 4], axis=-1).reshape(vocab, -1)[:, :blocks]
    codes = WeightCodes(bits, block, np.ascontiguousarray(data.reshape(vocab, -1)), scales.astype(np.float32),
                        None if zero is None else np.ascontiguousarray(zero.reshape(vocab, blocks)))
    try:
        codes.check(f"GatherBlockQuantized {node.name!r}")
    except QuantizationError as err:
        raise g.fail(node, f"well-formed codes: {err}") from None
    return dequantize_codes(codes)


def _embedding(g: _Graph) -> tuple[np.ndarray, str]:
    """(embedding [vocab, hidden], its Gather's output)."""
    readers = g.consumers.get("input_ids", [])
    if len(readers) != 1 or readers[0].op_type not in ("Gather", "GatherBlockQuantized"):
        raise FrontendError(f"{WHO}: expected input_ids read by one Gather or GatherBlockQuantized (the "
                            f"embedding), got {g.readers('input_ids')}")
    node = readers[0]
    g.take(node)
    if node.op_type == "GatherBlockQuantized":
        return _quantized_table(g, node), node.output[0]
    src = node.input[0]
    if src in g.producer:  # a tied embedding: Transpose of the LM head's [hidden, vocab] weight
        t = g.producer[src]
        if t.op_type != "Transpose" or list(_attrs(t).get("perm", [1, 0])) != [1, 0]:
            raise g.fail(t, "the embedding as an initializer or Transpose(perm=[1, 0]) of one")
        table = g.init(t.input[0], t, "the tied embedding").T
        g.take(t)
    else:
        table = g.init(src, node, "the embedding")
    if table.ndim != 2 or table.dtype != np.float32 or _attrs(node).get("axis", 0) != 0:
        raise g.fail(node, f"Gather(float32 [vocab, hidden], input_ids) on axis 0, got {table.dtype}{list(table.shape)}")
    return np.ascontiguousarray(table), node.output[0]


def _check_io(model: Any) -> int:
    """The number of layers, from the past / present names; a FrontendError for another file."""
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    layers = 0
    while f"past_key_values.{layers}.key" in inputs:
        layers += 1
    want_in = {"input_ids"} | {f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")}
    want_out = {"logits"} | {f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")}
    if not layers or not want_in <= inputs or not want_out <= outputs:
        raise FrontendError(f"{WHO}: expected a decoder with a past / present KV cache: inputs input_ids and "
                            "past_key_values.N.key / .value, outputs logits and present.N.key / .value; got inputs "
                            f"{sorted(inputs)}, outputs {sorted(outputs)}")
    extra = inputs - want_in - {"attention_mask"} - {i.name for i in model.graph.initializer}
    if extra:
        raise FrontendError(f"{WHO}: graph inputs {sorted(extra)} are not ones the step feeds (input_ids, "
                            "attention_mask, past_key_values.N.key / .value)")
    return layers


def _layer(g: _Graph, i: int, residual: str, normed: str, params: dict[str, Any]
           ) -> tuple[dict[str, Any], Any, list[float]]:
    """Read layer ``i`` (its input norm already read: ``normed``, ``residual``) into ``params``, the
    norm after it as the next layer's input norm (or the final norm); returns (attention sizes, that
    norm's node, the two norms' epsilons)."""
    attn = [n for n in g.consumers_of(f"past_key_values.{i}.key", "GroupQueryAttention")
            if n.domain == "com.microsoft"]
    if len(attn) != 1:
        found = [f"{n.op_type} {n.name!r}" for n in g.consumers.get(f"past_key_values.{i}.key", [])]
        raise FrontendError(f"{WHO}: expected past_key_values.{i}.key read by one com.microsoft "
                            f"GroupQueryAttention, got {found or 'nothing'} (attention spelled out in plain ops, as "
                            "optimum's exports write it, is not read yet)")
    sizes, weights = _attention(g, i, attn[0], normed)
    g.take(attn[0])
    o_node = g.only_consumer(attn[0].output[0], LINEAR_OPS, attn[0])
    weights["o"] = _linear(g, o_node, attn[0].output[0])
    post = g.only_consumer(o_node.output[0], ("SkipSimplifiedLayerNormalization",), o_node)
    params[f"l{i}.post_norm"], eps = _norm(g, post, True, residual, o_node.output[0])
    if len(post.output) < 4 or not post.output[3]:
        raise g.fail(post, "its fourth output (the residual sum) read by the next block")
    mlp, down_out, down = _mlp(g, post.output[0], post)
    weights.update(mlp)
    params.update({f"l{i}.{k}": v for k, v in weights.items()})
    nxt = g.only_consumer(down_out, ("SkipSimplifiedLayerNormalization",), down)
    weight, eps_next = _norm(g, nxt, True, post.output[3], down_out)
    params[f"l{i + 1}.in_norm" if i + 1 < g.layers else "final_norm"] = weight
    return sizes, nxt, [eps, eps_next]


def read_decoder(path: str | os.PathLike) -> tuple[DecoderSpec, dict[str, Any], int]:
    """(spec, weights by :func:`.model.step_module`'s parameter names, positions of the file's
    cos / sin caches) of the decoder file ``path``: float32 arrays, and
    :class:`~byoc_hetero.quant.weight_only.WeightCodes` for ``MatMulNBits`` weights (module doc)."""
    import onnx

    try:
        model = onnx.load(str(path))
    except Exception as err:  # noqa: BLE001 - onnx raises several kinds for an unreadable file
        from ..errors import ModelFileError

        raise ModelFileError(f"{WHO}: {path} is not a readable ONNX file: {err}") from err
    layers = _check_io(model)
    g = _Graph(model, layers)
    embed, h = _embedding(g)
    first = g.consumers_of(h, "SimplifiedLayerNormalization")
    if len(first) != 1:
        raise g.fail(g.producer[h], f"its output {h!r} read by one SimplifiedLayerNormalization (layer 0's input "
                                    f"norm), got {len(first)}")
    first = first[0]
    params: dict[str, Any] = {"embed": embed}
    params["l0.in_norm"], eps = _norm(g, first, False, h, None)
    residual, normed, norm_node, epsilons, sizes = h, first.output[0], first, [eps], []
    for i in range(layers):
        size, norm_node, eps = _layer(g, i, residual, normed, params)
        sizes.append(size)
        epsilons += eps
        residual, normed = (norm_node.output[3] if len(norm_node.output) > 3 else ""), norm_node.output[0]
    head = g.only_consumer(normed, LINEAR_OPS, norm_node)
    if head.output[0] != "logits":
        raise g.fail(head, "the LM head writing the graph output 'logits'")
    params["lm_head"] = _linear(g, head, normed)
    g.check_all_read()
    return _spec(sizes, epsilons, params), params, int(sizes[0]["positions"])


def _spec(sizes: list[dict[str, Any]], epsilons: list[float], params: dict[str, Any]) -> DecoderSpec:
    """The DecoderSpec of what :func:`read_decoder` read; layers must agree with one another."""
    first = sizes[0]
    for i, s in enumerate(sizes):
        if any(s[k] != first[k] for k in ("heads", "kv_heads", "head_dim", "window")) or not np.allclose(
                s["inv_freq"], first["inv_freq"], rtol=1e-5) or not math.isclose(s["rope_scale"], first["rope_scale"],
                                                                                 rel_tol=1e-5):
            raise FrontendError(f"{WHO}: layer {i}'s attention ({s['heads']} heads, {s['kv_heads']} kv heads, "
                                f"head_dim {s['head_dim']}, window {s['window']}, its RoPE) differs from layer 0's; the step needs one")
    if not np.allclose(epsilons, epsilons[0], rtol=1e-5):
        raise FrontendError(f"{WHO}: the norms' epsilons differ ({sorted(set(epsilons))}); the step takes one")
    layers = len(sizes)
    bias = [f"l{i}.q_bias" in params for i in range(layers)]
    if any(bias) and not all(bias):
        raise FrontendError(f"{WHO}: q / k / v biases in layers {[i for i, b in enumerate(bias) if b]} only")
    embed = params["embed"]
    intermediate = params["l0.gate"].shape[0]
    return DecoderSpec(family="onnx", layers=layers, hidden=int(embed.shape[1]), heads=first["heads"],
                       kv_heads=first["kv_heads"], head_dim=first["head_dim"], intermediate=int(intermediate),
                       vocab=int(embed.shape[0]), eps=float(epsilons[0]), activation="silu", qkv_bias=bias[0],
                       sliding_window=first["window"], embed_scale=1.0, rope_scale=first["rope_scale"],
                       inv_freq=first["inv_freq"])


def checked_shapes(spec: DecoderSpec, params: dict[str, Any]) -> None:
    """A FrontendError naming the first weight whose shape is not the one the step declares."""
    from .model import weight_shapes

    for name, shape in weight_shapes(spec).items():
        if name == "inv_freq":
            continue
        got = params[name].shape if name in params else None
        if got is None or tuple(got) != tuple(shape):
            raise FrontendError(f"{WHO}: weight {name} is {None if got is None else list(got)}; the decoder's sizes "
                                f"(hidden {spec.hidden}, heads {spec.heads} x {spec.head_dim}, kv heads "
                                f"{spec.kv_heads}, intermediate {spec.intermediate}, vocab {spec.vocab}) need "
                                f"{list(shape)}")


def file_path(path: str | os.PathLike) -> Path:
    """``path`` itself, or ``model.onnx`` in the folder ``path`` (ONNX Runtime GenAI's layout)."""
    p = Path(path)
    return p / "model.onnx" if p.is_dir() else p
