"""A Hugging Face decoder as one Relax step function with its KV cache as explicit, in-place state.

:func:`decoder_spec` reads a transformers ``...ForCausalLM`` (its config and weights, nothing of its
forward code or cache classes) into a :class:`DecoderSpec`; :func:`step_module` writes the decoder
step from it as a Relax module, as MLC-LLM defines its models from the config rather than tracing:

``main(input_ids [B, S] int64, past [B] int64, lengths [B] int64, last [B] int64,
k_cache_0, v_cache_0, ..., k_cache_{L-1}, v_cache_{L-1}, <weights>) -> logits [B, vocab]``

with symbolic ``B`` and ``S``: one module serves the prefill (any prompt length) and the decode
(``S`` = 1). ``past[b]`` tokens of sequence ``b`` are in its cache, ``lengths[b]`` of the ``S`` rows
are its new tokens (the rest padding), ``last[b]`` the flat row ``b * S + lengths[b] - 1`` whose
hidden state the LM head reads (logits for each sequence's last position only; by default
(``BYOC_HETERO_LAST_LAYER_ROWS=last``) the last layer itself runs q, the attention, o and the MLP on those rows
alone, its k and v on every row). Each cache is
``[B, kv_heads, max_length, head_dim]`` float32, preallocated by the generator and written in place
by each layer's attention, ``R.call_tir_inplace`` of the TIR function ``byoc_hetero_kv_attention``
(q and both caches in place; ``cpp/kernels/kv_attention.cc``): RoPE at the position offset, the new
K / V rows appended at ``past``, causal (sliding-window) grouped-query attention over the cache, no
[S, S] mask. ``bh.partition`` makes that call a ``kv_attention`` node of the decoder's one region
(backends/onednn/ops/kv_attention.py); the llvm-only build runs the TIR function, which calls the
same kernel as the packed function ``byoc_hetero.runtime.kv_attention``.

A model whose LM head is its embedding table (tied, as SmolLM, Gemma and Llama 3.2 are) has one
``embed`` weight, read by the embedding's ``take`` and by the LM head's dense: one constant, not
two copies of the largest matrix. Everything else is ordinary Relax: denses are
``matmul(x, permute_dims(W))`` with ``W`` a weight parameter (bound as a constant by ``bh.partition``: what the oneDNN backend offloads and what a
weight-quantization pass rewrites), RMSNorm spelled as transformers computes it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import FrontendError

R = relax.op
KV_ATTENTION = "byoc_hetero.runtime.kv_attention"


@dataclass
class DecoderSpec:
    """What the step function needs of a decoder: sizes, family switches and the RoPE frequencies."""

    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    activation: str  # "silu" | "gelu_tanh"
    qkv_bias: bool
    sliding_window: int  # 0: none
    embed_scale: float  # Gemma: sqrt(hidden); else 1
    rope_scale: float  # transformers' attention_scaling
    inv_freq: list[float] = field(repr=False)
    tied_embeddings: bool = False  # the LM head reads the embedding table (one weight, not two)

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON-serializable values (what ``Generator.save`` writes)."""
        return asdict(self)


FAMILIES = {
    "llama": "silu",
    "qwen2": "silu",
    "mistral": "silu",
    "gemma": "gelu_tanh",
    "phi3": "silu",
}
"""transformers ``model_type`` -> MLP activation of the families :func:`decoder_spec` reads."""


def _family(config) -> str:
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise FrontendError(f"bh.llm: model_type {family!r} is not supported (supported: {', '.join(FAMILIES)})")
    return family


def _rotary(model, head_dim: int) -> tuple[list[float], float]:
    """(inverse frequencies, attention_scaling) of the model's own rotary embedding module."""
    rotary = getattr(model.model, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default")
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise FrontendError("bh.llm: the model has no model.rotary_emb.inv_freq (a transformers RoPE decoder)")
    if rope_type in ("dynamic", "longrope"):
        raise FrontendError(f"bh.llm: rope_type {rope_type!r} changes its frequencies with the length; "
                            "supported: default, linear, llama3, yarn")
    inv = rotary.inv_freq.detach().float().cpu().numpy()
    if inv.shape != (head_dim // 2,):
        raise FrontendError(f"bh.llm: RoPE over {2 * inv.shape[0]} of the head's {head_dim} dims "
                            "(partial rotary) is not supported")
    return [float(f) for f in inv], float(getattr(rotary, "attention_scaling", 1.0))


def decoder_spec(model) -> DecoderSpec:
    """The :class:`DecoderSpec` of a transformers ``...ForCausalLM``."""
    config = model.config
    family = _family(config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    inv_freq, rope_scale = _rotary(model, head_dim)
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    want = FAMILIES[family]
    if (want == "silu") != (act == "silu") or (want == "gelu_tanh" and act not in ("gelu_pytorch_tanh", "gelu")):
        raise FrontendError(f"bh.llm: {family} with activation {act!r} is not supported (expected {want})")
    window = getattr(config, "sliding_window", None) if family in ("mistral", "qwen2") else None
    if family == "qwen2" and not getattr(config, "use_sliding_window", False):
        window = None
    return DecoderSpec(
        family=family, layers=config.num_hidden_layers, hidden=config.hidden_size, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads, head_dim=head_dim,
        intermediate=config.intermediate_size, vocab=config.vocab_size, eps=float(config.rms_norm_eps),
        activation=want, qkv_bias=family == "qwen2" or bool(getattr(config, "attention_bias", False)),
        sliding_window=int(window or 0), embed_scale=float(config.hidden_size ** 0.5) if family == "gemma" else 1.0,
        rope_scale=rope_scale, inv_freq=inv_freq, tied_embeddings=_tied(model))


def _tied(model) -> bool:
    """Whether the LM head's weight is the embedding table itself (the same storage, as transformers
    ties them): then the step reads one ``embed`` weight for both."""
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    return head is embed or (head.shape == embed.shape and head.data_ptr() == embed.data_ptr())


def _np(t) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().cpu().numpy())


def _attention_weights(spec: DecoderSpec, attn) -> dict[str, np.ndarray]:
    q = spec.heads * spec.head_dim
    kv = spec.kv_heads * spec.head_dim
    if hasattr(attn, "qkv_proj"):  # Phi-3: one fused projection [q; k; v]
        w = _np(attn.qkv_proj.weight)
        out = {"q": w[:q], "k": w[q:q + kv], "v": w[q + kv:]}
    else:
        out = {n: _np(getattr(attn, f"{n}_proj").weight) for n in "qkv"}
    if spec.qkv_bias:
        for n in "qkv":
            out[f"{n}_bias"] = _np(getattr(attn, f"{n}_proj").bias)
    out["o"] = _np(attn.o_proj.weight)
    return out


def _mlp_weights(spec: DecoderSpec, mlp) -> dict[str, np.ndarray]:
    if hasattr(mlp, "gate_up_proj"):  # Phi-3: one fused projection [gate; up]
        w = _np(mlp.gate_up_proj.weight)
        return {"gate": w[:spec.intermediate], "up": w[spec.intermediate:], "down": _np(mlp.down_proj.weight)}
    return {n: _np(getattr(mlp, f"{n}_proj").weight) for n in ("gate", "up", "down")}


def _norm_weight(spec: DecoderSpec, norm) -> np.ndarray:
    w = _np(norm.weight)
    return w + 1.0 if spec.family == "gemma" else w  # Gemma's RMSNorm multiplies by (1 + weight)


def decoder_weights(spec: DecoderSpec, model) -> dict[str, np.ndarray]:
    """The model's weights by the parameter names :func:`step_module` gives them (float32)."""
    params = {"embed": _np(model.model.embed_tokens.weight), "final_norm": _norm_weight(spec, model.model.norm)}
    for i, layer in enumerate(model.model.layers):
        params[f"l{i}.in_norm"] = _norm_weight(spec, layer.input_layernorm)
        params[f"l{i}.post_norm"] = _norm_weight(spec, layer.post_attention_layernorm)
        for name, w in {**_attention_weights(spec, layer.self_attn), **_mlp_weights(spec, layer.mlp)}.items():
            params[f"l{i}.{name}"] = w
    if not spec.tied_embeddings:
        params["lm_head"] = _np(model.lm_head.weight)
    params["inv_freq"] = np.asarray(spec.inv_freq, dtype="float32")
    return params


KERNEL_FUNC = "byoc_hetero_kv_attention"
"""The TIR function's name: the oneDNN backend's rule offloads calls of it (ops/kv_attention.py)."""


LAST_LAYER_VARIABLE = "BYOC_HETERO_LAST_LAYER_ROWS"
"""``last``: the step's last layer computes q, the attention, o and the MLP for each sequence's last row alone
(the LM head reads no other row; every row's k and v still go into the cache: kv_attention's one-row q), the
default; ``all``: every row. Read when :func:`step_module` writes the step. Quiet A/B (Zen 5, 2 threads,
Qwen2.5-0.5B f32 prefill, interleaved): 1.027x at 1024 tokens, 1.036x at 128; SmolLM at 1 thread 1.013x / 1.034x
(bench/GENERATE.md, session 17 end)."""


def last_layer_rows() -> str:
    """``BYOC_HETERO_LAST_LAYER_ROWS`` (``all`` | ``last``; unset or empty: ``last``); another value is a
    ValueError naming the variable."""
    value = os.environ.get(LAST_LAYER_VARIABLE, "").strip() or "last"
    if value not in ("all", "last"):
        raise ValueError(f"{LAST_LAYER_VARIABLE} must be all or last, got {value!r}")
    return value


def kv_params(spec: DecoderSpec) -> np.ndarray:
    """The layer constants kv_attention takes as its last argument: scale, window, rope scale."""
    return np.array([spec.head_dim ** -0.5, spec.sliding_window, spec.rope_scale], dtype="float32")


def kv_attention_func(spec: DecoderSpec, max_length: int):
    """The TIR function the step calls with ``R.call_tir_inplace`` (q, k_cache, v_cache in place):
    it passes its buffers and the layer constants to the runtime's ``kv_attention``."""
    from tvm.script import tirx as T

    heads, kv_heads, dim, length = spec.heads, spec.kv_heads, spec.head_dim, max_length

    @T.prim_func(private=True)
    def kv_attention(vq: T.handle, vk: T.handle, vv: T.handle, vkc: T.handle, vvc: T.handle, vpast: T.handle,
                     vlengths: T.handle, vinv: T.handle, vparams: T.handle):
        batch, rows, q_rows = T.int64(), T.int64(), T.int64()
        q = T.match_buffer(vq, (batch, q_rows, heads, dim), "float32")  # rows, or 1 (each sequence's last row)
        k = T.match_buffer(vk, (batch, rows, kv_heads, dim), "float32")
        v = T.match_buffer(vv, (batch, rows, kv_heads, dim), "float32")
        k_cache = T.match_buffer(vkc, (batch, kv_heads, length, dim), "float32")
        v_cache = T.match_buffer(vvc, (batch, kv_heads, length, dim), "float32")
        past = T.match_buffer(vpast, (batch,), "int64")
        lengths = T.match_buffer(vlengths, (batch,), "int64")
        inv_freq = T.match_buffer(vinv, (dim // 2,), "float32")
        params = T.match_buffer(vparams, (3,), "float32")
        T.evaluate(T.call_packed(KV_ATTENTION, q, k, v, k_cache, v_cache, past, lengths, inv_freq,
                                 T.Cast("float64", params[0]), T.Cast("int64", params[1]),
                                 T.Cast("float64", params[2])))

    return kv_attention


class _Step:
    """Writes the step function's body into a BlockBuilder (one method per block of the decoder)."""

    def __init__(self, spec: DecoderSpec, max_length: int, weights: dict[str, relax.Var]):
        self.spec, self.max_length, self.w = spec, max_length, weights
        self.bb = relax.BlockBuilder.current()
        self.kernel = self.bb.add_func(kv_attention_func(spec, max_length), KERNEL_FUNC)
        self.kv_params = relax.const(kv_params(spec))
        self.last_only = last_layer_rows() == "last"

    def emit(self, expr: relax.Expr) -> relax.Var:
        return self.bb.emit(expr)

    def rms_norm(self, x: relax.Expr, weight: str) -> relax.Var:
        """transformers' RMSNorm: weight * (x * rsqrt(mean(x^2) + eps)) (Gemma's 1 + weight folded)."""
        e = self.emit
        mean = e(R.mean(e(R.power(x, relax.const(np.float32(2.0)))), axis=[-1], keepdims=True))
        inv = e(R.rsqrt(e(R.add(mean, relax.const(np.float32(self.spec.eps))))))
        return e(R.multiply(self.w[weight], e(R.multiply(x, inv))))

    def linear(self, x: relax.Expr, weight: str, bias: str | None = None) -> relax.Var:
        """x @ W^T (+ b): a torch Linear as torch.export writes it."""
        y = self.emit(R.matmul(x, self.emit(R.permute_dims(self.w[weight], [1, 0]))))
        return self.emit(R.add(y, self.w[bias])) if bias else y

    def attention(self, i: int, x: relax.Expr, io: dict[str, relax.Var], b, s, pick=None) -> relax.Var:
        """Layer ``i``'s attention block of the normed rows ``x`` [B, S, hidden]: [B, S, hidden]; with ``pick``
        (rows [B, S, hidden] -> each sequence's last row, [B, hidden]) only the last rows' output, [B, hidden]:
        k and v of every row (the cache's), q of the last rows alone."""
        spec = self.spec
        q_rows, q_in = (s, x) if pick is None else (1, pick(x))

        def project(name: str, src: relax.Expr, rows, heads: int) -> relax.Var:
            y = self.linear(src, f"l{i}.{name}", f"l{i}.{name}_bias" if spec.qkv_bias else None)
            return self.emit(R.reshape(y, (b, rows, heads, spec.head_dim)))

        q = project("q", q_in, q_rows, spec.heads)
        k, v = (project(n, x, s, spec.kv_heads) for n in ("k", "v"))
        q_type = relax.TensorType((b, q_rows, spec.heads, spec.head_dim), "float32")
        cache = io[f"k_cache_{i}"].ty
        out = self.emit(R.call_tir_inplace(
            self.kernel, [q, k, v, io[f"k_cache_{i}"], io[f"v_cache_{i}"], io["past"], io["lengths"],
                          self.w["inv_freq"], self.kv_params],
            inplace_indices=[0, 3, 4], out_ty=[q_type, cache, cache]))
        attended = self.emit(relax.TupleGetItem(out, 0))
        shape = (b, s, spec.heads * spec.head_dim) if pick is None else (b, spec.heads * spec.head_dim)
        return self.linear(self.emit(R.reshape(attended, shape)), f"l{i}.o")

    def last_layer(self, i: int, h: relax.Expr, io: dict[str, relax.Var], b, s) -> relax.Var:
        """Layer ``i`` (the last) for each sequence's last row alone, [B, hidden]: the rows the LM head reads.
        Every row's k and v still go into the cache; q, the attention, o and the MLP run for one row a sequence
        (LAST_LAYER_VARIABLE)."""
        spec = self.spec

        def pick(rows: relax.Expr) -> relax.Var:
            return self.emit(R.take(self.emit(R.reshape(rows, (b * s, spec.hidden))), io["last"], axis=0))

        residual = pick(h)  # before the o dense: its residual sum (fold_residual_adds) reads what was computed first
        attended = self.attention(i, self.rms_norm(h, f"l{i}.in_norm"), io, b, s, pick)
        rows = self.emit(R.add(residual, attended))
        return self.emit(R.add(rows, self.mlp(i, self.rms_norm(rows, f"l{i}.post_norm"))))

    def mlp(self, i: int, x: relax.Expr) -> relax.Var:
        gate = self.linear(x, f"l{i}.gate")
        act = R.nn.silu(gate) if self.spec.activation == "silu" else R.nn.gelu_tanh(gate)
        return self.linear(self.emit(R.multiply(self.emit(act), self.linear(x, f"l{i}.up"))), f"l{i}.down")

    def body(self, io: dict[str, relax.Var], b, s) -> relax.Var:
        spec = self.spec
        h = self.emit(R.take(self.w["embed"], io["input_ids"], axis=0))
        if spec.embed_scale != 1.0:
            h = self.emit(R.multiply(h, relax.const(np.float32(spec.embed_scale))))
        full = spec.layers - 1 if self.last_only else spec.layers  # layers computed for every row
        for i in range(full):
            h = self.emit(R.add(h, self.attention(i, self.rms_norm(h, f"l{i}.in_norm"), io, b, s)))
            h = self.emit(R.add(h, self.mlp(i, self.rms_norm(h, f"l{i}.post_norm"))))
        if self.last_only:
            rows = self.last_layer(full, h, io, b, s)
        else:
            rows = self.emit(R.take(self.emit(R.reshape(h, (b * s, spec.hidden))), io["last"], axis=0))
        return self.linear(self.rms_norm(rows, "final_norm"), "embed" if spec.tied_embeddings else "lm_head")


def weight_shapes(spec: DecoderSpec) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of every weight :func:`step_module` declares."""
    q, kv, hd = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.hidden
    shapes: dict[str, tuple[int, ...]] = {"embed": (spec.vocab, hd), "final_norm": (hd,),
                                          "inv_freq": (spec.head_dim // 2,)}
    for i in range(spec.layers):
        per = {"in_norm": (hd,), "post_norm": (hd,), "q": (q, hd), "k": (kv, hd), "v": (kv, hd), "o": (hd, q),
               "gate": (spec.intermediate, hd), "up": (spec.intermediate, hd), "down": (hd, spec.intermediate)}
        if spec.qkv_bias:
            per.update({"q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,)})
        shapes.update({f"l{i}.{n}": s for n, s in per.items()})
    if not spec.tied_embeddings:
        shapes["lm_head"] = (spec.vocab, hd)
    return shapes


def step_module(spec: DecoderSpec, max_length: int) -> tvm.IRModule:
    """The decoder step of ``spec`` (module doc) with caches of ``max_length`` positions."""
    b, s = tvm.tirx.Var("B", "int64"), tvm.tirx.Var("S", "int64")
    cache = relax.TensorType((b, spec.kv_heads, max_length, spec.head_dim), "float32")
    io = {"input_ids": relax.Var("input_ids", relax.TensorType((b, s), "int64"))}
    for name in ("past", "lengths", "last"):
        io[name] = relax.Var(name, relax.TensorType((b,), "int64"))
    for i in range(spec.layers):
        io[f"k_cache_{i}"] = relax.Var(f"k_cache_{i}", cache)
        io[f"v_cache_{i}"] = relax.Var(f"v_cache_{i}", cache)
    weights = {n: relax.Var(n, relax.TensorType(shape, "float32")) for n, shape in weight_shapes(spec).items()}
    bb = relax.BlockBuilder()
    with bb.function("main", [*io.values(), *weights.values()], attrs={"num_input": len(io)}):
        with bb.dataflow():
            logits = bb.emit_output(_Step(spec, max_length, weights).body(io, b, s))
        bb.emit_func_output(logits)
    return bb.get()
