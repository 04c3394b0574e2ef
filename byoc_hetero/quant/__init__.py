"""Quantization: our own post-training quantizer (:func:`quantize`) and the checks of quantized
models (:mod:`byoc_hetero.qdq_checks`).

:func:`quantize` turns a float Relax module into the QDQ form that ONNX Runtime's
``quantize_static`` files import as (:mod:`.plan` decides where, :mod:`.calibrate` measures the
ranges, :mod:`.insert_qdq` rewrites), so that ``bh.partition`` treats both alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from ..errors import QuantizationError
from .calibrate import METHODS, Observations, build_observer, run_observer
from .fold_batch_norms import fold_batch_norms
from .insert_qdq import insert_qdq, replaced_weights
from .plan import Layer, activation_qparams, plan, tensor_index
from .weight_only import WeightOnlyModel, quantize_weights

__all__ = ["QuantizedLayer", "QuantizedModel", "WeightOnlyModel", "quantize"]

ACTIVATION_DTYPES = ("uint8", "int8")


@dataclass
class QuantizedLayer:
    """A layer as quantized: ``inputs`` holds each activation input's ``(scale, zero_point)``,
    ``output`` the output's, ``weight_scale`` the weight's scales (per output channel, or one)."""

    index: int
    name: str
    op: str
    weight: str | None
    bias: str | None
    inputs: list[tuple[float, int]]
    output: tuple[float, int]
    weight_scale: np.ndarray | None = field(repr=False, default=None)
    relu: bool = False


@dataclass
class QuantizedModel:
    """What :func:`quantize` returns; unpacks as ``mod, params = bh.quantize(...)``.

    ``error`` is the largest relative error (max |quantized − float| / max |float|, over outputs and
    calibration inputs) of the quantized module against the float one on the calibration inputs;
    ``layers`` the quantized layers, ``kept_float`` the names of those left float32.
    """

    mod: tvm.IRModule
    params: dict[str, np.ndarray]
    error: float
    layers: list[QuantizedLayer]
    kept_float: list[str]
    method: str
    activation_dtype: str

    def __iter__(self):
        return iter((self.mod, self.params))

    def summary(self) -> str:
        """One line: layers quantized and kept, method, and the measured error."""
        kept = f", {len(self.kept_float)} kept float ({', '.join(self.kept_float)})" if self.kept_float else ""
        return (f"quantized {len(self.layers)} layers to int8{kept} ({self.method} ranges, "
                f"{self.activation_dtype} activations, s8 weights); error vs float32 on the calibration "
                f"inputs: {self.error:.2e} (max relative)")


def _calibration_inputs(mod: tvm.IRModule, params: Mapping[str, np.ndarray], calibration: Any) -> list[list[np.ndarray]]:
    """The calibration inputs as lists in ``main``'s input order, checked against its signature."""
    from ..inputs import sample_lists

    if isinstance(calibration, np.ndarray) or calibration is None:
        raise QuantizationError("calibration must be a non-empty list of inputs (each an array, a list of "
                                "arrays in input order, or a dict by input name)")
    samples = list(calibration)
    if not samples:
        raise QuantizationError("calibration is empty: at least one input is needed to measure ranges")
    return sample_lists(mod, samples, params)


def _check_options(method: str, activation_dtype: str, percentile: float) -> None:
    if method not in METHODS:
        raise QuantizationError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if activation_dtype not in ACTIVATION_DTYPES:
        raise QuantizationError(f"activation_dtype must be 'uint8' or 'int8', got {activation_dtype!r}")
    if not 50.0 < float(percentile) <= 100.0:
        raise QuantizationError(f"percentile must lie in (50, 100], got {percentile!r}")


def _layer_report(layers: list[Layer], qparams: Mapping, points: Mapping, scales: Mapping[str, np.ndarray]
                  ) -> list[QuantizedLayer]:
    def qp(var):
        s, z, _ = qparams[points[var]]
        return float(s), int(z)

    return [QuantizedLayer(lyr.index, lyr.name, lyr.op, lyr.weight, lyr.bias, [qp(a) for a in lyr.inputs],
                           qp(lyr.output), scales.get(lyr.weight) if lyr.weight else None,
                           lyr.dropped_relu is not None) for lyr in layers]


def quantize(mod: tvm.IRModule, params: Mapping[str, np.ndarray], calibration: Sequence[Any] | None = None,
             method: str = "minmax", keep_float: Sequence[int | str] | Callable[[Layer], bool] | None = None,
             per_channel: bool = True, activation_dtype: str = "uint8", percentile: float = 99.99,
             calibrate_on: str = "llvm", verbose: bool = True, weights: str | None = None,
             group_size: int | None = None, zero_points: bool = False,
             scale_dtype: str = "float32", lookups: Sequence[str] | Callable[[str], bool] | None = None,
             rounding: str | None = None) -> QuantizedModel | WeightOnlyModel:
    """Static post-training int8 quantization of a float module (weights as ``params``), or, with
    ``weights``, weight-only quantization of its dense layers.

    **Weight-only** (``weights="int8"`` or ``"int4"``; no calibration): every matmul on a 2-D float32
    weight reads int8 / int4 codes with ``group_size`` (32 / 64 / 128 consecutive k, -1 one scale per
    output channel, None the format's default: ``weight_only.DEFAULT_GROUP_SIZE``, 32 for int8 and
    int4) scales of ``scale_dtype`` (``"float32"`` / ``"float16"``), symmetric or with
    ``zero_points``, rounded as ``rounding`` says (``"nearest"``: the nearest code on the stored
    scale; ``"gguf"``: llama.cpp's Q8_0 / Q4_0 rule, codes from the float32 scale; None:
    ``weight_only.DEFAULT_ROUNDING``); activations stay float32. ``keep_float``
    then names matmuls by index or weight name (or is a predicate on the weight name); ``lookups``
    names 2-D weights (or is a predicate on the name) whose ``take(W, ids, axis=0)`` rows, an
    embedding lookup, read codes in the same format (a ``take_wq`` node: only the rows looked up are
    dequantized; a table tied to a quantized matmul shares its codes). Returns a
    :class:`~byoc_hetero.quant.weight_only.WeightOnlyModel` whose ``error`` is the largest relative
    error of a layer's output on random inputs (:mod:`byoc_hetero.quant.weight_only`); the oneDNN
    backend runs each such layer as one ``dense_wq`` node, llvm dequantizes and multiplies.

    An inference batch norm after a convolution is folded into it first (:mod:`.fold_batch_norms`).
    Each conv2d / matmul layer (:mod:`byoc_hetero.quant.plan`) gets int8 weights (symmetric, one
    scale per output channel with ``per_channel``), an int32 bias, and ``activation_dtype`` activations
    with calibrated asymmetric ranges at its inputs and output, in the QDQ form of ONNX Runtime's
    ``quantize_static`` (relax.quantize / relax.dequantize): ``bh.partition`` treats the result as it
    treats such a file.

    ``calibration``: sample inputs, each an array (one-input model), a list of arrays in input order,
    or a dict by input name. ``method``: ``"minmax"``, ``"percentile"`` (``percentile``-th, default
    99.99) or ``"entropy"`` (KL divergence, :mod:`byoc_hetero.quant.calibrate`). ``keep_float``:
    layers to leave float32, by index, name (``"conv2d_0"``, ``"matmul_2"``) or weight parameter name,
    or a predicate on a :class:`~byoc_hetero.quant.plan.Layer`. ``calibrate_on``: ``"llvm"`` or
    ``"onednn"`` (the offloaded float build) runs the calibration — one build returning every observed
    activation — and the error measurement.

    Returns a :class:`QuantizedModel` (``mod, params = bh.quantize(...)``), whose ``error`` is measured
    on the calibration inputs against the float model and printed when ``verbose``. Raises
    :class:`~byoc_hetero.errors.QuantizationError` for a bad option or a model without a layer to
    quantize, :class:`~byoc_hetero.errors.InputError` for calibration inputs that do not fit ``main``.

    >>> mod, params = bh.models.mlp()
    >>> q = bh.quantize(mod, params, calibration=[np.random.rand(1, 64).astype("float32")])
    >>> m = bh.partition(q.mod, q.params)
    """
    if weights is not None:
        return quantize_weights(mod, params, weights, group_size, zero_points, scale_dtype, keep_float,
                                verbose=verbose, lookups=lookups, rounding=rounding)
    if rounding is not None:
        raise QuantizationError(f"rounding={rounding!r} applies to weight-only quantization (weights='int8' / 'int4')")
    if lookups is not None:
        raise QuantizationError(f"lookups={lookups!r} applies to weight-only quantization (weights='int8' / 'int4')")
    _check_options(method, activation_dtype, percentile)
    func, params = fold_batch_norms(mod["main"], params)  # one int8 conv, not conv + float batch norm
    if func is not mod["main"]:
        mod = mod.clone()
        mod["main"] = func
    samples = _calibration_inputs(mod, params, calibration)
    the_plan, kept = plan(func, set(params), keep_float)
    if not the_plan.layers:
        raise QuantizationError("no layer to quantize: no conv2d (NCHW/OIHW) or matmul whose weight is a "
                                "parameter or whose operands are both activations"
                                + (f" (kept float: {', '.join(k.name for k in kept)})" if kept else ""))
    qparams, floats = _calibrate(mod, params, the_plan, samples, method, percentile, activation_dtype, calibrate_on)
    new_func, new_values, scales = insert_qdq(func, the_plan, qparams, params, per_channel)
    out_mod = mod.clone()
    out_mod["main"] = new_func
    gone = replaced_weights(func, new_func)
    out_params = {k: v for k, v in params.items() if k not in gone} | new_values
    error = _measure(out_mod, out_params, samples, floats, calibrate_on)
    result = QuantizedModel(out_mod, out_params, error, _layer_report(the_plan.layers, qparams, the_plan.points, scales),
                            [k.name for k in kept], method, activation_dtype)
    if verbose:
        print(f"bh.quantize: {result.summary()}", file=sys.stdout)
    return result


def _calibrate(mod: tvm.IRModule, params: Mapping[str, np.ndarray], the_plan: Any, samples: list[list[np.ndarray]],
               method: str, percentile: float, activation_dtype: str, calibrate_on: str) -> tuple[dict, list]:
    """Run the calibration: one observer build returning every activation the plan quantizes, run on each
    sample. Returns (each observed var -> (scale, zero point, dtype), the float outputs of each sample)."""
    func = mod["main"]
    order = {p: -len(func.params) + i for i, p in enumerate(func.params)} | tensor_index(func)
    observed = sorted({v for v in the_plan.points.values()}, key=lambda v: order[v])
    vm = build_observer(mod, params, observed, calibrate_on)
    stats = Observations([v.name for v in observed], keep_samples=method != "minmax")
    floats = []
    for sample in samples:
        outputs, values = run_observer(vm, sample)
        stats.add(values)
        floats.append(outputs)
    qparams = {}
    for i, var in enumerate(observed):
        scale, zp = activation_qparams(*stats.range(i, method, percentile), activation_dtype)
        qparams[var] = (scale, zp, activation_dtype)
    return qparams, floats


def _measure(mod: tvm.IRModule, params: Mapping[str, np.ndarray], samples: list[list[np.ndarray]],
             floats: list[list[np.ndarray]], on: str) -> float:
    """Largest relative error of ``mod`` against the float outputs over the calibration inputs."""
    from tvm import relax

    from ..stages import bind_params, partition
    from ..timing import build, relative_error

    bound = bind_params(mod, params) if on == "llvm" else partition(mod, params)
    vm = relax.VirtualMachine(build(bound), tvm.cpu())
    worst = 0.0
    for sample, want in zip(samples, floats):
        result = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(x)) for x in sample])
        got = [result.numpy()] if hasattr(result, "numpy") else _flat(result)
        for g, w in zip(got, want):
            worst = max(worst, relative_error(g, w))
    return worst


def _flat(value: Any) -> list[np.ndarray]:
    return [value.numpy()] if hasattr(value, "numpy") else [a for item in value for a in _flat(item)]
