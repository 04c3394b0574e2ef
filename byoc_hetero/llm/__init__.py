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

import numpy as np
import tvm
from tvm import relax

from ..errors import InputError
from .generator import Generator, load
from .model import FAMILIES, DecoderSpec, decoder_spec, decoder_weights, step_module
from .sampling import Sampler

WEIGHTS = ("f32", "bf16")
"""Weight precisions :func:`from_hf` builds."""

QUANTIZED_WEIGHTS = ("int8", "int4")
"""Weight-only quantized precisions (``bh.quantize(mod, params, weights=...)`` on the step's denses)."""

KEPT_FLOAT = ("lm_head",)
"""Weights :func:`from_hf` leaves float32 under int8 / int4: the LM head (the embedding is a ``take``,
never a dense)."""


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


def _quantized(mod: tvm.IRModule, params: dict[str, np.ndarray], weights: str, group_size: int | None
               ) -> tuple[tvm.IRModule, dict[str, np.ndarray], float | None]:
    """(module, params, weight error): the step's denses in weight-only form for int8 / int4 (the
    :data:`KEPT_FLOAT` ones aside); ``mod`` and ``params`` as they were, error None, otherwise."""
    from ..errors import QuantizationError
    from ..quant import quantize

    if weights not in QUANTIZED_WEIGHTS:
        if group_size is not None:
            raise InputError(f"bh.llm.from_hf: group_size={group_size!r} applies to weights='int8' / 'int4', "
                             f"not {weights!r}")
        return mod, params, None
    try:
        q = quantize(mod, params, weights=weights, group_size=group_size,
                     keep_float=lambda name: name in KEPT_FLOAT, verbose=False)
    except QuantizationError as err:
        raise InputError(f"bh.llm.from_hf: weights={weights!r} group_size={group_size!r}: {err}") from None
    return q.mod, q.params, q.error


def partitioned_step(model: Any, *, max_length: int, weights: str = "f32", group_size: int | None = None
                     ) -> tuple[tvm.IRModule, DecoderSpec, float | None]:
    """What :func:`from_hf` builds, before the build: (the partitioned step module, its
    :class:`DecoderSpec`, the weight quantization error or None). For inspecting the regions."""
    from ..stages import partition

    precision = _precision(weights)
    if int(max_length) != max_length or max_length < 1:
        raise InputError(f"bh.llm.from_hf: max_length must be a positive integer, got {max_length!r}")
    spec = decoder_spec(model)
    mod, params, error = _quantized(step_module(spec, int(max_length)), decoder_weights(spec, model), weights,
                                    group_size)
    return partition(mod, params, precision=precision), spec, error


def from_hf(model: Any, *, max_length: int, weights: str = "f32", group_size: int | None = None) -> Generator:
    """A :class:`Generator` for a transformers ``...ForCausalLM`` (Llama / SmolLM, Qwen2, Mistral,
    Gemma, Phi-3), its caches ``max_length`` tokens long (prompt plus new tokens).

    ``weights``: ``"f32"``; ``"bf16"`` where oneDNN runs bf16 natively (else an InputError); or
    ``"int8"`` / ``"int4"``: weight-only quantization (``bh.quantize(mod, params, weights=...)``) of
    every dense of the decoder stack before the partition, each then a ``dense_wq`` node, activations
    float32; the LM head and the embedding stay float32. ``group_size``: 32 / 64 / 128 consecutive k
    per scale (int4's default 32), None for one scale per output channel (int8's default); the
    hidden and intermediate sizes must be multiples of it. The generator's ``weight_error`` is the
    quantization's measured error (:class:`~byoc_hetero.quant.WeightOnlyModel`), None for float.
    The model is read (config and weights), not run; its forward code and cache classes are not used.
    """
    part, spec, error = partitioned_step(model, max_length=max_length, weights=weights, group_size=group_size)
    return Generator(relax.build(part, target="llvm"), spec, int(max_length), weights, weight_error=error)


__all__ = ["FAMILIES", "DecoderSpec", "Generator", "Sampler", "decoder_spec", "decoder_weights", "from_hf", "load",
           "partitioned_step", "step_module"]
