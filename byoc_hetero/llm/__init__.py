"""Token generation on CPU with a KV cache kept in place (``bh.llm``; docs/generation.md).

>>> gen = bh.llm.from_hf(model, max_length=256)        # a transformers ...ForCausalLM
>>> out = gen.generate(input_ids, max_new_tokens=32)   # int64 [batch, prompt + 32], greedy
>>> gen.save("smollm"); gen = bh.llm.load("smollm")
>>> gen = bh.llm.from_onnx("qwen2-int4/model.onnx", max_length=256)  # ONNX Runtime GenAI's builder output

The decoder step is written from the model's config and weights (:mod:`.model`), partitioned (the
whole decoder stack one oneDNN region, each layer's attention a ``kv_attention`` node of it) and
built once; ``kv_attention`` (``cpp/kernels/kv_attention.cc``) appends the step's K / V to caches the
generator preallocates (:mod:`.generator`) and attends over them in place.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import InputError
from .generator import Generator, build_generator, load, return_freed_heap
from .gguf import from_gguf
from .model import FAMILIES, DecoderSpec, decoder_spec, decoder_weights, step_module
from .sampling import Sampler

WEIGHTS = ("f32", "bf16")
"""Weight precisions :func:`from_hf` builds."""

QUANTIZED_WEIGHTS = ("int8", "int4")
"""Weight-only quantized precisions (``bh.quantize(mod, params, weights=...)`` on the step's denses)."""

LM_HEAD = ("lm_head", "embed")
"""The LM head's weight under its two names (``embed`` where the model ties them to the embedding)."""

LM_HEAD_WEIGHTS = ("int8", "int4", "f32")
"""What ``from_hf(weights="int8" | "int4", lm_head=..., embedding=...)`` makes of the LM head and of
the embedding table (None: the LM head in the weights' format, the embedding in the LM head's)."""


def _precision(weights: str) -> str | None:
    """The ``bh.partition`` precision for ``weights``, or an InputError saying why not."""
    from .. import _C

    if weights not in WEIGHTS + QUANTIZED_WEIGHTS:
        raise InputError(f"bh.llm.from_hf: weights must be one of {', '.join(WEIGHTS + QUANTIZED_WEIGHTS)}, "
                         f"got {weights!r}")
    if weights == "bf16" and not _C.bf16_native():
        raise InputError(f"bh.llm.from_hf: weights='bf16' needs oneDNN's native bf16 (avx512_core_bf16 or "
                         f"later); this machine's ISA is {_C.isa()}, where bf16 would be emulated and slower "
                         "than f32: use weights='f32'")
    return "bf16" if weights == "bf16" else None


def _quantized(mod: tvm.IRModule, params: dict[str, np.ndarray], weights: str, group_size: int | None,
               lm_head: str | None = None, embedding: str | None = None, rounding: str | None = None
               ) -> tuple[tvm.IRModule, dict[str, np.ndarray], float | None]:
    """(module, params, weight error): the step's denses in weight-only form for int8 / int4, the LM
    head as ``lm_head`` says (None: as the others; ``"f32"``: float; ``"int8"`` / ``"int4"``: that
    format at its default grouping), the embedding's lookup as ``embedding`` says (None: as the LM
    head, so a tied table is one set of codes; ``"f32"``: the float table; ``"int8"`` / ``"int4"``);
    ``mod`` and ``params`` as they were, error None, otherwise. Grouped scales are float16, as GGUF's
    Q8_0 / Q4_0 blocks (the int8-activation kernels read them as they are: 18 bytes a 4-bit block of
    32, not 20); one scale per output channel stays float32 (its bytes are nothing)."""
    from ..errors import QuantizationError
    from ..quant import quantize
    from ..quant.weight_only import group_block

    if weights not in QUANTIZED_WEIGHTS:
        given = (("group_size", group_size), ("lm_head", lm_head), ("embedding", embedding), ("rounding", rounding))
        if any(v is not None for _, v in given):
            what = next(f"{n}={v!r}" for n, v in given if v is not None)
            raise InputError(f"bh.llm.from_hf: {what} applies to weights='int8' / 'int4', not {weights!r}")
        return mod, params, None
    for name, value, default in (("lm_head", lm_head, "the weights"), ("embedding", embedding, "the LM head")):
        if value not in (None, *LM_HEAD_WEIGHTS):
            raise InputError(f"bh.llm.from_hf: {name} must be None (as {default}), {', '.join(LM_HEAD_WEIGHTS)}; "
                             f"got {value!r}")
    head = lm_head or weights
    table = embedding or head
    # one pass per format, the weights' first (at ``group_size``, the others at their default grouping): each
    # quantizes the denses (and the lookup) in that format
    formats = [weights] + [fmt for fmt in dict.fromkeys((head, table)) if fmt not in (weights, "f32")]
    errors = []
    try:
        for fmt in formats:
            block = group_block(fmt, group_size if fmt == weights else None)
            options = {"group_size": -1 if block is None else block,
                       "scale_dtype": "float32" if block is None else "float16", "rounding": rounding}
            q = quantize(mod, params, weights=fmt, verbose=False, **options,
                         keep_float=lambda name, fmt=fmt: name in LM_HEAD and fmt != head,
                         lookups=("embed",) if table == fmt else None)
            mod, params = q.mod, q.params
            errors += [q.error] if q.layers else []
    except QuantizationError as err:
        raise InputError(f"bh.llm.from_hf: weights={weights!r} group_size={group_size!r} lm_head={lm_head!r} "
                         f"embedding={embedding!r} rounding={rounding!r}: {err}") from None
    return mod, params, max(errors, default=0.0)


def partitioned_step(model: Any, *, max_length: int, weights: str = "f32", group_size: int | None = None,
                     lm_head: str | None = None, embedding: str | None = None, rounding: str | None = None
                     ) -> tuple[tvm.IRModule, DecoderSpec, float | None]:
    """What :func:`from_hf` builds, before the build: (the partitioned step module, its
    :class:`DecoderSpec`, the weight quantization error or None). For inspecting the regions."""
    from ..stages import partition, shared_params

    precision = _precision(weights)
    if int(max_length) != max_length or max_length < 1:
        raise InputError(f"bh.llm.from_hf: max_length must be a positive integer, got {max_length!r}")
    spec = decoder_spec(model)
    mod, params, error = _quantized(step_module(spec, int(max_length)), decoder_weights(spec, model), weights,
                                    group_size, lm_head, embedding, rounding)
    # the constants are the model's own tensors (no copy: the build's peak is the model and the build), at
    # the 8-byte offsets of a safetensors file too, where only the regions read them (they need 4 bytes)
    shared = shared_params(params, alignment=4)
    part = partition(mod, shared, precision=precision)
    host = _host_constants(part)
    unaligned = {n for n, t in shared.items() if t is not params[n] and _address(t) % 64 and _address(t) in host}
    if unaligned:  # TVM's code reads these: copies of their own, 64-byte aligned
        part = partition(mod, {n: params[n] if n in unaligned else t for n, t in shared.items()}, precision=precision)
    return part, spec, error


def _address(tensor: Any) -> int:
    """The data address of a CPU tensor (0 where numpy cannot view it)."""
    try:
        return np.from_dlpack(tensor).ctypes.data
    except (TypeError, ValueError, BufferError, RuntimeError):
        return 0


def _host_constants(mod: tvm.IRModule) -> set[int]:
    """Data addresses of the constants the host functions of a partitioned module read (what TVM's
    generated code gets; the regions' constants left the functions for the const loader)."""
    found: set[int] = set()

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, tvm.ir.GenericConst):
            found.add(_address(expr.value))
        elif isinstance(expr, tvm.ir.Constant) and hasattr(expr, "data"):
            found.add(_address(expr.data))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def from_hf(model: Any, *, max_length: int, weights: str = "f32", group_size: int | None = None,
            lm_head: str | None = None, embedding: str | None = None, rounding: str | None = None) -> Generator:
    """A :class:`Generator` for a transformers ``...ForCausalLM`` (Llama / SmolLM, Qwen2, Mistral,
    Gemma, Phi-3), its caches ``max_length`` tokens long (prompt plus new tokens).

    ``weights``: ``"f32"``; ``"bf16"`` where oneDNN runs bf16 natively (else an InputError); or
    ``"int8"`` / ``"int4"``: weight-only quantization (``bh.quantize(mod, params, weights=...)``) of
    every dense of the decoder stack and of the LM head before the partition, each then a ``dense_wq``
    node. ``group_size``: 32 / 64 / 128 consecutive k per scale, -1 for one scale per output channel,
    None for the format's default (``quant.weight_only.DEFAULT_GROUP_SIZE``: 32 for int8 and int4,
    llama.cpp's Q8_0 / Q4_0 blocks); the hidden and intermediate sizes must be multiples of it; grouped scales are
    float16 (as GGUF's Q8_0 / Q4_0 blocks), per-channel ones float32. ``rounding``: ``"nearest"`` (each
    code the nearest on the stored scale) or ``"gguf"`` (llama.cpp's rule: with ``group_size=32``, the
    codes and scales of a Q8_0 / Q4_0 file of the same weights bit for bit), None
    ``quant.weight_only.DEFAULT_ROUNDING``. ``lm_head``: None quantizes the LM head as the other denses (what llama.cpp runs on a
    Q8_0 / Q4_0 file whose head is in the file's type), ``"int8"`` / ``"int4"`` in that format at its
    default grouping (``llama-quantize`` and NNCF keep the head wider than int4: ``"int8"``),
    ``"f32"`` keeps it float32. ``embedding``: the token embedding's table, None as the LM head
    (a tied table is then one set of codes, read by the head's ``dense_wq`` and by the lookup's
    ``take_wq``, which dequantizes only the rows looked up: no float32 copy of the table), ``"int8"``
    (one scale per row) / ``"int4"`` (blocks of 32) in that format, ``"f32"`` the float32 table (as
    NNCF's option to leave embeddings uncompressed). The generator's ``weight_error`` is the
    quantization's measured error (:class:`~byoc_hetero.quant.WeightOnlyModel`), None for float.
    The model is read (config and weights), not run; its forward code and cache classes are not used.
    Its float32 weights are not copied in memory: the build binds the model's tensors as they are
    (``stages.shared_params``), then writes the regions' constants to a temporary file of the
    generator's own, which it maps (``weights_file.spill_weights``; the folder ``BYOC_HETERO_WEIGHTS_DIR``
    names, else the system's temporary one): the generator holds neither the model's tensors nor the
    build's arrays, the model can be dropped or changed afterwards, and the generator's weights are
    resident once, as a loaded one's. Where that file cannot be written the generator keeps the
    model's tensors instead, and a call after an in-place change of one (torch counts them: an
    optimizer step, ``with torch.no_grad(): w.mul_(2)``) raises InputError naming it.
    """
    part, spec, error = partitioned_step(model, max_length=max_length, weights=weights, group_size=group_size,
                                         lm_head=lm_head, embedding=embedding, rounding=rounding)
    gen = build_generator(part, spec, max_length, weights, weight_error=error, sources=model)
    del part  # the build's arrays (int8 / int4 codes, q / k / v concatenated): freed, the heap handed back
    return_freed_heap()
    return gen


def _file_weights(spec: DecoderSpec, weights: dict[str, Any], max_length: int, weights_format: str | None,
                  group_size: int | None) -> tuple[tvm.IRModule, dict[str, np.ndarray], float | None, str]:
    """(step module, params, weight error, the weights' label) for weights that may hold
    WeightCodes (see :func:`generator_from_weights`)."""
    from ..quant.weight_only import WeightCodes, apply_weight_codes, dequantize_codes

    codes = {n: w for n, w in weights.items() if isinstance(w, WeightCodes)}
    floats = {n: dequantize_codes(w) if n in codes else np.asarray(w, dtype="float32") for n, w in weights.items()}
    floats["inv_freq"] = np.asarray(spec.inv_freq, dtype="float32")
    mod = step_module(spec, max_length)
    if weights_format is not None or not codes:
        if codes and weights_format != "f32":
            raise InputError(f"weights={weights_format!r}: {len(codes)} weights ({', '.join(sorted(codes)[:3])}, ...) "
                             "are quantized already; keep them (weights=None) or dequantize them (weights='f32')")
        fmt = weights_format or "f32"
        mod, params, error = _quantized(mod, floats, fmt, group_size)
        return mod, params, error, fmt
    if group_size is not None:
        raise InputError(f"group_size={group_size!r} applies to weights='int8' / 'int4'")
    bits = sorted({c.bits for c in codes.values()})
    mod, params = apply_weight_codes(mod, floats, codes)
    return mod, params, None, "/".join(f"int{b}" for b in bits)


def generator_from_weights(spec: DecoderSpec, weights: dict[str, Any], *, max_length: int,
                           weights_format: str | None = None, group_size: int | None = None) -> Generator:
    """A :class:`Generator` for a decoder given as its :class:`DecoderSpec` and its weights by
    :func:`step_module`'s parameter names (what a file reader produces: :func:`from_onnx`).

    A weight is a float array ([N, K] for a dense, as torch stores it) or a
    :class:`~byoc_hetero.quant.weight_only.WeightCodes` (quantized by the file's producer).
    ``weights_format``: None keeps each weight as given (codes run as ``dense_wq`` nodes, floats as
    float32); ``"f32"`` dequantizes the codes; ``"bf16"``, ``"int8"`` / ``"int4"`` (with
    ``group_size``) as :func:`from_hf`, for float weights only. ``inv_freq`` comes from the spec.
    The arrays are read while building (bound without a copy where aligned); the generator then maps a
    file of its own of the constants (as :func:`from_hf`'s) and holds none of them.
    """
    part, label, error = partitioned_weights(spec, weights, max_length=max_length, weights_format=weights_format,
                                             group_size=group_size)
    gen = build_generator(part, spec, max_length, label, weight_error=error)
    del part  # the build's arrays: freed (the caller's ``weights`` when it drops them), the heap handed back
    return_freed_heap()
    return gen


def partitioned_weights(spec: DecoderSpec, weights: dict[str, Any], *, max_length: int,
                        weights_format: str | None = None, group_size: int | None = None
                        ) -> tuple[tvm.IRModule, str, float | None]:
    """What :func:`generator_from_weights` builds, before the build: (the partitioned step module,
    the weights' label, the quantization error or None). For inspecting the regions."""
    from ..stages import partition, shared_params

    if int(max_length) != max_length or max_length < 1:
        raise InputError(f"bh.llm: max_length must be a positive integer, got {max_length!r}")
    precision = _precision(weights_format) if weights_format is not None else None
    mod, params, error, label = _file_weights(spec, weights, int(max_length), weights_format, group_size)
    # bound without a copy where the arrays allow it (64-byte aligned, writable: what the file reader and the
    # quantizer allocate); the others are copied
    return partition(mod, shared_params(params), precision=precision), label, error


def from_onnx(path: str | os.PathLike, *, max_length: int, weights: str | None = None, group_size: int | None = None
              ) -> Generator:
    """A :class:`Generator` for an ONNX decoder file with ``past_key_values.N.key / value`` inputs
    and ``present.N.key / value`` outputs, as ONNX Runtime GenAI's model builder writes it
    (``GroupQueryAttention``, ``[Skip]SimplifiedLayerNormalization``, ``MatMul`` or
    ``MatMulNBits``); ``path`` is the ``.onnx`` file or its folder (``model.onnx``).

    The graph is read, not imported (:mod:`byoc_hetero.llm.onnx`): its weights, sizes, epsilon and
    RoPE frequencies go into the same decoder step :func:`from_hf` builds, so prefill and decode are
    one build with the cache kept in place. ``weights``: None keeps the file's form (``MatMulNBits``
    weights quantized, run as ``dense_wq``; float ones float32); ``"f32"`` dequantizes
    ``MatMulNBits``; ``"bf16"`` / ``"int8"`` / ``"int4"`` (and ``group_size``) as :func:`from_hf`
    for a float file. ``max_length`` may not exceed the positions of the file's cos / sin caches
    (what ONNX Runtime can run). A graph it cannot map raises
    :class:`~byoc_hetero.errors.FrontendError` naming the node, its op type and what was expected.
    """
    from .onnx import WHO, checked_shapes, file_path, read_decoder

    spec, params, positions = read_decoder(file_path(path))
    checked_shapes(spec, params)
    if int(max_length) == max_length and max_length > positions:
        raise InputError(f"{WHO}: max_length {max_length} is longer than the file's cos / sin caches "
                         f"({positions} positions): the file defines no rotary angle past them")
    gen = generator_from_weights(spec, params, max_length=max_length, weights_format=weights, group_size=group_size)
    del params  # the file's arrays (the generator maps its own file of them): freed, the heap handed back
    return_freed_heap()
    return gen


__all__ = ["FAMILIES", "DecoderSpec", "Generator", "Sampler", "decoder_spec", "decoder_weights", "from_gguf",
           "from_hf", "from_onnx", "generator_from_weights", "load", "partitioned_step", "partitioned_weights",
           "return_freed_heap", "step_module"]
