"""Pooling of NCHW data: max_pool2d, avg_pool2d, adaptive_avg_pool2d (even windows), and a mean over
the spatial axes (global average pooling); the same of NCDHW data (max_pool3d, avg_pool3d,
adaptive_avg_pool3d, a mean over D, H, W: video models). All become ``pool2d`` nodes (over rank-5
data every spatial attribute has three entries)."""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ...._relax import shape_of, static_shape
from ....rules import Match
from ..epilogue import tensors_reason
from ..table import PatternSpec, lowers, pattern_rules


def _single(op: str) -> tuple[DFPattern, dict[str, DFPattern]]:
    data = wildcard()
    call = is_op(op)(data)
    return call, {"data": data, "root": call}


#: the data layout the runtime pools, per op
_LAYOUTS = {"relax.nn.max_pool2d": "NCHW", "relax.nn.avg_pool2d": "NCHW", "relax.nn.adaptive_avg_pool2d": "NCHW",
            "relax.nn.max_pool3d": "NCDHW", "relax.nn.avg_pool3d": "NCDHW", "relax.nn.adaptive_avg_pool3d": "NCDHW"}


def _layout_reason(match: Match) -> str | None:
    """Float32 NCHW 4-D (NCDHW 5-D for the 3-D ops) data in and out, static channels."""
    reason = tensors_reason(match, ["data", "root"], symbolic=True)
    if reason:
        return reason
    call = match.expr("root")
    a, layout = call.attrs, _LAYOUTS[call.op.name]
    if str(a.layout) != layout or str(a.out_layout) not in (layout, ""):
        return f"pooling layout {a.layout}/{a.out_layout}; the runtime runs {layout}"
    if len(match.shape("data")) != len(layout):
        return f"pooling needs {len(layout)}-D data, got {list(match.shape('data'))}"
    if not isinstance(match.shape("data")[1], int):
        return f"pooling of data {list(match.shape('data'))} with symbolic channels"
    return None


def _window_reason(in_size: int, kernel: int, stride: int, pad_begin: int, pad_end: int, dilation: int,
                   ceil_mode: bool, count_include_pad: bool) -> str | None:
    """Mirror of the runtime's pool2d checks for one spatial axis (None = fine)."""
    extent = (kernel - 1) * dilation + 1
    span = in_size + pad_begin + pad_end - extent
    if span < 0:
        return "the pooling window is larger than the padded input"
    floor_out = span // stride + 1
    out = (span + stride - 1) // stride + 1 if ceil_mode else floor_out
    if ceil_mode and out != floor_out and count_include_pad:
        return "ceil_mode with count_include_pad changes the output size; not supported"
    eff_end = max(pad_end, (out - 1) * stride + extent - in_size - pad_begin)
    if pad_begin >= extent or eff_end >= extent:
        return "padding would put a whole pooling window in the padding"
    return None


def check_pool2d(match: Match) -> str | None:
    """max_pool2d / avg_pool2d on NCHW float32 data (max_pool3d / avg_pool3d on NCDHW)."""
    reason = _layout_reason(match)
    if reason:
        return reason
    call = match.expr("root")
    a = call.attrs
    shape = match.shape("data")
    include_pad = call.op.name.startswith("relax.nn.avg_pool") and bool(a.count_include_pad)
    pad = [int(p) for p in a.padding]
    spatial = len(shape) - 2
    for i in range(spatial):
        if not isinstance(shape[2 + i], int):
            # the runtime checks the window against each binding (InputError when it does not fit);
            # ceil_mode with count_include_pad may change the output size for some sizes only
            if bool(a.ceil_mode) and include_pad:
                return "ceil_mode with count_include_pad over a symbolic spatial dim; not supported"
            continue
        reason = _window_reason(shape[2 + i], int(a.pool_size[i]), int(a.strides[i]), pad[i], pad[i + spatial],
                                int(a.dilation[i]), bool(a.ceil_mode), include_pad)
        if reason:
            return reason
    return None


def check_adaptive_avg_pool2d(match: Match) -> str | None:
    """Adaptive average pooling whose windows divide the input evenly."""
    reason = _layout_reason(match)
    if reason:
        return reason
    shape, out = match.shape("data"), match.shape("root")
    if not all(isinstance(d, int) for d in shape[2:] + out[2:]):
        return f"adaptive pooling {list(shape[2:])} -> {list(out[2:])} with symbolic spatial dims"
    if any(i % o for i, o in zip(shape[2:], out[2:])):
        return f"adaptive pooling {list(shape[2:])} -> {list(out[2:])} has uneven windows"
    return None


def spatial_mean_axes(call: relax.Call) -> str | None:
    """Why a mean is not a global average pooling over the spatial axes of 4-D or 5-D data
    (None = it is)."""
    shape = shape_of(call.args[0])
    if shape is None or len(shape) not in (4, 5):
        return "mean is offloaded only as global average pooling of 4-D NCHW or 5-D NCDHW data"
    if not all(isinstance(d, int) for d in shape[1:]):
        return f"mean of data {list(shape)}: global pooling needs static channels and spatial dims"
    axes = call.attrs.axis
    if axes is None:
        return "mean over all axes is not a spatial pooling"
    spatial = list(range(2, len(shape)))
    if sorted(int(x) % len(shape) for x in axes) != spatial:
        return f"mean over axes {[int(x) for x in axes]} is not over the spatial axes {spatial}"
    return None


def check_mean(match: Match) -> str | None:
    """A mean over the spatial axes of NCHW / NCDHW data (global average pooling)."""
    return tensors_reason(match, ["data", "root"], symbolic=True) or spatial_mean_axes(match.expr("root"))


@pattern_rules
def _rules():
    for op, name, check in (
        ("relax.nn.max_pool2d", "max_pool2d", check_pool2d),
        ("relax.nn.avg_pool2d", "avg_pool2d", check_pool2d),
        ("relax.nn.adaptive_avg_pool2d", "adaptive_avg_pool2d", check_adaptive_avg_pool2d),
        ("relax.nn.max_pool3d", "max_pool3d", check_pool2d),
        ("relax.nn.avg_pool3d", "avg_pool3d", check_pool2d),
        ("relax.nn.adaptive_avg_pool3d", "adaptive_avg_pool3d", check_adaptive_avg_pool2d),
        ("relax.mean", "global_avg_pool", check_mean),
    ):
        pattern, names = _single(op)
        yield PatternSpec(name, pattern, names, check, priority=50)


@lowers("relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.max_pool3d", "relax.nn.avg_pool3d",
        check=check_pool2d)
def lower_pool2d(ctx, var: relax.Var, call: relax.Call) -> int:
    """A ``pool2d`` node (over rank-5 data for the 3-D ops: padding ``[front, top, left, back,
    bottom, right]``, Relax's order)."""
    a = call.attrs
    algorithm = "max"
    if call.op.name.startswith("relax.nn.avg_pool"):
        algorithm = "avg_include_padding" if bool(a.count_include_pad) else "avg_exclude_padding"
    attrs = {
        "algorithm": algorithm,
        "kernel": [int(k) for k in a.pool_size],
        "strides": [int(k) for k in a.strides],
        "padding": [int(k) for k in a.padding],
        "dilation": [int(k) for k in a.dilation],
        "ceil_mode": int(bool(a.ceil_mode)),
    }
    return ctx.emit("pool2d", [ctx.data_of(call.args[0])], var, attrs)


@lowers("relax.nn.adaptive_avg_pool2d", "relax.nn.adaptive_avg_pool3d", check=check_adaptive_avg_pool2d)
def lower_adaptive_avg_pool2d(ctx, var: relax.Var, call: relax.Call) -> int:
    """Even windows: a ``pool2d`` average whose kernel and strides are the input over the output."""
    window = [i // o for i, o in zip(static_shape(call.args[0])[2:], static_shape(var)[2:])]
    attrs = {"algorithm": "avg_exclude_padding", "kernel": window, "strides": window}
    return ctx.emit("pool2d", [ctx.data_of(call.args[0])], var, attrs)


def lower_mean(ctx, var: relax.Var, call: relax.Call) -> int:
    """A spatial mean as global average pooling (``relax.mean``'s lowering, :mod:`.reduce`,
    calls it for the means :func:`spatial_mean_axes` accepts)."""
    reason = spatial_mean_axes(call)
    if reason:
        raise ctx.fail(reason)
    n, c, *spatial = shape_of(call.args[0])
    attrs = {"algorithm": "avg_exclude_padding", "kernel": list(spatial), "strides": [1] * len(spatial)}
    if bool(call.attrs.keepdims):
        return ctx.emit("pool2d", [ctx.data_of(call.args[0])], var, attrs)
    pooled = ctx.emit("pool2d", [ctx.data_of(call.args[0])], None, attrs, shape=[n, c] + [1] * len(spatial))
    return ctx.emit("reshape", [pooled], var, {})
