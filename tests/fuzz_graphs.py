"""Random Relax graphs for differential fuzzing (offloaded build vs llvm-only build).

A graph is a short chain-with-branches over NCHW feature maps and 2-D matrices, drawn from the ops
the rules know: conv2d (strides, padding, dilation, groups, bias, relu; sometimes after an explicit
nn.pad, zero or not), pooling, add, concat, activations (also hardswish / hardsigmoid / silu spelled
out as the frontends write them), reshape to 2-D, dense (plain and transposed weight, bias, relu).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from hypothesis import strategies as st
from tvm import relax

R = relax.op
F32 = "float32"


@dataclass
class Recipe:
    """What a drawn graph is made of (printed by hypothesis when a case fails)."""

    steps: list[str] = field(default_factory=list)

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


CHAINS = ("hardswish_torch", "hardswish_onnx", "hardsigmoid_torch", "hardsigmoid_onnx", "silu_chain")


@st.composite
def graphs(draw, max_ops: int = 6, wide: bool = False):
    """Draw ``(mod, inputs, recipe)``: a Relax module with static shapes and numpy inputs.

    ``wide``: channel counts of 16 and 32 (the runtime's Winograd convolution needs multiples of 16).
    """
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    recipe = Recipe([f"seed={seed}"])
    n = draw(st.integers(1, 2))
    c = draw(st.sampled_from([16, 32])) if wide else draw(st.integers(1, 6))
    h = draw(st.integers(3, 9))
    w = draw(st.integers(3, 9))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, h, w), F32))
    weight_params: list[relax.Var] = []
    weight_values: list[np.ndarray] = []
    recipe.steps.append(f"x{[n, c, h, w]}")

    def weight(shape):
        """A weight: usually a constant, sometimes a runtime parameter of main."""
        if draw(st.booleans()) and draw(st.booleans()):
            var = relax.Var(f"w{len(weight_params)}", relax.TensorType(shape, F32))
            weight_params.append(var)
            weight_values.append((rng.standard_normal(shape) * 0.5).astype(F32))
            return var
        return _const(rng, shape)

    with bb.function("main"):
        with bb.dataflow():
            maps = [x]     # 4-D values
            mats = []      # 2-D values
            for _ in range(draw(st.integers(1, max_ops))):
                kinds = ["conv"] * (5 if wide else 2) + ["pool", "act", "add", "concat", "flatten"] if maps else []
                kinds += ["dense", "dense", "act2d"] if mats else []
                kind = draw(st.sampled_from(kinds))
                if kind == "conv":
                    src = draw(st.sampled_from(maps))
                    n_, c_, h_, w_ = _shape(src)
                    # wide graphs lean towards 3x3 stride-1 dense convs (the Winograd kind)
                    k = draw(st.sampled_from([3, 3, 3, 1] if wide else [1, 3]))
                    dil = draw(st.sampled_from([1, 1, 1, 2] if wide else [1, 2])) if k == 3 and min(h_, w_) >= 5 else 1
                    span = dil * (k - 1) + 1
                    pads = [draw(st.integers(0, k - 1)) for _ in range(4)]
                    if h_ + pads[0] + pads[2] < span or w_ + pads[1] + pads[3] < span:
                        pads = [k // 2 * dil] * 4
                    # an explicit pad (EfficientNet's ZeroPad2d): zero folds into the conv's padding, a
                    # non-zero value stays on llvm
                    pre_pad = draw(st.sampled_from(["none", "none", "zero", "one"])) if not wide else "none"
                    if pre_pad != "none":
                        extra = [draw(st.integers(0, 2)) for _ in range(4)]
                        src = bb.emit(R.nn.pad(src, [0, 0, 0, 0, extra[0], extra[2], extra[1], extra[3]],
                                               "constant", 0.0 if pre_pad == "zero" else 1.0))
                        recipe.steps.append(f"pad({pre_pad}, {extra})")
                    stride = draw(st.sampled_from([1, 1, 2]))
                    groups = draw(st.sampled_from(([1, 1, 1] if wide else []) + [g for g in (1, 2, c_) if c_ % g == 0]))
                    out_c = groups * draw(st.integers(1, 3))
                    if wide and groups == 1:
                        out_c = draw(st.sampled_from([16, 32]))
                    y = bb.emit(R.nn.conv2d(src, weight((out_c, c_ // groups, k, k)), strides=stride,
                                            padding=pads, dilation=dil, groups=groups))
                    bias = draw(st.sampled_from(["none", "reshaped", "4d"]))
                    if bias == "reshaped":
                        y = bb.emit(R.add(y, R.reshape(weight((out_c,)), (1, out_c, 1, 1))))
                    elif bias == "4d":
                        y = bb.emit(R.add(y, _const(rng, (1, out_c, 1, 1))))
                    relu = draw(st.booleans())
                    if relu:
                        y = bb.emit(R.nn.relu(y))
                    recipe.steps.append(f"conv(k={k}, s={stride}, pad={pads}, d={dil}, g={groups}, "
                                        f"o={out_c}, bias={bias}, relu={relu})")
                    maps.append(y)
                elif kind == "pool":
                    src = draw(st.sampled_from(maps))
                    if min(_shape(src)[2:]) < 2:
                        continue
                    pool = draw(st.sampled_from(["max", "avg", "global"]))
                    if pool == "max":
                        y = bb.emit(R.nn.max_pool2d(src, pool_size=2, strides=2))
                    elif pool == "avg":
                        y = bb.emit(R.nn.avg_pool2d(src, pool_size=2, strides=1))
                    else:
                        y = bb.emit(R.nn.adaptive_avg_pool2d(src, output_size=1))
                    recipe.steps.append(f"{pool}_pool")
                    maps.append(y)
                elif kind in ("act", "act2d"):
                    src = draw(st.sampled_from(maps if kind == "act" else mats))
                    act = draw(st.sampled_from(["relu", "sigmoid", "tanh", *CHAINS]))
                    if act in CHAINS:
                        y = activation_chain(bb, act, src)
                    else:
                        y = bb.emit({"relu": R.nn.relu, "sigmoid": R.sigmoid, "tanh": R.tanh}[act](src))
                    recipe.steps.append(act)
                    (maps if kind == "act" else mats).append(y)
                elif kind == "add":
                    a = draw(st.sampled_from(maps))
                    same = [m for m in maps if _shape(m) == _shape(a)]
                    b = draw(st.sampled_from(same))
                    y = bb.emit(R.add(a, b))
                    recipe.steps.append("add")
                    maps.append(y)
                elif kind == "concat":
                    a = draw(st.sampled_from(maps))
                    fits = [m for m in maps if _shape(m)[0] == _shape(a)[0] and _shape(m)[2:] == _shape(a)[2:]]
                    b = draw(st.sampled_from(fits))
                    y = bb.emit(R.concat([a, b], axis=1))
                    recipe.steps.append("concat")
                    maps.append(y)
                elif kind == "flatten":
                    src = draw(st.sampled_from(maps))
                    s = _shape(src)
                    y = bb.emit(R.reshape(src, (s[0], int(np.prod(s[1:])))))
                    recipe.steps.append("flatten")
                    mats.append(y)
                elif kind == "dense":
                    src = draw(st.sampled_from(mats))
                    k_dim = _shape(src)[1]
                    out = draw(st.integers(1, 12))
                    transposed = draw(st.booleans())
                    if transposed:
                        y = bb.emit(R.matmul(src, R.permute_dims(weight((out, k_dim)), [1, 0])))
                    else:
                        y = bb.emit(R.matmul(src, weight((k_dim, out))))
                    bias = draw(st.booleans())
                    if bias:
                        y = bb.emit(R.add(y, weight((out,))))
                    relu = draw(st.booleans())
                    if relu:
                        y = bb.emit(R.nn.relu(y))
                    recipe.steps.append(f"dense(out={out}, transposed={transposed}, bias={bias}, relu={relu})")
                    mats.append(y)
            outputs = [maps[-1]] + ([mats[-1]] if mats else [])
            if len(outputs) == 1 or draw(st.booleans()):
                result = bb.emit_output(outputs[-1] if draw(st.booleans()) else outputs[0])
            else:
                result = bb.emit_output(relax.Tuple(outputs))
        bb.emit_func_output(result, params=[x] + weight_params)
    inputs = [(rng.standard_normal((n, c, h, w)) * 0.5).astype(F32)] + weight_values
    return bb.get(), inputs, recipe


def run_all(ex, arrays) -> list[np.ndarray]:
    """Run ``main`` and return every output as numpy."""
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


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
    heads, seq, dim = draw(st.integers(1, 3)), draw(st.integers(2, 9)), draw(st.integers(1, 6))
    hidden = heads * dim
    torch_style = draw(st.booleans())
    scale_op = draw(st.sampled_from(["mul", "div", "none"]))
    scale = float(draw(st.sampled_from([0.125, 0.5, 1.7])))
    mask_shape = draw(st.sampled_from([None, (seq, seq), (1, 1, seq, seq), (1, heads, 1, seq), (1, 1, 1, seq),
                                       (1, heads, seq, seq)]))
    act = draw(st.sampled_from(["erf", "tanh", "gelu", "none"]))
    arg, grouping, swap = draw(st.sampled_from(["div", "mul"])), draw(st.sampled_from(["xh_a", "xa_h", "x_ha", "div2"])), draw(st.booleans())
    wrong = draw(st.sampled_from([None, None, None, "half", "one", "inner"]))
    take_axis = draw(st.sampled_from([None, 0, 1, 2]))
    recipe = Recipe([f"seed={seed}", f"heads={heads} seq={seq} dim={dim} torch_style={torch_style}",
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

            def heads_of(v):
                return e(R.permute_dims(e(R.reshape(v, (1, seq, heads, dim))), [0, 2, 1, 3]))

            q, k, v = (heads_of(linear(x, hidden, hidden)) for _ in range(3))
            kt = e(R.permute_dims(k, [0, 1, 3, 2]))
            if torch_style:
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
            o = e(R.reshape(e(R.permute_dims(e(R.matmul(p, v)), [0, 2, 1, 3])), (1, seq, hidden)))
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
