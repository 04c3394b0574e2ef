"""image.resize2d (NCHW) on oneDNN's resampling primitive: a ``resize`` node.

oneDNN computes one coordinate mapping, ONNX's ``half_pixel`` (x = (o + 0.5) * I / O - 0.5, clamped
at the edges); linear interpolates between the two neighbours, nearest takes ``round(x)`` with halves
away from zero. A Relax resize2d runs here only where its attributes compute exactly that:

* ``linear``: ``half_pixel``, or ``pytorch_half_pixel`` (torch's ``align_corners=False``; the same
  mapping unless an output dim is 1, where torch takes 0: left to llvm then). DeepLabV3's upsampling
  of its logits and of its image-pooling branch.
* ``nearest_neighbor``: ``half_pixel`` with ``round_prefer_ceil`` (oneDNN's own); ``half_pixel`` with
  any round-to-nearest (TVM's torch frontend writes torch's ``nearest`` as ``half_pixel`` + ``round``)
  and ``asymmetric`` with ``floor`` (the ONNX exporter's torch ``nearest``) where every output dim is a
  whole multiple of the input's: then o = q*k + r (0 <= r < k) maps to q + (r + 0.5) / k - 0.5, strictly
  within (q - 0.5, q + 0.5), so no rounding rule can differ and floor(o / k) = q as well.

A resize to the input's own size is the identity under each of these mappings: lowered as a view.

Everything else — ``align_corners`` (oneDNN has no such mapping), ``asymmetric`` linear,
``tf_half_pixel_for_nn``, other rounding modes, ``cubic``, layouts other than NCHW, non-float32 —
stays on llvm with its reason.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import static_shape
from ....rules import Match
from ..precision import tensor_reason
from ..table import PatternSpec, lowers, pattern_rules


#: on a whole-multiple upscale no half_pixel coordinate is a tie (x = q + (r + 0.5) / k - 0.5), so every
#: round-to-nearest rule picks what oneDNN picks
_ROUNDINGS = ("round", "round_prefer_floor", "round_prefer_ceil", "")


def resize_reason(call: relax.Call) -> str | None:
    """Why oneDNN's resampling would not compute this resize2d exactly; None when it does."""
    reason = tensor_reason(call.args[0], "data") or tensor_reason(call, "result")
    if reason:
        return reason
    a = call.attrs
    if str(a.layout) != "NCHW":
        return f"resize2d layout {a.layout}; the runtime resizes NCHW"
    if str(a.out_dtype) not in ("", "float32", "void", "None"):
        return f"resize2d out_dtype {a.out_dtype}; the runtime writes float32"
    method, mode, rounding = str(a.method), str(a.coordinate_transformation_mode), str(a.rounding_method)
    src, dst = static_shape(call.args[0]), static_shape(call)
    if method == "linear":
        if mode == "half_pixel" or (mode == "pytorch_half_pixel" and min(dst[2:]) > 1):
            return None
        return (f"linear resize2d with coordinate mode {mode} (output {list(dst[2:])}); oneDNN's resampling maps "
                "coordinates as half_pixel only (align_corners and asymmetric stay on llvm)")
    if method == "nearest_neighbor":
        whole = all(o % i == 0 for o, i in zip(dst[2:], src[2:]))
        if mode == "half_pixel" and (rounding == "round_prefer_ceil" or (whole and rounding in _ROUNDINGS)):
            return None
        if mode == "asymmetric" and rounding in ("floor", "") and whole:
            return None
        return (f"nearest resize2d with coordinate mode {mode}, rounding {rounding or 'default'}, {list(src[2:])} -> "
                f"{list(dst[2:])}; oneDNN's nearest is half_pixel with round-half-up, equal to asymmetric floor only "
                "for whole-multiple upscales")
    return f"resize2d method {method}; oneDNN's resampling has nearest and linear"


def check_resize(match: Match) -> str | None:
    """resize2d of a float32 NCHW tensor with static shapes that oneDNN's resampling computes exactly."""
    return resize_reason(match.expr("root"))


@lowers("relax.image.resize2d", check=check_resize)
def lower_resize(ctx, var: relax.Var, call: relax.Call) -> int:
    """A ``resize`` node; a resize to the input's own size (SegFormer's decode head brings its
    first map to the size it has) a ``reshape`` node to the same shape: a view, no copy. Every
    mapping accepted here (:func:`resize_reason`) takes an output coordinate o of an unscaled axis
    to o exactly (half_pixel: (o + 0.5) * 1 - 0.5), so both algorithms read the input element there."""
    if static_shape(call.args[0]) == static_shape(call):
        return ctx.emit("reshape", [ctx.data_of(call.args[0])], var, {})
    algorithm = "linear" if str(call.attrs.method) == "linear" else "nearest"
    return ctx.emit("resize", [ctx.data_of(call.args[0])], var, {"algorithm": algorithm})


@pattern_rules
def _rules():
    data = wildcard()
    call = is_op("relax.image.resize2d")(data, wildcard(), varg_default_wildcard=True)
    yield PatternSpec("resize2d", call, {"data": data, "root": call}, check_resize, priority=15)
