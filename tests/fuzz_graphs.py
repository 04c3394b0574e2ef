"""Random Relax graphs for differential fuzzing (offloaded build vs llvm-only build).

A graph is a short chain-with-branches over float32 values of rank 1..5 (NCHW feature maps,
matrices, [batch, sequence, hidden] tensors, ...), drawn from every op the rules know, with random
shapes and attributes:

* CNN ops: conv2d and conv3d (strides, padding, dilation, groups, bias, relu, a batch norm folded into it;
  sometimes after an explicit nn.pad, zero or not), Inception/DenseNet-like branches of fresh convs
  concatenated on channels (the planner lets them write into the concat's buffer), 2-D and 3-D pooling, batch_norm on its own (+relu),
  group_norm, activations (also hardswish / hardsigmoid / silu spelled out as the frontends write them);
* matmuls: dense (plain and transposed weight, bias, relu), batched matmul with broadcast batch
  dims and permuted operands, attention blocks (head split by reshape + permute_dims, Q·Kᵀ, scale,
  additive mask, softmax, ·V);
* elementwise: add / subtract / multiply / divide / maximum / minimum broadcasting on either side,
  ``x * r`` by a broadcast factor (a mean of ``x`` or a weight) then multiplies / adds of broadcast
  weights and adds of ``x`` (GRN's tail; one binary with a shift and an addend post-op),
  unary functions (sqrt, rsqrt, exp, log, erf, abs, negative, power by a constant, clip with finite
  or infinite bounds, gelu, silu, ...);
* normalizations and reductions: layer_norm over trailing axes (also decomposed as exporters write
  it), softmax on any axis, mean / sum / max / min over random axes with or without keepdims, sums
  of squares (``square`` or ``x * x``, a ``sqrt`` after it: an L2 norm's ``sum_square``);
* layout: permute_dims, reshape / expand_dims / squeeze, concat on any axis, split, strided_slice,
  constant pads of any axes (only when asked for: ``PAD_KINDS``);
* masks and gathers: take with int64 / int32 indices (constants or inputs), comparisons, where,
  astype between the dtypes the runtime casts.

Some draws are deliberately outside what the runtime runs (non-unit slice steps, a power by 1.5,
layer_norm without center, float16 casts, ...): those ops must stay on llvm, and the result must
still match. ``KINDS`` names every kind of step; ``graphs(kinds=...)`` restricts a draw to some of
them (the kernel-coverage test draws each kind on its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import tvm
from hypothesis import strategies as st
from tvm import relax

from byoc_hetero.quant.weight_only import emit_weight_only_dense, emit_weight_only_take, quantize_matrix

R = relax.op
F32 = "float32"

#: Upper bound on the elements of any drawn value (keeps each example to milliseconds).
MAX_ELEMENTS = 4096

#: Every kind of step the generator draws (the first group only on NCHW maps, ``wide`` uses those).
CNN_KINDS = ("conv", "pool", "act", "add", "concat", "branches", "dense_block", "flatten", "dense", "act2d")
KINDS = CNN_KINDS + (
    "batch_norm", "group_norm", "layer_norm", "layer_norm_decomposed", "softmax", "reduce",
    "unary", "binary", "permute", "matmul", "attention", "reshape", "slice", "split", "concat_any",
    "take", "compare_where", "mask", "cast", "repeat", "conv1d", "resize", "rope", "conv3d", "pool3d",
    "affine",
)
#: Kinds drawn only when asked for (``graphs(kinds=...)``): their results match the llvm build within
#: one quantization step, not within the float tolerance (tests/test_fuzz.py compares them so).
INT8_KINDS = ("int8", "int8_chain", "int8_dynamic")
INT8_TAILS = ("chain", "none", "sigmoid", "hardswish", "silu", "gate", "add", "softmax", "table", "attention")
"""What may follow a fuzzed int8 anchor (fuzz_graphs int8_tail)."""
KINDS = KINDS + INT8_KINDS
#: Kinds drawn only when asked for: a dense / a lookup on weight-only int8 / int4 codes (quant/weight_only.py),
#: which the float steps' default mix leaves out so that their derandomized draws stay as they were.
WEIGHT_ONLY_KINDS = ("dense_wq", "take_wq")
KINDS = KINDS + WEIGHT_ONLY_KINDS
#: Kinds drawn only when asked for, for the same reason: a constant pad of any axes with any value
#: (the runtime's ``pad`` node; Swin-V2's window pad of ``[N, H, W, C]``).
PAD_KINDS = ("pad",)
KINDS = KINDS + PAD_KINDS


#: Kinds whose every op treats NaN and ±inf alike on llvm, in the runtime and in torch (arithmetic:
#: a NaN or inf operand gives the IEEE result). The ordering ops are left out: relu, clip, maximum /
#: minimum, max / min reductions and max pooling are a select on ``a > b`` in TVM's llvm lowering, so
#: a NaN's fate there depends on its position (torch propagates it; oneDNN's clip and max pool pick
#: differently again), see docs/reliability.md. ``graphs(special=True)`` draws from these only.
SPECIAL_KINDS = (
    "softmax", "layer_norm", "layer_norm_decomposed", "group_norm", "permute", "matmul", "attention",
    "reshape", "slice", "split", "concat_any", "take", "mask", "rope",
)


def sprinkle_special_values(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """``x`` with one to three elements set to NaN, +inf or -inf (each drawn), at random positions."""
    x = x.copy()
    flat = x.reshape(-1)
    for _ in range(int(rng.integers(1, 4))):
        flat[rng.integers(0, flat.size)] = rng.choice([np.nan, np.inf, -np.inf])
    return x


@dataclass
class Recipe:
    """What a drawn graph is made of (printed by hypothesis when a case fails)."""

    steps: list[str] = field(default_factory=list)
    #: the largest output scale of an int8 step: one quantization step of its result
    quant_step: float = 0.0

    def __repr__(self) -> str:
        return "Recipe(" + "; ".join(self.steps) + ")"


def _shape(v) -> tuple[int, ...]:
    return tuple(int(d) for d in v.ty.shape.values)


def _const(rng: np.random.Generator, shape, scale=0.5):
    return relax.const((rng.standard_normal(shape) * scale).astype(F32))


def _scalar(value: float):
    return relax.const(np.array(value, F32))


def _relu6(bb, v, split: bool):
    if split:  # TVM's PyTorch frontend: clip(0, inf) then clip(-inf, 6)
        return bb.emit(R.clip(bb.emit(R.clip(v, 0, float("inf"))), float("-inf"), 6))
    return bb.emit(R.clip(v, 0, 6))


def activation_chain(bb, name: str, src):
    """hardswish / hardsigmoid / silu as TVM's frontends spell them (ops/hardswish.py)."""
    if name == "silu_chain":
        return bb.emit(R.multiply(src, bb.emit(R.sigmoid(src))))
    if name == "hardsigmoid_onnx":
        return bb.emit(R.clip(bb.emit(R.add(bb.emit(R.multiply(_scalar(1 / 6), src)), _scalar(0.5))), 0, 1))
    r6 = _relu6(bb, bb.emit(R.add(src, _scalar(3.0))), split=name.endswith("torch"))
    if name == "hardsigmoid_torch":
        return bb.emit(R.divide(r6, _scalar(6.0)))
    if name == "hardswish_torch":
        return bb.emit(R.divide(bb.emit(R.multiply(src, r6)), _scalar(6.0)))
    return bb.emit(R.multiply(src, bb.emit(R.divide(r6, _scalar(6.0)))))  # hardswish_onnx


def safe_softmax_chain(emit, x, axis: int, scalar_zero: bool = False):
    """torch's ``_safe_softmax(x, axis)`` as torch.export's decomposition reaches Relax: softmax,
    with the rows along ``axis`` whose inputs are all -inf set to 0 (ops/softmax.py)."""
    out = emit(R.nn.softmax(x, axis=axis))
    kept = emit(R.logical_not(emit(R.equal(x, relax.const(np.float32(-np.inf))))))
    any_kept = emit(R.max(emit(R.astype(kept, "int8")), axis=[axis], keepdims=True))
    rows = emit(R.logical_not(emit(R.astype(any_kept, "bool"))))
    zero = relax.const(np.float32(0.0))
    zeros = zero if scalar_zero else emit(R.full_like(out, zero))
    return emit(R.where(rows, zeros, out))


def minus_inf_mask(rng: np.random.Generator, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """0 / -inf of ``shape``: about a third of the rows along ``axis`` all -inf, a fifth of the
    other elements -inf (a partly masked row, as a padding or causal mask makes)."""
    row_shape = tuple(1 if i == axis % len(shape) else d for i, d in enumerate(shape))
    masked = (rng.random(shape) < 0.2) | (rng.random(row_shape) < 0.3)
    return np.where(masked, -np.inf, 0.0).astype(F32)


CHAINS = ("hardswish_torch", "hardswish_onnx", "hardsigmoid_torch", "hardsigmoid_onnx", "silu_chain")


def _broadcast_shape(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape``: some dims 1, maybe fewer leading dims."""
    drop = draw(st.integers(0, len(shape)))
    kept = shape[drop:]
    return tuple(1 if draw(st.booleans()) else d for d in kept)


@st.composite
def graphs(draw, max_ops: int = 6, wide: bool = False, kinds: tuple[str, ...] | None = None,
           special: bool = False, int8_weight_bound: int = 127):
    """Draw ``(mod, inputs, recipe)``: a Relax module with static shapes and numpy inputs.

    ``special``: the input ``x`` holds NaN / ±inf at a few places (:func:`sprinkle_special_values`);
    pass ``kinds`` from :data:`SPECIAL_KINDS` with it. ``int8_weight_bound``: the int8 anchors'
    weights are drawn in ``[-bound, bound]`` (64: no pair of u8 x s8 products exceeds 16 bits, the
    sums oneDNN's int8 kernels make below VNNI).

    ``wide``: channel counts of 16 and 32 (the runtime's Winograd convolution needs multiples of
    16) and only the CNN steps. ``kinds``: draw only these kinds of steps (each must be in
    :data:`KINDS`); the first step is the first of them that applies.
    """
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    recipe = Recipe([f"seed={seed}"])
    n = draw(st.integers(1, 2))
    # 8 and 16 channels: convolutions write channel-blocked layouts the later steps must read
    c = draw(st.sampled_from([16, 32])) if wide else draw(st.sampled_from([1, 2, 3, 4, 5, 6, 8, 16]))
    h = draw(st.integers(3, 9))
    w = draw(st.integers(3, 9))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, h, w), F32))
    params: list[relax.Var] = []
    values: list[np.ndarray] = []
    recipe.steps.append(f"x{[n, c, h, w]}")

    def param(shape, dtype=F32, data=None):
        var = relax.Var(f"p{len(params)}", relax.TensorType(shape, dtype))
        params.append(var)
        values.append(data if data is not None else (rng.standard_normal(shape) * 0.5).astype(dtype))
        return var

    def weight(shape, data=None):
        """A weight: usually a constant, sometimes a runtime parameter of main."""
        data = data if data is not None else (rng.standard_normal(shape) * 0.5).astype(F32)
        if draw(st.booleans()) and draw(st.booleans()):
            return param(shape, F32, data.astype(F32))
        return relax.const(data.astype(F32))

    def positive(shape, lo=0.5, hi=1.5):
        return weight(shape, rng.uniform(lo, hi, shape).astype(F32))

    vals: list[relax.Var] = [x]  # every float32 value of the graph so far
    used: set = set()  # values some step read (the rest are the graph's outputs)

    def emit(expr, *reads):
        for r in reads:
            used.add(r)
        return bb.emit(expr)

    def keep(v):
        if math.prod(_shape(v)) <= MAX_ELEMENTS and 1 <= len(_shape(v)) <= 5:
            vals.append(v)
        return v

    def pick(pred=lambda s: True):
        fits = [v for v in vals if pred(_shape(v))]
        return draw(st.sampled_from(fits)) if fits else None

    def maps():
        return [v for v in vals if len(_shape(v)) == 4]

    def mats():
        return [v for v in vals if len(_shape(v)) == 2]

    def folded_batch_norm(y, channels: int):
        """An inference batch norm of a conv's output (the rules fold it into the conv: bn_fold_* steps)."""
        return bb.emit(relax.TupleGetItem(bb.emit(R.nn.batch_norm(
            y, weight((channels,)), weight((channels,)), weight((channels,)), positive((channels,)), axis=1,
            epsilon=1e-5, training=False)), 0))

    def volume():
        """A 5-D value: one the graph has, else a 4-D map (x at least) read as one depth or one channel."""
        src = pick(lambda s: len(s) == 5)
        if src is not None and draw(st.booleans()):
            return src
        src = draw(st.sampled_from(maps()))
        n_, c_, h_, w_ = _shape(src)
        shape = (n_, c_, 1, h_, w_) if draw(st.booleans()) else (n_, 1, c_, h_, w_)
        return emit(R.reshape(src, shape), src)

    def step(kind: str) -> bool:  # noqa: C901, PLR0911, PLR0912, PLR0915 (one branch per kind)
        """Emit one step of ``kind``; False when no value fits it."""
        if kind == "conv":
            if not maps():
                return False
            src = draw(st.sampled_from(maps()))
            n_, c_, h_, w_ = _shape(src)
            # wide graphs lean towards 3x3 stride-1 dense convs (the Winograd kind)
            k = draw(st.sampled_from([3, 3, 3, 1] if wide else [1, 3]))
            dil = draw(st.sampled_from([1, 1, 1, 2] if wide else [1, 2])) if k == 3 and min(h_, w_) >= 5 else 1
            span = dil * (k - 1) + 1
            pads = [draw(st.integers(0, k - 1)) for _ in range(4)]
            if h_ + pads[0] + pads[2] < span or w_ + pads[1] + pads[3] < span:
                pads = [k // 2 * dil] * 4
            # an explicit pad (EfficientNet's ZeroPad2d): zero folds into the conv's padding, a
            # non-zero value is a pad node
            pre_pad = draw(st.sampled_from(["none", "none", "zero", "one"])) if not wide else "none"
            if pre_pad != "none":
                extra = [draw(st.integers(0, 2)) for _ in range(4)]
                used.add(src)
                src = bb.emit(R.nn.pad(src, [0, 0, 0, 0, extra[0], extra[2], extra[1], extra[3]],
                                       "constant", 0.0 if pre_pad == "zero" else 1.0))
                recipe.steps.append(f"pad({pre_pad}, {extra})")
            stride = draw(st.sampled_from([1, 1, 2]))
            groups = draw(st.sampled_from(([1, 1, 1] if wide else []) + [g for g in (1, 2, c_) if c_ % g == 0]))
            out_c = groups * draw(st.integers(1, 3))
            if wide and groups == 1:
                out_c = draw(st.sampled_from([16, 32]))
            elif groups == 1:
                out_c = draw(st.sampled_from([1, 2, 3, 8, 16]))
            y = emit(R.nn.conv2d(src, weight((out_c, c_ // groups, k, k)), strides=stride,
                                 padding=pads, dilation=dil, groups=groups), src)
            bias = draw(st.sampled_from(["none", "reshaped", "4d"]))
            if bias == "reshaped":
                y = bb.emit(R.add(y, R.reshape(weight((out_c,)), (1, out_c, 1, 1))))
            elif bias == "4d":
                y = bb.emit(R.add(y, _const(rng, (1, out_c, 1, 1))))
            bn = not wide and draw(st.sampled_from([True, False, False, False]))
            if bn:  # folded into the conv's weight and bias (bn_fold_* steps)
                y = folded_batch_norm(y, out_c)
            relu = draw(st.booleans())
            if relu:
                y = bb.emit(R.nn.relu(y))
            recipe.steps.append(f"conv(k={k}, s={stride}, pad={pads}, d={dil}, g={groups}, "
                                f"o={out_c}, bias={bias}, bn={bn}, relu={relu})")
            keep(y)
        elif kind == "pool":
            src = pick(lambda s: len(s) == 4 and min(s[2:]) >= 2)
            if src is None:
                return False
            pool = draw(st.sampled_from(["max", "avg", "global"]))
            if pool == "max":
                y = emit(R.nn.max_pool2d(src, pool_size=2, strides=2), src)
            elif pool == "avg":
                y = emit(R.nn.avg_pool2d(src, pool_size=2, strides=1), src)
            else:
                y = emit(R.nn.adaptive_avg_pool2d(src, output_size=1), src)
            recipe.steps.append(f"{pool}_pool")
            keep(y)
        elif kind in ("act", "act2d"):
            src = pick((lambda s: len(s) == 4) if kind == "act" else (lambda s: len(s) == 2))
            if src is None:
                return False
            act = draw(st.sampled_from(["relu", "sigmoid", "tanh", *CHAINS]))
            if act in CHAINS:
                used.add(src)
                y = activation_chain(bb, act, src)
            else:
                y = emit({"relu": R.nn.relu, "sigmoid": R.sigmoid, "tanh": R.tanh}[act](src), src)
            recipe.steps.append(act)
            keep(y)
        elif kind == "add":
            if not maps():
                return False
            a = draw(st.sampled_from(maps()))
            b = draw(st.sampled_from([m for m in maps() if _shape(m) == _shape(a)]))
            y = emit(R.add(a, b), a, b)
            recipe.steps.append("add")
            keep(y)
        elif kind == "concat":
            if not maps():
                return False
            a = draw(st.sampled_from(maps()))
            fits = [m for m in maps() if _shape(m)[0] == _shape(a)[0] and _shape(m)[2:] == _shape(a)[2:]]
            b = draw(st.sampled_from(fits))
            y = emit(R.concat([a, b], axis=1), a, b)
            recipe.steps.append("concat")
            keep(y)
        elif kind == "branches":
            # Inception / DenseNet: fresh convs read only by one channel concat, which their
            # producers may write in place (batch 1, whole channel blocks), next to an existing
            # map that is read elsewhere too (copied)
            if not maps():
                return False
            src = draw(st.sampled_from(maps()))
            c_ = _shape(src)[1]
            outs = [draw(st.sampled_from([16, 32, 16, 8] if wide else [16, 16, 8, 3]))
                    for _ in range(draw(st.integers(1, 3)))]
            parts = []
            for out_c in outs:
                k = draw(st.sampled_from([1, 3]))
                y = emit(R.nn.conv2d(src, weight((out_c, c_, k, k)), padding=[k // 2] * 4), src)
                if draw(st.booleans()):
                    y = bb.emit(R.nn.relu(y))
                parts.append(y)
            source_too = draw(st.booleans()) or len(parts) == 1
            if source_too:  # the source itself, read by the convs too: copied
                parts.insert(draw(st.integers(0, len(parts))), src)
            y = emit(R.concat(parts, axis=1), *parts)
            recipe.steps.append(f"branches(convs={outs}, source_too={source_too})")
            keep(y)
        elif kind == "dense_block":
            # DenseNet: layer k concatenates the source and every earlier feature (the concats
            # share one buffer, channel-blocked when every part is whole blocks), batch norm (+relu)
            # reads it (blocked -> nhwc host pass) and a conv makes the next feature
            if not maps():
                return False
            src = draw(st.sampled_from(maps()))
            growth = draw(st.sampled_from([16, 8, 16, 3] if wide else [8, 16, 3]))
            feats, relus = [src], []
            for _ in range(draw(st.integers(1, 3))):
                joined = emit(R.concat(feats, axis=1), *feats)
                c_ = _shape(joined)[1]
                bn = emit(R.nn.batch_norm(joined, weight((c_,)), weight((c_,)), weight((c_,)), positive((c_,)),
                                          axis=1, epsilon=1e-5, training=False), joined)
                h = bb.emit(relax.TupleGetItem(bn, 0))
                relus.append(draw(st.booleans()))
                if relus[-1]:
                    h = bb.emit(R.nn.relu(h))
                k = draw(st.sampled_from([1, 3]))
                feats.append(emit(R.nn.conv2d(h, weight((growth, c_, k, k)), padding=[k // 2] * 4), h))
            y = emit(R.concat(feats, axis=1), *feats)
            recipe.steps.append(f"dense_block({list(_shape(src))}, growth={growth}, relu={relus})")
            keep(y)
        elif kind == "flatten":
            if not maps():
                return False
            src = draw(st.sampled_from(maps()))
            s = _shape(src)
            y = emit(R.reshape(src, (s[0], int(np.prod(s[1:])))), src)
            recipe.steps.append("flatten")
            keep(y)
        elif kind == "dense":
            if not mats():
                return False
            src = draw(st.sampled_from(mats()))
            k_dim = _shape(src)[1]
            out = draw(st.integers(1, 12))
            transposed = draw(st.booleans())
            if transposed:
                y = emit(R.matmul(src, R.permute_dims(weight((out, k_dim)), [1, 0])), src)
            else:
                y = emit(R.matmul(src, weight((k_dim, out))), src)
            bias = draw(st.booleans())
            if bias:
                y = bb.emit(R.add(y, weight((out,))))
            relu = draw(st.booleans())
            if relu:
                y = bb.emit(R.nn.relu(y))
            recipe.steps.append(f"dense(out={out}, transposed={transposed}, bias={bias}, relu={relu})")
            keep(y)
        elif kind == "batch_norm":
            src = pick(lambda s: len(s) >= 2)
            if src is None:
                return False
            ch = _shape(src)[1]
            eps = draw(st.sampled_from([1e-5, 1e-3]))
            bn = emit(R.nn.batch_norm(src, weight((ch,)), weight((ch,)), weight((ch,)), positive((ch,)),
                                      axis=1, epsilon=eps, training=False), src)
            y = bb.emit(relax.TupleGetItem(bn, 0))
            relu = draw(st.booleans())
            if relu:
                y = bb.emit(R.nn.relu(y))
            recipe.steps.append(f"batch_norm({list(_shape(src))}, eps={eps}, relu={relu})")
            keep(y)
        elif kind == "group_norm":
            src = pick(lambda s: len(s) >= 2)
            if src is None:
                return False
            shape = _shape(src)
            rank = len(shape)
            groups = draw(st.sampled_from([g for g in range(1, shape[1] + 1) if shape[1] % g == 0]))
            # sometimes a layout the runtime does not take (channels last, other axes): stays on llvm
            odd = rank >= 3 and draw(st.integers(0, 5)) == 5
            channel_axis, axes = (rank - 1, list(range(1, rank - 1))) if odd else (1, list(range(2, rank)))
            if odd:
                groups = 1
            ch = shape[channel_axis]
            eps = draw(st.sampled_from([1e-5, 1e-2]))
            y = emit(R.nn.group_norm(src, weight((ch,)), weight((ch,)), num_groups=groups,
                                     channel_axis=channel_axis, axes=axes, epsilon=eps), src)
            recipe.steps.append(f"group_norm({list(shape)}, groups={groups}, channel_axis={channel_axis}, "
                                f"axes={axes}, eps={eps})")
            keep(y)
        elif kind == "layer_norm":
            src = pick()
            shape = _shape(src)
            rank = len(shape)
            count = draw(st.integers(1, rank))
            axes = list(range(rank - count, rank))
            if draw(st.booleans()):
                axes = [a - rank for a in axes]  # negative axes
            if rank >= 2 and draw(st.integers(0, 5)) == 5:
                axes = [0]  # not trailing: stays on llvm
            size = tuple(shape[a] for a in sorted(int(a) % rank for a in axes))
            affine = draw(st.sampled_from(["weights", "ones", "no_center"]))
            if affine == "weights":
                gamma, beta = weight(size), weight(size)
            else:
                gamma, beta = relax.const(np.ones(size, F32)), relax.const(np.zeros(size, F32))
            eps = draw(st.sampled_from([1e-5, 1e-3]))
            y = emit(R.nn.layer_norm(src, gamma, beta, axes=axes, epsilon=eps,
                                     center=affine != "no_center"), src)
            recipe.steps.append(f"layer_norm({list(shape)}, axes={axes}, affine={affine}, eps={eps})")
            keep(y)
        elif kind == "layer_norm_decomposed":
            src = pick()
            shape = _shape(src)
            rank = len(shape)
            count = draw(st.integers(1, rank))
            axes = list(range(rank - count, rank))
            mean = bb.emit(R.mean(src, axis=axes, keepdims=True))
            diff = bb.emit(R.subtract(src, mean))
            var = bb.emit(R.mean(bb.emit(R.power(diff, relax.const(np.float32(2.0)))), axis=axes, keepdims=True))
            used.add(src)
            y = bb.emit(R.divide(diff, bb.emit(R.sqrt(bb.emit(R.add(var, relax.const(np.float32(1e-5))))))))
            gamma, beta = draw(st.booleans()), draw(st.booleans())
            per = shape[rank - count:]
            if gamma:
                y = bb.emit(R.multiply(y, weight(per)))
            if beta:
                y = bb.emit(R.add(y, weight(per)))
            recipe.steps.append(f"layer_norm_decomposed({list(shape)}, axes={axes}, gamma={gamma}, beta={beta})")
            keep(y)
        elif kind == "softmax":
            src = pick()
            axis = draw(st.integers(-len(_shape(src)), len(_shape(src)) - 1))
            safe = draw(st.sampled_from(["no", "no", "full_like", "scalar", "isnan"]))
            if safe == "no":
                y = emit(R.nn.softmax(src, axis=axis), src)
            elif safe == "isnan":  # the default ONNX exporter's where(isnan(softmax), 0, softmax), rows masked
                masked = emit(R.add(src, relax.const(minus_inf_mask(rng, _shape(src), axis))), src)
                p = bb.emit(R.nn.softmax(masked, axis=axis))
                y = bb.emit(R.where(bb.emit(R.isnan(p)), relax.const(np.float32(0.0)), p))
            else:  # torch's _safe_softmax of src with rows and elements masked by -inf
                masked = emit(R.add(src, relax.const(minus_inf_mask(rng, _shape(src), axis))), src)
                y = safe_softmax_chain(bb.emit, masked, axis, scalar_zero=safe == "scalar")
            recipe.steps.append(f"softmax({list(_shape(src))}, axis={axis}, safe={safe})")
            keep(y)
        elif kind == "reduce":
            src = pick()
            shape = _shape(src)
            rank = len(shape)
            op = draw(st.sampled_from(["mean", "sum", "max", "min", "rms", "l2"]))
            if draw(st.integers(0, 4)) == 0:
                axes = None
            else:
                axes = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank)))
                axes = [a - rank if draw(st.booleans()) else a for a in axes]
            keepdims = draw(st.booleans())
            if op == "rms":  # RMSNorm's statistic, as from_torch (rsqrt) and the ONNX exporter (1 / sqrt) write it
                stat = draw(st.sampled_from(["mean", "rsqrt", "recip_sqrt"]))
                y = emit(R.mean(emit(R.power(src, relax.const(np.float32(2.0))), src), axis=axes, keepdims=keepdims))
                if stat != "mean":
                    y = emit(R.add(y, relax.const(np.float32(draw(st.sampled_from([1e-6, 1e-5, 0.1]))))))
                    y = emit(R.rsqrt(y)) if stat == "rsqrt" else emit(R.divide(relax.const(np.float32(1.0)), emit(R.sqrt(y))))
                recipe.steps.append(f"rms {stat}({list(shape)}, axis={axes}, keepdims={keepdims})")
                if stat != "mean" and keepdims and draw(st.booleans()):  # x * r: the reduce's normalize
                    y = emit(R.multiply(src, y))
                    recipe.steps[-1] += " * x"
            elif op == "l2":  # an L2 norm's sum of squares (GRN's vector_norm; ONNX ReduceL2's x * x)
                spelled = draw(st.sampled_from(["square", "mul"]))
                sq = emit(R.square(src) if spelled == "square" else R.multiply(src, src), src)
                y = bb.emit(R.sum(sq, axis=axes, keepdims=keepdims))
                root = draw(st.booleans())
                y = bb.emit(R.sqrt(y)) if root else y
                recipe.steps.append(f"sum of {spelled}({list(shape)}, axis={axes}, keepdims={keepdims}, sqrt={root})")
            else:
                y = emit(getattr(R, op)(src, axis=axes, keepdims=keepdims), src)
                recipe.steps.append(f"{op}({list(shape)}, axis={axes}, keepdims={keepdims})")
            if len(_shape(y)) == 0:  # a scalar: add it to a value so that it is used
                other = pick()
                y = emit(R.add(other, y), other)
            keep(y)
        elif kind == "unary":
            src = pick()
            fn = draw(st.sampled_from(["erf", "sqrt", "rsqrt", "exp", "log", "abs", "negative", "square",
                                       "pow2", "pow3", "pow0.5", "pow-0.5", "pow1.5", "gelu", "gelu_tanh",
                                       "silu", "sigmoid", "tanh", "relu", "clip", "clip_lo", "clip_hi",
                                       "hardswish"]))
            v = src
            if fn in ("sqrt", "rsqrt", "log", "pow0.5", "pow-0.5", "pow1.5"):
                # a positive argument: |x| + 0.5 (abs and add run in the runtime as well)
                v = bb.emit(R.add(bb.emit(R.abs(v)), relax.const(np.float32(0.5))))
            if fn == "exp":
                v = bb.emit(R.tanh(v)) if draw(st.booleans()) else v  # keep chains of exp finite
            simple = {"sqrt": R.sqrt, "rsqrt": R.rsqrt, "exp": R.exp, "log": R.log, "erf": R.erf,
                      "abs": R.abs, "negative": R.negative, "square": R.square, "gelu": R.nn.gelu,
                      "gelu_tanh": R.nn.gelu_tanh, "silu": R.nn.silu, "sigmoid": R.sigmoid, "tanh": R.tanh,
                      "relu": R.nn.relu}
            if fn in simple:
                y = bb.emit(simple[fn](v))
            elif fn.startswith("pow"):
                y = bb.emit(R.power(v, relax.const(np.float32(float(fn[3:])))))
            elif fn.startswith("clip"):
                lo, hi = sorted(rng.uniform(-1, 1, 2).round(2).tolist())
                lo = -math.inf if fn == "clip_lo" else lo
                hi = math.inf if fn == "clip_hi" else hi
                y = bb.emit(R.clip(v, lo, hi))
                fn = f"clip[{lo}, {hi}]"
            else:  # hardswish as exporters write it: x * clip(x + 3, 0, inf) -> clip(.., -inf, 6) / 6
                t = bb.emit(R.clip(bb.emit(R.add(v, relax.const(np.float32(3.0)))),
                                   0.0, math.inf))
                t = bb.emit(R.clip(t, -math.inf, 6.0))
                y = bb.emit(R.divide(bb.emit(R.multiply(v, t)), relax.const(np.float32(6.0))))
            used.add(src)
            recipe.steps.append(f"{fn}({list(_shape(src))})")
            keep(y)
        elif kind == "binary":
            a = pick()
            shape = _shape(a)
            op = draw(st.sampled_from(["add", "subtract", "multiply", "divide", "maximum", "minimum"]))
            form = draw(st.sampled_from(["same", "bcast_right", "bcast_left", "both"]))
            if form == "same":
                b = pick(lambda s: s == shape)
            elif form == "both":  # [.., 1, d] op [.., d', 1]: both sides broadcast
                if len(shape) < 2 or shape[-1] == 1 or shape[-2] == 1:
                    return False
                b_shape = shape[:-2] + (shape[-2], 1)
                a = emit(R.mean(a, axis=[-2], keepdims=True), a)
                b = weight(b_shape) if op != "divide" else positive(b_shape)
            else:
                b_shape = _broadcast_shape(draw, shape)
                b = positive(b_shape) if op == "divide" else weight(b_shape)
            if op == "divide" and form == "same":
                b = bb.emit(R.add(bb.emit(R.abs(b)), relax.const(np.float32(1.0))))
            lhs, rhs = (b, a) if form == "bcast_left" else (a, b)
            if op == "divide" and form == "bcast_left":  # divide by the value: keep it away from 0
                rhs = bb.emit(R.add(bb.emit(R.abs(rhs)), relax.const(np.float32(1.0))))
            y = emit(getattr(R, op)(lhs, rhs), a, b)
            act = draw(st.sampled_from(["none", "none", "relu", "tanh"]))
            if act != "none":
                y = bb.emit({"relu": R.nn.relu, "tanh": R.tanh}[act](y))
            recipe.steps.append(f"{op}({form}: {list(_shape(lhs))}, {list(_shape(rhs))}, act={act})")
            keep(y)
        elif kind == "affine":  # x * r, then * c / + b / + x: fuse_affine_tails's x * s + t
            src = pick()
            shape = _shape(src)
            drawn = _broadcast_shape(draw, shape)
            r_shape = (1,) * (len(shape) - len(drawn)) + drawn
            if math.prod(r_shape) >= math.prod(shape):
                return False
            if draw(st.booleans()):  # a statistic of x itself (GRN's Nx), else a weight
                axes = [i for i, (d, e) in enumerate(zip(shape, r_shape)) if d != e]
                r = emit(R.mean(src, axis=axes, keepdims=True), src)
            else:
                r = weight(r_shape)
            y = emit(R.multiply(src, r) if draw(st.booleans()) else R.multiply(r, src), src)
            steps = draw(st.lists(st.sampled_from(["mul", "add", "add", "add_x"]), min_size=1, max_size=3))
            for step in steps:
                if step == "add_x":
                    y = bb.emit(R.add(y, src) if draw(st.booleans()) else R.add(src, y))
                else:
                    c = weight(_broadcast_shape(draw, shape))
                    y = bb.emit(R.multiply(y, c) if step == "mul" else R.add(c, y))
            recipe.steps.append(f"affine({list(shape)} * {list(r_shape)}, {steps})")
            keep(y)
        elif kind == "permute":
            src = pick(lambda s: len(s) >= 2)
            if src is None:
                return False
            rank = len(_shape(src))
            axes = draw(st.permutations(list(range(rank))))
            if draw(st.integers(0, 5)) == 0:
                axes = None  # reverse every axis
            y = emit(R.permute_dims(src, axes), src)
            recipe.steps.append(f"permute_dims({list(_shape(src))}, {axes})")
            keep(y)
        elif kind == "matmul":
            a = pick(lambda s: len(s) >= 2)
            if a is None:
                return False
            shape = _shape(a)
            rank = len(shape)
            k_dim = shape[-1]
            form = draw(st.sampled_from(["weight", "batched_weight", "permuted_weight", "self_t", "permuted_a",
                                         "permuted_reshaped_a"]))
            nn = draw(st.integers(1, 6))
            if form.startswith("permuted_") and form != "permuted_weight" and rank >= 3:
                # a permuted value as the first operand (its last axis becomes the contraction), maybe
                # reshaped after the permute (the matmul reads such views through strides)
                axes = draw(st.permutations(list(range(rank))))
                a = emit(R.permute_dims(a, axes), a)
                shape = _shape(a)
                if form == "permuted_reshaped_a":
                    i = draw(st.integers(0, rank - 2))
                    shape = shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:]
                    if len(shape) < 2:
                        shape = (1,) + shape
                    a = bb.emit(R.reshape(a, shape))
                k_dim = shape[-1]
                rank = len(shape)
            if form in ("weight", "permuted_a", "permuted_reshaped_a"):
                b = weight((k_dim, nn))
            elif form == "batched_weight":
                batch = _broadcast_shape(draw, shape[:-2]) if rank > 2 else ()
                b = weight(batch + (k_dim, nn))
            elif form == "permuted_weight":
                batch = _broadcast_shape(draw, shape[:-2]) if rank > 2 else ()
                b_shape = batch + (k_dim, nn)
                axes = draw(st.permutations(list(range(len(b_shape)))))
                inverse = [axes.index(i) for i in range(len(b_shape))]
                stored = tuple(b_shape[i] for i in axes)  # permute_dims(stored, inverse) has b_shape
                b = bb.emit(R.permute_dims(weight(stored), inverse))
            else:  # a · aᵀ over the last two axes
                b = bb.emit(R.permute_dims(a, list(range(rank - 2)) + [rank - 1, rank - 2]))
            y = emit(R.matmul(a, b), a)
            if draw(st.booleans()):
                y = bb.emit(R.add(y, weight(_shape(y)[-1:])))
            recipe.steps.append(f"matmul({form}: {list(_shape(a))} x {list(_shape(b))})")
            keep(y)
        elif kind == "attention":
            heads = draw(st.sampled_from([1, 2, 3]))
            src = pick(lambda s: len(s) == 3 and s[-1] % heads == 0 and s[1] <= 16)
            if src is None:
                # tokens of a feature map, as ViT makes them: [N, C, H, W] -> [N, H*W, C]
                m = pick(lambda s: len(s) == 4 and s[2] * s[3] <= 16)
                if m is None:
                    return False
                nm, cm, hm, wm = _shape(m)
                src = emit(R.permute_dims(bb.emit(R.reshape(m, (nm, cm, hm * wm))), [0, 2, 1]), m)
                keep(src)
                heads = 1
            b_, s_, d_ = _shape(src)
            hd = draw(st.integers(1, 4))
            inner = heads * hd

            def project():
                p = bb.emit(R.matmul(src, weight((d_, inner))))
                return bb.emit(R.reshape(p, (b_, s_, heads, hd)))

            q, k, v = project(), project(), project()
            used.add(src)
            q = bb.emit(R.permute_dims(q, [0, 2, 1, 3]))
            kt = bb.emit(R.permute_dims(k, [0, 2, 3, 1]))
            v = bb.emit(R.permute_dims(v, [0, 2, 1, 3]))
            scores = bb.emit(R.matmul(q, kt))
            scale = draw(st.sampled_from(["multiply", "divide", "none"]))
            if scale == "multiply":
                scores = bb.emit(R.multiply(scores, relax.const(np.float32(1 / math.sqrt(hd)))))
            elif scale == "divide":
                scores = bb.emit(R.divide(scores, relax.const(np.float32(math.sqrt(hd)))))
            mask = draw(st.sampled_from(["none", "additive", "where"]))
            if mask == "additive":  # (1 - mask) * -1e4, mask [B, 1, 1, S]
                keep_ = rng.integers(0, 2, (b_, 1, 1, s_)).astype(F32)
                keep_[..., 0] = 1
                scores = bb.emit(R.add(scores, relax.const((1 - keep_) * np.float32(-1e4))))
            elif mask == "where":  # causal: where(tril, scores, -1e4)
                causal = np.tril(np.ones((s_, s_), bool))
                scores = bb.emit(R.where(relax.const(causal), scores, relax.const(np.float32(-1e4))))
            probs = bb.emit(R.nn.softmax(scores, axis=-1))
            ctx_ = bb.emit(R.matmul(probs, v))
            y = bb.emit(R.reshape(bb.emit(R.permute_dims(ctx_, [0, 2, 1, 3])), (b_, s_, inner)))
            recipe.steps.append(f"attention({[b_, s_, d_]}, heads={heads}, head_dim={hd}, scale={scale}, mask={mask})")
            keep(y)
        elif kind == "rope":  # transformers' x * cos + rotate_half(x) * sin, as from_torch / the ONNX exporter order it
            src = pick(lambda s: len(s) >= 2 and s[-1] % 2 == 0)
            if src is None:
                return False
            if len(_shape(src)) == 4 and draw(st.booleans()):  # the head permute before it
                src = emit(R.permute_dims(src, [0, 2, 1, 3]), src)
            shape = _shape(src)
            rank, d = len(shape), shape[-1]
            cs_shape = draw(st.sampled_from([shape, (1,) * (rank - 2) + shape[-2:], shape[-2:], (d,)]))
            angles = rng.standard_normal(cs_shape)
            cos, sin = weight(cs_shape, np.cos(angles)), weight(cs_shape, np.sin(angles))
            lo = emit(R.strided_slice(src, [rank - 1], [0], [d // 2]), src)
            hi = emit(R.strided_slice(src, [rank - 1], [d // 2], [d]), src)
            rot = bb.emit(R.concat([bb.emit(R.negative(hi)), lo], axis=-1))
            onnx = draw(st.booleans())
            a = bb.emit(R.multiply(cos, src) if onnx else R.multiply(src, cos))
            b = bb.emit(R.multiply(rot, sin))
            y = bb.emit(R.add(b, a) if onnx else R.add(a, b))
            recipe.steps.append(f"rope({list(shape)}, cos {list(cs_shape)}, {'onnx' if onnx else 'torch'} order)")
            keep(y)
        elif kind == "reshape":
            src = pick()
            shape = _shape(src)
            form = draw(st.sampled_from(["merge", "split", "expand_dims", "squeeze", "flat"]))
            if form == "merge" and len(shape) >= 2:
                i = draw(st.integers(0, len(shape) - 2))
                y = emit(R.reshape(src, shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:]), src)
            elif form == "split" and any(d % 2 == 0 for d in shape) and len(shape) < 5:
                i = draw(st.sampled_from([j for j, d in enumerate(shape) if d % 2 == 0]))
                y = emit(R.reshape(src, shape[:i] + (2, shape[i] // 2) + shape[i + 1:]), src)
            elif form == "squeeze" and 1 in shape and len(shape) > 1:
                y = emit(R.squeeze(src, axis=[shape.index(1)]), src)
            elif form == "flat":
                y = emit(R.reshape(src, (math.prod(shape),)), src)
            elif len(shape) < 5:
                y = emit(R.expand_dims(src, axis=draw(st.integers(0, len(shape)))), src)
            else:
                return False
            recipe.steps.append(f"{form}({list(shape)} -> {list(_shape(y))})")
            keep(y)
        elif kind == "repeat":  # a broadcast_to that repeats (GQA's repeat_kv): a unit or new leading dim x2, x3
            times = draw(st.integers(2, 3))
            src = pick(lambda s: len(s) < 5 and times * math.prod(s) <= MAX_ELEMENTS)
            if src is None:
                return False
            shape = _shape(src)
            # computed inside the region and read there (a relabel-priority op at a region's edge is left to llvm)
            z = emit(R.add(src, src), src)
            if 1 in shape and draw(st.booleans()):
                i = shape.index(1)
                y = bb.emit(R.broadcast_to(z, shape[:i] + (times,) + shape[i + 1:]))
            else:
                y = bb.emit(R.broadcast_to(z, (times,) + shape))
            y = bb.emit(R.add(y, y))
            recipe.steps.append(f"repeat({list(shape)} -> {list(_shape(y))})")
            keep(y)
        elif kind == "slice":
            src = pick()
            shape = _shape(src)
            rank = len(shape)
            axes = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank)))
            begin, end, strides = [], [], []
            for a in axes:
                d = shape[a]
                b = draw(st.integers(0, d - 1))
                e = draw(st.integers(b + 1, d))
                begin.append(b - d if draw(st.booleans()) else b)
                end.append(d + 3 if e == d and draw(st.booleans()) else e)  # past the end: clamped
                strides.append(1)
            if draw(st.integers(0, 3)) == 3:  # steps: 2 and 3 run strided (whole steps only), -1 stays on llvm
                strides[-1] = draw(st.sampled_from([2, 3, -1]))
                if strides[-1] == -1:
                    d = shape[axes[-1]]
                    begin[-1], end[-1] = d - 1, -d - 1
            with_strides = draw(st.booleans()) or any(s != 1 for s in strides)
            y = emit(R.strided_slice(src, axes, begin, end, strides if with_strides else None), src)
            recipe.steps.append(f"strided_slice({list(shape)}, axes={axes}, begin={begin}, end={end}, "
                                f"strides={strides if with_strides else None})")
            keep(y)
        elif kind == "split":
            src = pick(lambda s: max(s) >= 2)
            if src is None:
                return False
            shape = _shape(src)
            axis = draw(st.sampled_from([i for i, d in enumerate(shape) if d >= 2]))
            d = shape[axis]
            if draw(st.booleans()):
                sections = draw(st.sampled_from([s for s in range(2, d + 1) if d % s == 0]))
                parts = emit(R.split(src, sections, axis=axis), src)
                count, how = sections, sections
            else:
                how = sorted(draw(st.sets(st.integers(1, d - 1), min_size=1, max_size=min(3, d - 1))))
                parts = emit(R.split(src, how, axis=axis), src)
                count = len(how) + 1
            for i in range(count):
                keep(bb.emit(relax.TupleGetItem(parts, i)))
            recipe.steps.append(f"split({list(shape)}, {how}, axis={axis})")
        elif kind == "pad":  # any axes, any value, a side or both
            src = pick()
            shape = _shape(src)
            widths = [draw(st.sampled_from([0, 0, 1, 2])) for _ in range(2 * len(shape))]
            value = draw(st.sampled_from([0.0, 0.5, -2.0]))
            y = emit(R.nn.pad(src, widths, "constant", value), src)
            recipe.steps.append(f"pad({list(shape)}, {widths}, {value})")
            keep(y)
        elif kind == "concat_any":
            a = pick()
            shape = _shape(a)
            rank = len(shape)
            axis = draw(st.integers(-rank, rank - 1))
            ax = axis % rank
            inputs = [a]
            # up to 20 inputs: one variadic rule takes any count (DenseNet concatenates 33)
            for _ in range(draw(st.sampled_from([0, 1, 2, 2, 5, 19]))):
                fits = [v for v in vals if len(_shape(v)) == rank
                        and all(_shape(v)[i] == shape[i] for i in range(rank) if i != ax)]
                if draw(st.booleans()) and fits:
                    inputs.append(draw(st.sampled_from(fits)))
                else:
                    inputs.append(weight(shape[:ax] + (draw(st.integers(1, 3)),) + shape[ax + 1:]))
            inputs = draw(st.permutations(inputs))
            y = emit(R.concat(inputs, axis=axis), *[i for i in inputs if isinstance(i, relax.Var)])
            recipe.steps.append(f"concat({[list(_shape(i)) for i in inputs]}, axis={axis})")
            keep(y)
        elif kind == "conv1d":  # [N, C, W] data: the conv2d kernel with a unit height
            src = pick(lambda s: len(s) == 3 and s[2] >= 2)
            if src is None:  # read some value as one channel of a sequence
                flat = pick(lambda s: math.prod(s) >= 2)
                if flat is None:
                    return False
                src = emit(R.reshape(flat, (1, 1, math.prod(_shape(flat)))), flat)
            n_, c_, w_ = _shape(src)
            k = draw(st.sampled_from([1, 2, 3, 5]))
            stride, dil = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 1, 2]))
            pad = draw(st.integers(0, 2))
            if (k - 1) * dil + 1 > w_ + 2 * pad:
                return False
            groups = draw(st.sampled_from([g for g in (1, c_) if c_ % g == 0]))
            out_c = groups * draw(st.integers(1, 3))
            y = emit(R.nn.conv1d(src, weight((out_c, c_ // groups, k)), strides=stride, padding=pad,
                                 dilation=dil, groups=groups), src)
            bias = draw(st.booleans())
            if bias:
                y = bb.emit(R.add(y, R.reshape(weight((out_c,)), (1, out_c, 1))))
            act = draw(st.sampled_from(["none", "relu", "gelu"]))
            if act != "none":
                y = bb.emit(R.nn.relu(y) if act == "relu" else R.nn.gelu(y))
            recipe.steps.append(f"conv1d(k={k}, s={stride}, pad={pad}, d={dil}, g={groups}, o={out_c}, "
                                f"bias={bias}, act={act})")
            keep(y)
        elif kind == "conv3d":  # NCDHW data: the conv2d kernel over rank-5 tensors (video models)
            src = volume()
            n_, c_, *spatial = _shape(src)
            ks = [draw(st.sampled_from([1, 2, 3])) for _ in range(3)]
            stride = [draw(st.sampled_from([1, 1, 2])) for _ in range(3)]
            dil = [draw(st.sampled_from([1, 1, 2])) for _ in range(3)]
            pads = [draw(st.integers(0, k - 1)) for k in ks] * 2
            if any(d + 2 * p < dl * (k - 1) + 1 for d, p, dl, k in zip(spatial, pads, dil, ks)):
                return False
            groups = draw(st.sampled_from([g for g in (1, 1, c_) if c_ % g == 0]))
            out_c = groups * draw(st.integers(1, 3)) if groups > 1 else draw(st.sampled_from([1, 4, 8, 16]))
            y = emit(R.nn.conv3d(src, weight((out_c, c_ // groups, *ks)), strides=stride, padding=pads,
                                 dilation=dil, groups=groups), src)
            bias = draw(st.booleans())
            if bias:
                y = bb.emit(R.add(y, R.reshape(weight((out_c,)), (1, out_c, 1, 1, 1))))
            bn = draw(st.booleans())
            if bn:  # folded into the conv's weight and bias (bn_fold_* steps)
                y = folded_batch_norm(y, out_c)
            residual = draw(st.booleans()) and _shape(y) == _shape(src)
            if residual:  # R3D's basic block: the sum post-op
                y = bb.emit(R.add(y, src))
            relu = draw(st.booleans())
            if relu:
                y = bb.emit(R.nn.relu(y))
            recipe.steps.append(f"conv3d(k={ks}, s={stride}, pad={pads}, d={dil}, g={groups}, o={out_c}, "
                                f"bias={bias}, bn={bn}, residual={residual}, relu={relu})")
            keep(y)
        elif kind == "pool3d":  # NCDHW pooling: the pool2d kernel over rank-5 tensors
            src = volume()
            spatial = _shape(src)[2:]
            pool = draw(st.sampled_from(["max", "avg", "avg_pad", "adaptive", "mean"]))
            if pool in ("max", "avg", "avg_pad"):
                k = [draw(st.integers(1, min(3, d))) for d in spatial]
                stride = [draw(st.sampled_from([1, 2])) for _ in spatial]
                pads = [draw(st.integers(0, (kk - 1) // 2)) for kk in k] * 2
                if pool == "max":
                    y = emit(R.nn.max_pool3d(src, pool_size=k, strides=stride, padding=pads), src)
                else:
                    y = emit(R.nn.avg_pool3d(src, pool_size=k, strides=stride, padding=pads,
                                             count_include_pad=pool == "avg_pad"), src)
                pool = f"{pool}(k={k}, s={stride}, pad={pads})"
            elif pool == "adaptive":
                y = emit(R.nn.adaptive_avg_pool3d(src, output_size=1), src)
            else:  # global average pooling as torch's mean over D, H, W
                y = emit(R.mean(src, axis=[2, 3, 4], keepdims=draw(st.booleans())), src)
            recipe.steps.append(f"pool3d({pool})")
            keep(y)
        elif kind == "resize":  # NCHW resize2d: oneDNN's resampling where exact, else llvm with a reason
            src = pick(lambda s: len(s) == 4)
            if src is None:
                return False
            h, w = _shape(src)[2:]
            method, mode, rounding = draw(st.sampled_from([
                ("linear", "half_pixel", ""), ("linear", "pytorch_half_pixel", ""), ("linear", "align_corners", ""),
                ("nearest_neighbor", "half_pixel", "round_prefer_ceil"), ("nearest_neighbor", "asymmetric", "floor"),
            ]))
            if mode == "asymmetric":  # torch's nearest: exact on oneDNN for whole-multiple upscales only
                size = (h * draw(st.integers(1, 3)), w * draw(st.integers(1, 3))) if draw(st.booleans()) else \
                    (draw(st.integers(1, 2 * h)), draw(st.integers(1, 2 * w)))
            else:  # align_corners to a size of 1 divides by (size - 1) in TVM's own lowering (the
                # llvm reference fails to build: "Divide by zero"), so it asks for 2 or more
                lo = 2 if mode == "align_corners" else 1
                size = (draw(st.integers(lo, max(lo, 2 * h))), draw(st.integers(lo, max(lo, 2 * w))))
                if min(h, w) >= lo and draw(st.integers(0, 3)) == 0:
                    size = (h, w)  # the identity (SegFormer's first decode map): a view on oneDNN
            y = emit(R.image.resize2d(src, size, method=method, coordinate_transformation_mode=mode,
                                      rounding_method=rounding), src)
            recipe.steps.append(f"resize2d({[h, w]} -> {list(size)}, {method}, {mode}, {rounding})")
            keep(y)
        elif kind == "take":
            dtype = draw(st.sampled_from(["int64", "int32"]))
            ids_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
            if draw(st.booleans()):  # an embedding table
                rows, dim = draw(st.integers(1, 10)), draw(st.integers(1, 8))
                table = weight((rows, dim))
                table_shape = (rows, dim)
            else:  # rows of a computed value
                src = pick()
                table, table_shape = src, _shape(src)
                used.add(src)
            ids = rng.integers(0, table_shape[0], ids_shape).astype(dtype)
            index = param(ids_shape, dtype, ids) if draw(st.booleans()) else relax.const(ids)
            y = bb.emit(R.take(table, index, axis=0))
            recipe.steps.append(f"take({list(table_shape)}, {dtype}{list(ids_shape)})")
            if len(_shape(y)) == 0:
                other = pick()
                y = emit(R.add(other, y), other)
            keep(y)
        elif kind == "compare_where":
            a = pick()
            shape = _shape(a)
            op = draw(st.sampled_from(["less", "less_equal", "greater", "greater_equal"]))
            t_shape = _broadcast_shape(draw, shape)
            threshold = relax.const((rng.standard_normal(t_shape) * 0.3).astype(F32))
            cond = bb.emit(getattr(R, op)(threshold, a) if draw(st.booleans()) else getattr(R, op)(a, threshold))
            other = draw(st.sampled_from(["const", "value", "scalar"]))
            if other == "const":
                b = weight(_broadcast_shape(draw, shape))
            elif other == "value":
                b = pick(lambda s: s == shape)
            else:
                b = relax.const(np.float32(-1e4))
            y = emit(R.where(cond, a, b) if draw(st.booleans()) else R.where(cond, b, a), a, b)
            recipe.steps.append(f"{op}+where({list(shape)}, threshold={list(t_shape)}, other={other})")
            keep(y)
        elif kind == "mask":
            # HF's extended attention mask: ids [B, S] int -> (ids != 0) -> float -> (1 - m) * -1e4
            src = pick(lambda s: len(s) >= 2)
            if src is None:
                return False
            shape = _shape(src)
            dtype = draw(st.sampled_from(["int64", "int32"]))
            ids = rng.integers(0, 3, (shape[0], shape[-1])).astype(dtype)
            ids_var = param(ids.shape, dtype, ids)
            op = draw(st.sampled_from(["not_equal", "equal", "greater"]))
            cond = bb.emit(getattr(R, op)(ids_var, relax.const(np.array(0, dtype))))
            m = bb.emit(R.astype(cond, F32))
            m = bb.emit(R.reshape(m, (shape[0],) + (1,) * (len(shape) - 2) + (shape[-1],)))
            bias = bb.emit(R.multiply(bb.emit(R.subtract(relax.const(np.float32(1.0)), m)),
                                      relax.const(np.float32(-1e4))))
            y = emit(R.add(src, bias), src)
            recipe.steps.append(f"mask({list(shape)}, {dtype}, {op})")
            keep(y)
        elif kind == "cast":
            src = pick()
            path = draw(st.sampled_from(["f32_bool_f32", "f32_f32", "i64_f32", "i64_i32_f32", "f32_f16_f32"]))
            if path == "f32_bool_f32":
                v = bb.emit(R.astype(bb.emit(R.astype(bb.emit(R.nn.relu(src)), "bool")), F32))
                y = bb.emit(R.multiply(src, v))
            elif path == "f32_f32":
                y = bb.emit(R.astype(src, F32))
            elif path == "f32_f16_f32":  # float16 is not a runtime dtype: stays on llvm
                y = bb.emit(R.astype(bb.emit(R.astype(src, "float16")), F32))
            else:
                ints = rng.integers(-3, 4, _shape(src)).astype("int64")
                iv = param(ints.shape, "int64", ints) if draw(st.booleans()) else relax.const(ints)
                if path == "i64_i32_f32":
                    iv = bb.emit(R.astype(iv, "int32"))
                y = bb.emit(R.add(src, bb.emit(R.astype(iv, F32))))
            used.add(src)
            recipe.steps.append(f"cast({path}, {list(_shape(src))})")
            keep(y)
        elif kind == "dense_wq":
            src = pick(lambda s: len(s) == 2)
            if src is None:  # flatten a map first (alone, the step would find no matrix)
                src = draw(st.sampled_from(maps()))
                src = emit(R.reshape(src, (_shape(src)[0], math.prod(_shape(src)[1:]))), src)
            k_dim, out = _shape(src)[1], draw(st.integers(1, 40))
            bits = draw(st.sampled_from([4, 8])) if k_dim % 2 == 0 else 8  # two 4-bit codes a byte along K
            zero_points = draw(st.booleans())
            codes = quantize_matrix(rng.standard_normal((out, k_dim)).astype(F32) * 0.5, bits, None, zero_points,
                                    draw(st.sampled_from(["float32", "float16"])))
            parts = [relax.const(a) for a in (codes.codes, codes.scales, codes.zero_points) if a is not None]
            used.add(src)
            y = emit_weight_only_dense(bb, src, codes, parts)
            recipe.steps.append(f"dense_wq(bits={bits}, out={out}, zero_points={zero_points})")
            keep(y)
        elif kind == "take_wq":  # an embedding lookup on weight-only codes: ids (an int input) pick table rows
            rows, k_dim = draw(st.integers(1, 40)), draw(st.sampled_from([16, 32, 48, 64]))
            bits = draw(st.sampled_from([4, 8]))
            block = draw(st.sampled_from([None, 16, k_dim])) if bits == 8 else 16
            zero_points = draw(st.booleans())
            codes = quantize_matrix(rng.standard_normal((rows, k_dim)).astype(F32) * 0.5, bits, block, zero_points,
                                    draw(st.sampled_from(["float32", "float16"])))
            parts = [relax.const(a) for a in (codes.codes, codes.scales, codes.zero_points) if a is not None]
            ids = rng.integers(0, rows, draw(st.integers(1, 6))).astype("int64")
            y = emit_weight_only_take(bb, param(ids.shape, "int64", ids), codes, parts)
            recipe.steps.append(f"take_wq(bits={bits}, rows={rows}, k={k_dim}, block={block}, ids={ids.size})")
            keep(y)
        elif kind == "int8":
            return int8_step()
        elif kind == "int8_chain":
            return int8_chain_step()
        elif kind == "int8_dynamic":
            return int8_dynamic_step()
        else:
            raise ValueError(f"unknown kind {kind!r}")
        return True

    def qconst(value, dtype):
        return relax.const(np.array(value, dtype))

    def int8_tail(tail: str, yd, yparams, relu: bool):
        """What follows an int8 anchor's dequantized output ``yd`` (scale, zero point, type
        ``yparams``): ``chain`` (below), an activation between Q/DQ edges (``sigmoid``, ``hardswish``; ``silu`` as
        x * sigmoid(x) with the sigmoid's own Q/DQ), which the runtime makes the anchor's post-op
        unless the anchor has a relu, or a multiply by a per-channel 8-bit gate / an add of two
        8-bit tensors, which it computes on the 8-bit values. The recipe's step widens by the
        roundings a post-op skips (docs/int8.md)."""
        so, zo, qdt = yparams
        lo, hi = (0, 255) if qdt == "uint8" else (-128, 127)
        z2 = 0 if qdt == "int8" else 128
        if tail == "none":
            return yd

        def qdq(x, scale, zero=z2):
            xq = bb.emit(R.quantize(x, qconst(scale, F32), qconst(zero, qdt), axis=1, out_dtype=qdt))
            return bb.emit(R.dequantize(xq, qconst(scale, F32), qconst(zero, qdt), axis=1, out_dtype=F32))

        s2 = draw(st.sampled_from([0.004, 0.01]))
        skipped = 0.0 if relu else so / 2  # the anchor's own rounding, skipped under a post-op
        if tail in ("sigmoid", "hardswish"):
            y = qdq(bb.emit(R.sigmoid(yd)) if tail == "sigmoid" else activation_chain(bb, "hardswish_onnx", yd), s2)
            step = s2 + (0.25 if tail == "sigmoid" else 1.5) * skipped
        elif tail == "silu":
            s3 = draw(st.sampled_from([0.01, 0.03]))
            y = qdq(bb.emit(R.multiply(yd, qdq(bb.emit(R.sigmoid(yd)), 1 / 256, 0 if qdt == "uint8" else -128))), s3)
            widest = max(abs(lo - zo), abs(hi - zo)) * so
            step = s3 + 1.1 * skipped + (0.0 if relu else widest / 256)  # the gate: one step at most
        elif tail == "gate":
            channels = _shape(yd)[1]
            gate = rng.integers(lo, hi + 1, (channels, 1, 1) if len(_shape(yd)) == 4 else (channels,)).astype(qdt)
            gd = bb.emit(R.dequantize(relax.const(gate), qconst(s2 * 4, F32), qconst(z2, qdt), axis=1, out_dtype=F32))
            # the anchor's own step (it may round the other way) scaled by the widest gate value
            y, step = qdq(bb.emit(R.multiply(yd, gd)), 0.05), 0.05 + so * s2 * 4 * float(np.max(np.abs(gate.astype(int) - z2)))
        elif tail == "softmax":  # a float op no chain takes: plain dequantize, softmax, quantize_dequantize
            sq = 1 / 256
            y = qdq(bb.emit(R.nn.softmax(yd, axis=1)), sq, 0 if qdt == "uint8" else -128)
            step = sq + so  # the anchor's one-step difference moves a softmax value by less than it
        elif tail == "table":  # erf between two int8 dense layers behind reshapes, as a QDQ transformer's
            # GELU between its 2-D dense layers: the reshapes move to the 8-bit values and the chain
            # (dequantize, erf, quantize) becomes a 256-entry table (ops/qdq_views.py, elementwise_chain.cc)
            rows, n = _shape(yd)[0], int(np.prod(_shape(yd)[1:]))
            e = bb.emit(R.reshape(bb.emit(R.erf(bb.emit(R.reshape(yd, (1, rows, n))))), (rows, n)))
            se = draw(st.sampled_from([1 / 128, 1 / 64]))
            eq = bb.emit(R.quantize(e, qconst(se, F32), qconst(0, "int8"), axis=1, out_dtype="int8"))
            ed = bb.emit(R.dequantize(eq, qconst(se, F32), qconst(0, "int8"), axis=1, out_dtype=F32))
            w2 = rng.integers(-int8_weight_bound, int8_weight_bound + 1, (n, 4)).astype("int8")
            wd2 = bb.emit(R.dequantize(relax.const(w2), qconst(0.01, F32), qconst(0, "int8"), axis=1, out_dtype=F32))
            y = bb.emit(R.matmul(ed, wd2))
            # the anchor's one step (and what its post-op skips) through erf (|erf'| <= 1.13), the erf's
            # own rounding, then summed over the second dense's widest column
            step = (1.13 * (so + skipped) + se) * 0.01 * float(np.abs(w2.astype(np.int64)).sum(0).max())
        elif tail == "attention":  # a product of two dequantized 8-bit activations, one permuted and
            # round-tripped on its own grid (Q.K^T as quantize_static writes it): an int8 matmul
            # (ops/int8_matmul.py) reading the anchor's 8-bit output and the permute's 8-bit values
            rows, n = _shape(yd)[0], int(np.prod(_shape(yd)[1:]))
            a = bb.emit(R.reshape(yd, (1, rows, n)))  # batched: a 2-D product of run-time values is a dense
            sb, zb = draw(st.sampled_from([0.01, 0.05])), draw(st.integers(0, 255))
            bq = bb.emit(R.quantize(bb.emit(R.permute_dims(a, [0, 2, 1])), qconst(sb, F32), qconst(zb, "uint8"),
                                    axis=1, out_dtype="uint8"))
            b = bb.emit(R.dequantize(bq, qconst(sb, F32), qconst(zb, "uint8"), axis=1, out_dtype=F32))
            y = bb.emit(R.matmul(a, b))
            # one step of the anchor's output (and what its post-op skips) in a, and the step it may
            # cause in b, times the other operand's widest value, summed over n
            widest = max(abs(lo - zo), abs(hi - zo)) * so
            step = n * (so + skipped) * (widest + 255 * sb + sb) * 1.01
        elif tail == "add":  # add of two 8-bit tensors of one shape
            y, step = qdq(bb.emit(R.add(yd, yd)), 2 * so), 2 * so
        else:  # chain (drawn first: reaches the four kernels): tanh post-op, 8-bit add, tanh table,
            t = qdq(bb.emit(R.tanh(yd)), 1 / 64, 0)  # float32 subtract between Q/DQ steps, softmax
            g = qdq(bb.emit(R.add(t, t)), 1 / 32, 0)
            u = qdq(bb.emit(R.tanh(g)), 1 / 64, 0)
            y = qdq(bb.emit(R.subtract(u, t)), 1 / 32, 0)
            dt = 1 / 64 + skipped
            step = (2 * dt + 1 / 32 + 1 / 64) + dt + 1 / 32
            # then a float op no chain takes (plain dequantize, softmax, a lone quantize_dequantize):
            # a softmax moves by less than its input's difference, plus its own rounding
            y = qdq(bb.emit(R.nn.softmax(y, axis=1)), 1 / 256, 0 if qdt == "uint8" else -128)
            step += 1 / 256
        recipe.quant_step = max(recipe.quant_step, step)
        return y

    def int8_step() -> bool:
        """quantize -> dequantize -> conv2d | dense (int8 weights, per channel or per tensor, zero
        points 0) [+ bias] [relu] -> quantize -> dequantize, random scales and zero points: the
        runtime's int8 anchor (docs/int8.md)."""
        src = pick(lambda s: len(s) in (2, 4) and s[-1] >= 1)
        if src is None:
            return False
        qdt = draw(st.sampled_from(["uint8", "int8"]))
        lo, hi = (0, 255) if qdt == "uint8" else (-128, 127)
        sx = draw(st.sampled_from([0.005, 0.01, 0.03]))
        zx = draw(st.integers(lo, hi // 2 + 64)) if draw(st.booleans()) else (128 if qdt == "uint8" else 0)
        xq = emit(R.quantize(src, qconst(sx, F32), qconst(zx, qdt), axis=1, out_dtype=qdt), src)
        xd = bb.emit(R.dequantize(xq, qconst(sx, F32), qconst(zx, qdt), axis=1, out_dtype=F32))
        shape, out = _shape(src), draw(st.integers(1, 12))
        per_channel = draw(st.booleans())
        w_scale = rng.uniform(0.002, 0.01, out).astype(F32) if per_channel else np.float32(0.005)
        if len(shape) == 4:
            k, stride = draw(st.sampled_from([1, 3])), draw(st.sampled_from([1, 2]))
            wq = rng.integers(-int8_weight_bound, int8_weight_bound + 1, (out, shape[1], k, k)).astype("int8")
            wd = bb.emit(R.dequantize(relax.const(wq), relax.const(w_scale), relax.const(np.zeros(np.shape(w_scale), "int8")),
                                      axis=0, out_dtype=F32))
            y = bb.emit(R.nn.conv2d(xd, wd, strides=[stride, stride], padding=[k // 2] * 4))
            bias_shape = (1, out, 1, 1)
        else:
            wq = rng.integers(-int8_weight_bound, int8_weight_bound + 1, (out, shape[1])).astype("int8")
            wd = bb.emit(R.dequantize(relax.const(wq), relax.const(w_scale), relax.const(np.zeros(np.shape(w_scale), "int8")),
                                      axis=0, out_dtype=F32))
            y = bb.emit(R.matmul(xd, bb.emit(R.permute_dims(wd, [1, 0]))))
            bias_shape = (out,)
        bias, relu = draw(st.booleans()), draw(st.booleans())
        if bias:
            y = bb.emit(R.add(y, relax.const((rng.standard_normal(bias_shape) * 0.1).astype(F32))))
        if relu:
            y = bb.emit(R.nn.relu(y))
        so = draw(st.sampled_from([0.01, 0.03, 0.1]))
        zo = draw(st.integers(lo, hi)) if draw(st.booleans()) else (0 if qdt == "int8" or relu else 128)
        yq = bb.emit(R.quantize(y, qconst(so, F32), qconst(zo, qdt), axis=1, out_dtype=qdt))
        yd = bb.emit(R.dequantize(yq, qconst(so, F32), qconst(zo, qdt), axis=1, out_dtype=F32))
        recipe.quant_step = max(recipe.quant_step, so)
        tail = draw(st.sampled_from(INT8_TAILS))
        yd = int8_tail(tail, yd, (so, zo, qdt), relu)
        keep(yd)
        recipe.steps.append(f"int8({qdt}, x {sx}/{zx}, out={out}, per_channel={per_channel}, bias={bias}, "
                            f"relu={relu}, y {so}/{zo}, {'conv' if len(shape) == 4 else 'dense'}, then {tail})")
        return True

    def int8_dynamic_step() -> bool:
        """DynamicQuantizeLinear's round trip of a value as the import writes it (the scale and
        zero point computed from its min / max, passes/dynamic_quantize_per_reader.py), alone (the
        runtime's dynamic_quantize_dequantize node) or read by a dense with int8 weights (the dense
        quantizes its source per call, attr src_dynamic): same float32 steps as llvm's, int32 sums."""
        from byoc_hetero.passes.dynamic_quantize_per_reader import _RELAX_OPS, _relax_const, dynamic_round_trip

        src = pick(lambda s: len(s) >= 2)
        if src is None:
            return False
        y = dynamic_round_trip(src, lambda op, *args: bb.emit(_RELAX_OPS[op](*args)), _relax_const)
        dense = draw(st.booleans())
        if dense:
            out = draw(st.integers(1, 12))
            wq = rng.integers(-127, 128, (_shape(src)[-1], out)).astype("int8")
            wd = bb.emit(R.dequantize(relax.const(wq), relax.const(np.float32(0.01)), relax.const(np.int8(0)),
                                      axis=1, out_dtype=F32))
            y = bb.emit(R.matmul(y, wd))
        used.add(src)
        keep(y)
        recipe.steps.append(f"int8_dynamic({list(_shape(src))}, dense={dense})")
        return True

    def int8_chain_step() -> bool:
        """quantize -> dequantize -> 2 to 4 element-wise ops (div / mul / add / sub by a constant,
        sometimes a dequantized 8-bit one, erf, add of an earlier value or of an input repeating
        over the trailing dims), each with or without its
        own quantize -> dequantize round trip (random u8 / s8 scales and zero points) -> quantize ->
        dequantize: what quantize_static leaves around GELU and residual adds, which the runtime
        computes as one elementwise_chain node (docs/int8.md). The tolerance is each rounding's step
        times how much the later ops can grow a one-step difference (an intermediate value on
        another side of a rounding tie than llvm's emulation puts it)."""
        src = pick()
        if src is None:
            return False

        def qdq(v, allowed=("uint8", "int8")):
            qdt = draw(st.sampled_from(allowed))
            lo, hi = (0, 255) if qdt == "uint8" else (-128, 127)
            s, z = draw(st.sampled_from([0.004, 0.01, 0.03])), draw(st.integers(lo, hi))
            q = bb.emit(R.quantize(v, qconst(s, F32), qconst(z, qdt), axis=-1, out_dtype=qdt))
            return bb.emit(R.dequantize(q, qconst(s, F32), qconst(z, qdt), axis=-1, out_dtype=F32)), s

        v, s = qdq(emit(R.multiply(src, _scalar(1.0)), src))
        values, steps, names = [v], [s], []  # steps: the tolerance of each rounding so far
        for _ in range(draw(st.integers(2, 4))):
            op = draw(st.sampled_from(["div", "mul", "add", "sub", "erf", "add_value", "add_repeating"]))
            gain = 1.0
            if op == "add_repeating":  # an input of the trailing dims after leading 1s (a mask)
                shape = _shape(src)
                lead = draw(st.integers(1, len(shape)))
                v = bb.emit(R.add(v, param((1,) * lead + shape[lead:])))
            elif op == "erf":
                v, gain = bb.emit(R.erf(v)), 1.13  # |erf'| <= 2 / sqrt(pi)
            elif op == "add_value":
                v = bb.emit(R.add(v, draw(st.sampled_from(values))))
                gain = 2.0  # both operands may carry the difference
            else:
                c = float(draw(st.sampled_from([0.5, 0.7071, 1.0])))
                const = _scalar(1.0 / c if op == "div" else c)
                if draw(st.booleans()):  # quantize_static's quantized constant: dequantize(q) of a u8 scalar
                    const = bb.emit(R.dequantize(qconst(100, "uint8"), qconst(c / 100, F32), qconst(0, "uint8"),
                                                 out_dtype=F32))
                fn = {"div": R.divide, "mul": R.multiply, "add": R.add, "sub": R.subtract}[op]
                v = bb.emit(fn(v, const) if draw(st.booleans()) or op == "div" else fn(const, v))
                gain = 2.0 if op == "div" else 1.0
            steps = [t * gain for t in steps]
            if draw(st.booleans()):
                v, s = qdq(v)
                steps.append(s)
            values.append(v)
            names.append(op)
        v, s = qdq(v)
        recipe.quant_step = max(recipe.quant_step, s + sum(steps))
        keep(v)
        recipe.steps.append(f"int8_chain({', '.join(names)})")
        return True

    # graphs lean towards convs (wide ones most: the Winograd kind)
    default = tuple(k for k in KINDS if k not in INT8_KINDS + WEIGHT_ONLY_KINDS + PAD_KINDS)
    allowed = kinds or (("conv",) * 4 + CNN_KINDS if wide else ("conv",) + default)
    with bb.function("main"):
        with bb.dataflow():
            if kinds:  # the first applicable kind of those asked for, then any of them
                for kind in kinds:
                    if step(kind):
                        break
            for _ in range(draw(st.integers(0 if kinds else 1, max_ops))):
                step(draw(st.sampled_from(allowed)))
            leaves = [v for v in vals if v not in used] or [vals[-1]]
            outputs = leaves[-3:]
            if len(outputs) == 1 and draw(st.booleans()):
                result = bb.emit_output(outputs[0])
            else:
                result = bb.emit_output(relax.Tuple(outputs))
        bb.emit_func_output(result, params=[x] + params)
    inputs = [(rng.standard_normal((n, c, h, w)) * 0.5).astype(F32)] + values
    if special:
        inputs[0] = sprinkle_special_values(rng, inputs[0])
        recipe.steps.append("x with NaN/inf")
    return bb.get(), inputs, recipe


def run_all(ex, arrays) -> list[np.ndarray]:
    """Run ``main`` and return every output as numpy."""
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _gqa_product(e, a, b, kv_heads: int, group: int):
    """``a`` [1, heads, S, X] times ``b`` [1, kv_heads, 1, X, Y] as Llama's exporters write GQA: ``a``
    read as [1, kv_heads, group, S, X], the 5-D product read back as [1, heads, S, Y]."""
    heads, rows, inner = _shape(a)[1:]
    out = e(R.matmul(e(R.reshape(a, (1, kv_heads, group, rows, inner))), b))
    return e(R.reshape(out, (1, heads, rows, _shape(out)[-1])))


@st.composite
def transformer_graphs(draw):
    """Draw ``(mod, inputs, recipe)``: one attention block with random heads / sequence / head size,
    the scores scaled (multiply or divide by a random constant, or not) and masked (a mask input of a
    random broadcasting shape, or none), written directly or as TVM's torch frontend does (batched
    [H, S, D] matmuls, 2-D linears between reshapes); then an MLP whose activation is a gelu chain
    (erf or tanh form, random grouping and operand order, sometimes with a wrong constant, so no
    gelu), ``nn.gelu`` or none, a residual add, and a ``take`` along a random axis."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    # 260 keys: more query rows than one block of the fused kernel (cpp/kernels/attention.cc's
    # RowsPerBlock), so its packed K^T / V path runs too
    heads, seq, dim = draw(st.integers(1, 3)), draw(st.one_of(st.integers(2, 9), st.just(260))), draw(st.integers(1, 6))
    torch_style = draw(st.booleans())
    # GQA as Llama's exporters write it: ``group`` query heads per K / V head, 5-D matmuls whose
    # scores are merged to [1, heads, S, S] around the scale, mask and softmax
    group = 1 if torch_style else draw(st.sampled_from([1, 1, 2, 3]))
    kv_heads, heads = heads, heads * group
    hidden = heads * dim
    scale_op = draw(st.sampled_from(["mul", "div", "none"]))
    scale = float(draw(st.sampled_from([0.125, 0.5, 1.7])))
    mask_shape = draw(st.sampled_from([None, (seq, seq), (1, 1, seq, seq), (1, heads, 1, seq), (1, 1, 1, seq),
                                       (1, heads, seq, seq)]))
    act = draw(st.sampled_from(["erf", "tanh", "gelu", "none"]))
    arg, grouping, swap = draw(st.sampled_from(["div", "mul"])), draw(st.sampled_from(["xh_a", "xa_h", "x_ha", "div2"])), draw(st.booleans())
    wrong = draw(st.sampled_from([None, None, None, "half", "one", "inner"]))
    take_axis = draw(st.sampled_from([None, 0, 1, 2]))
    recipe = Recipe([f"seed={seed}", f"heads={heads} kv_heads={kv_heads} seq={seq} dim={dim} torch_style={torch_style}",
                     f"scale {scale_op} {scale}", f"mask {mask_shape}", f"act {act} {arg} {grouping} swap={swap} wrong={wrong}",
                     f"take axis {take_axis}"])

    def c(value):
        return relax.const(np.array(value, dtype=F32))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, seq, hidden), F32))
    params = [x]
    mask = None
    if mask_shape is not None:
        mask = relax.Var("mask", relax.TensorType(mask_shape, F32))
        params.append(mask)
    with bb.function("main", params):
        with bb.dataflow():
            e = bb.emit

            def linear(v, k, n):
                w, b = _const(rng, (k, n)), _const(rng, (n,))
                if torch_style:
                    rows = e(R.reshape(v, (seq, k)))
                    return e(R.reshape(e(R.add(e(R.matmul(rows, w)), b)), (1, seq, n)))
                return e(R.add(e(R.matmul(v, w)), b))

            def heads_of(v, n):
                return e(R.permute_dims(e(R.reshape(v, (1, seq, n, dim))), [0, 2, 1, 3]))

            q, k, v = (heads_of(linear(x, hidden, n * dim), n) for n in (heads, kv_heads, kv_heads))
            kt = e(R.permute_dims(k, [0, 1, 3, 2]))
            if group > 1:
                s = _gqa_product(e, q, e(R.permute_dims(e(R.reshape(k, (1, kv_heads, 1, seq, dim))), [0, 1, 2, 4, 3])),
                                 kv_heads, group)
            elif torch_style:
                s = e(R.reshape(e(R.matmul(e(R.reshape(q, (heads, seq, dim))), e(R.reshape(kt, (heads, dim, seq))))),
                                (1, heads, seq, seq)))
            else:
                s = e(R.matmul(q, kt))
            if scale_op == "mul":
                s = e(R.multiply(c(scale), s) if swap else R.multiply(s, c(scale)))
            elif scale_op == "div":
                s = e(R.divide(s, c(scale)))
            if mask is not None:
                s = e(R.add(mask, s) if swap else R.add(s, mask))
            p = e(R.nn.softmax(s, axis=-1))
            pv = _gqa_product(e, p, e(R.reshape(v, (1, kv_heads, 1, seq, dim))), kv_heads, group) if group > 1 \
                else e(R.matmul(p, v))
            o = e(R.reshape(e(R.permute_dims(pv, [0, 2, 1, 3])), (1, seq, hidden)))
            h = e(R.add(linear(o, hidden, hidden), x))
            y = linear(h, hidden, 2 * hidden)
            half = 0.6 if wrong == "half" else 0.5
            one = 0.9 if wrong == "one" else 1.0
            if act == "erf":
                inner_c = 1.5 if wrong == "inner" else (np.sqrt(2) if arg == "div" else 1 / np.sqrt(2))
                inner = e(R.divide(y, c(inner_c)) if arg == "div" else R.multiply(y, c(inner_c)))
                one_plus = e(R.add(c(one), e(R.erf(inner))) if swap else R.add(e(R.erf(inner)), c(one)))
            elif act == "tanh":
                cube = e(R.multiply(e(R.power(y, c(3.0))), c(0.05 if wrong == "inner" else 0.044715)))
                inner = e(R.tanh(e(R.multiply(e(R.add(y, cube)), c(np.sqrt(2 / np.pi))))))
                one_plus = e(R.add(inner, c(one)))
            if act in ("erf", "tanh"):
                if grouping == "xh_a":
                    y = e(R.multiply(e(R.multiply(y, one_plus)), c(half)))
                elif grouping == "xa_h":
                    y = e(R.multiply(e(R.multiply(c(half), y) if swap else R.multiply(y, c(half))), one_plus))
                elif grouping == "x_ha":
                    y = e(R.multiply(y, e(R.multiply(one_plus, c(half)))))
                else:
                    y = e(R.divide(e(R.multiply(y, one_plus)), c(2 * half)))
            elif act == "gelu":
                y = e(R.nn.gelu(y))
            out = e(R.add(h, linear(y, 2 * hidden, hidden)))
            if take_axis is not None:
                extent = (1, seq, hidden)[take_axis]
                ids = rng.integers(0, extent, size=draw(st.sampled_from([(), (1,), (3,)])))
                out = e(R.take(out, relax.const(ids.astype("int64")), axis=take_axis))
            result = bb.emit_output(out)
        bb.emit_func_output(result)
    inputs = [(rng.standard_normal((1, seq, hidden)) * 0.5).astype(F32)]
    if mask_shape is not None:
        inputs.append(np.where(rng.random(mask_shape) < 0.3, -1e4, 0.0).astype(F32))
    return bb.get(), inputs, recipe
