"""Token generation on CPU with a KV cache kept in place (``bh.llm``; docs/generation.md).

>>> gen = bh.llm.from_hf(model, max_length=256)        # a transformers ...ForCausalLM
>>> out = gen.generate(input_ids, max_new_tokens=32)   # int64 [batch, prompt + 32], greedy
>>> gen.save("smollm"); gen = bh.llm.load("smollm")

The decoder step is written from the model's config and weights (:mod:`.model`), partitioned (the
whole decoder stack one oneDNN region, each layer's attention a ``kv_attention`` node of it) and
built once; ``kv_attention`` (``cpp/kernels/kv_attention.cc``) appends the step's K / V to caches the
generator preallocates (:mod:`.generator`) and attends over them in place.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

from ..errors import InputError
from .generator import Generator, load
from .model import FAMILIES, DecoderSpec, decoder_spec, decoder_weights, step_module
from .sampling import Sampler

WEIGHTS = ("f32", "bf16")
"""Weight precisions :func:`from_hf` builds."""

QUANTIZED_WEIGHTS = ("int8", "int4")
"""Weight-only quantized precisions: they come with ``bh.quantize(mod, params, weights=...)``."""


def _precision(weights: str) -> str | None:
    """The ``bh.partition`` precision for ``weights``, or an InputError saying why not."""
    from .. import _C

    if weights in QUANTIZED_WEIGHTS:
        raise InputError(f"bh.llm.from_hf: weights={weights!r} comes with weight-only quantization "
                         "(bh.quantize(mod, params, weights=...)), not built here yet; use 'f32' or 'bf16'")
    if weights not in WEIGHTS:
        raise InputError(f"bh.llm.from_hf: weights must be one of {', '.join(WEIGHTS + QUANTIZED_WEIGHTS)}, "
                         f"got {weights!r}")
    if weights == "bf16" and not _C.bf16_native():
        raise InputError(f"bh.llm.from_hf: weights='bf16' needs oneDNN's native bf16 (avx512_core_bf16 or "
                         f"later); this machine's ISA is {_C.isa()}, where bf16 would be emulated and slower "
                         "than f32: use weights='f32'")
    return "bf16" if weights == "bf16" else None


def from_hf(model: Any, *, max_length: int, weights: str = "f32") -> Generator:
    """A :class:`Generator` for a transformers ``...ForCausalLM`` (Llama / SmolLM, Qwen2, Mistral,
    Gemma, Phi-3), its caches ``max_length`` tokens long (prompt plus new tokens).

    ``weights``: ``"f32"``, or ``"bf16"`` where oneDNN runs bf16 natively (else an InputError);
    ``"int8"`` / ``"int4"`` raise an InputError (weight-only quantization is a separate pass).
    The model is read (config and weights), not run; its forward code and cache classes are not used.
    """
    import byoc_hetero as bh

    precision = _precision(weights)
    if int(max_length) != max_length or max_length < 1:
        raise InputError(f"bh.llm.from_hf: max_length must be a positive integer, got {max_length!r}")
    spec = decoder_spec(model)
    mod = step_module(spec, int(max_length))
    part = bh.partition(mod, decoder_weights(spec, model), precision=precision)
    return Generator(relax.build(part, target="llvm"), spec, int(max_length), weights)


__all__ = ["FAMILIES", "DecoderSpec", "Generator", "Sampler", "decoder_spec", "decoder_weights", "from_hf", "load",
           "step_module"]
