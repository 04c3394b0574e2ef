"""Benchmark and test workloads as Relax modules with random (seeded) float32 weights.

Each builder returns ``(mod, params)``: ``mod["main"]`` takes the model inputs first and then every
weight as a further parameter; ``params`` maps each weight parameter's name to a numpy array.
Layers are written the way TVM's frontends emit them: a conv2d bias is ``add(y, reshape(b,
[1, C, 1, 1]))``, a PyTorch-style linear layer is ``matmul(x, permute_dims(W)) + b`` and an
ONNX-style one ``matmul(x, W) + b``.  VGG-11 and ResNet-18 have batch norm folded into the conv
bias, as exported inference graphs have it; MobileNetV2 keeps it as ``batch_norm`` in inference
form (``training=False``) after bias-free convolutions, as PyTorch's frontend emits it.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

Params = dict[str, np.ndarray]


class _NetBuilder:
    """Emits layers into one dataflow block and collects weight parameters with their values."""

    def __init__(self, seed: int):
        self.bb = relax.BlockBuilder()
        self.rng = np.random.default_rng(seed)
        self.weights: list[relax.Var] = []
        self.params: Params = {}

    def weight(self, name: str, shape: tuple[int, ...], fan_in: int) -> relax.Var:
        var = relax.Var(name, relax.TensorType(shape, "float32"))
        scale = math.sqrt(2.0 / fan_in)
        self.params[name] = (self.rng.standard_normal(shape) * scale).astype("float32")
        self.weights.append(var)
        return var

    def bias(self, name: str, channels: int) -> relax.Var:
        var = relax.Var(name, relax.TensorType((channels,), "float32"))
        self.params[name] = (self.rng.standard_normal(channels) * 0.05).astype("float32")
        self.weights.append(var)
        return var

    def emit(self, expr: relax.Expr) -> relax.Var:
        return self.bb.emit(expr)

    def conv(self, x, name, cin, cout, k, stride=1, pad=0, bias=True, relu=True, groups=1,
             bn=False, relu6=False):
        w = self.weight(f"{name}_weight", (cout, cin // groups, k, k), fan_in=cin // groups * k * k)
        y = self.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, groups=groups))
        if bias:
            b = self.bias(f"{name}_bias", cout)
            y = self.emit(relax.op.add(y, relax.op.reshape(b, (1, cout, 1, 1))))
        if bn:
            y = self.batch_norm(y, f"{name}_bn", cout)
        if relu6:
            y = self.emit(relax.op.clip(y, 0, 6))
        elif relu:
            y = self.emit(relax.op.nn.relu(y))
        return y

    def batch_norm(self, x, name, channels):
        """Inference-form batch norm with random statistics (element 0 of relax's batch_norm)."""
        stats = []
        for part, make in (
            ("gamma", lambda: 1.0 + 0.1 * self.rng.standard_normal(channels)),
            ("beta", lambda: 0.1 * self.rng.standard_normal(channels)),
            ("mean", lambda: 0.1 * self.rng.standard_normal(channels)),
            ("var", lambda: self.rng.uniform(0.5, 1.5, channels)),
        ):
            var = relax.Var(f"{name}_{part}", relax.TensorType((channels,), "float32"))
            self.params[f"{name}_{part}"] = make().astype("float32")
            self.weights.append(var)
            stats.append(var)
        y = self.emit(relax.op.nn.batch_norm(x, *stats, axis=1, epsilon=1e-5, training=False))
        return self.emit(relax.TupleGetItem(y, 0))

    def linear(self, x, name, fin, fout, relu=True, transposed=True):
        """``transposed``: weight stored (out, in) as PyTorch does; else (in, out) as ONNX MatMul."""
        if transposed:
            w = self.weight(f"{name}_weight", (fout, fin), fan_in=fin)
            y = self.emit(relax.op.matmul(x, relax.op.permute_dims(w, [1, 0])))
        else:
            w = self.weight(f"{name}_weight", (fin, fout), fan_in=fin)
            y = self.emit(relax.op.matmul(x, w))
        b = self.bias(f"{name}_bias", fout)
        y = self.emit(relax.op.add(y, b))
        if relu:
            y = self.emit(relax.op.nn.relu(y))
        return y

    def flatten(self, x):
        shape = [int(d) for d in x.ty.shape.values]
        return self.emit(relax.op.reshape(x, (shape[0], int(np.prod(shape[1:])))))


def _finish(nb: _NetBuilder, inputs: list[relax.Var], emit_layers) -> tuple[tvm.IRModule, Params]:
    """Emit ``emit_layers(nb, *inputs)`` inside ``main(inputs..., weights...)``."""
    # weights are created while the layers are emitted, so emit into a scratch function first
    with nb.bb.function("main"):
        with nb.bb.dataflow():
            out = emit_layers(nb, *inputs)
            gv = nb.bb.emit_output(out)
        nb.bb.emit_func_output(gv, params=list(inputs) + nb.weights)
    return nb.bb.get(), nb.params


def _image(batch: int, channels: int, size: int) -> relax.Var:
    return relax.Var("data", relax.TensorType((batch, channels, size, size), "float32"))


VGG11_LAYERS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def vgg11(batch: int = 1, image_size: int = 224, num_classes: int = 1000,
          fc_width: int = 4096, seed: int = 0) -> tuple[tvm.IRModule, Params]:
    """VGG-11 (configuration "A", no batch norm): 8 conv3x3+ReLU, 5 max-pools, 3 linear layers.

    ``image_size`` must be a multiple of 32; smaller sizes and ``fc_width`` keep tests fast.
    """
    if image_size % 32:
        raise ValueError(f"vgg11: image_size must be a multiple of 32, got {image_size}")

    def layers(nb: _NetBuilder, x):
        cin, n = 3, 0
        for item in VGG11_LAYERS:
            if item == "M":
                x = nb.emit(relax.op.nn.max_pool2d(x, pool_size=2, strides=2))
            else:
                n += 1
                x = nb.conv(x, f"conv{n}", cin, item, 3, pad=1)
                cin = item
        x = nb.flatten(x)
        feat = 512 * (image_size // 32) ** 2
        x = nb.linear(x, "fc1", feat, fc_width)
        x = nb.linear(x, "fc2", fc_width, fc_width)
        return nb.linear(x, "fc3", fc_width, num_classes, relu=False)

    return _finish(_NetBuilder(seed), [_image(batch, 3, image_size)], layers)


def resnet18(batch: int = 1, image_size: int = 224, num_classes: int = 1000,
             seed: int = 0) -> tuple[tvm.IRModule, Params]:
    """ResNet-18 (basic blocks [2, 2, 2, 2]) with batch norm folded into conv biases."""
    if image_size % 32:
        raise ValueError(f"resnet18: image_size must be a multiple of 32, got {image_size}")

    def block(nb: _NetBuilder, x, name, cin, cout, stride):
        y = nb.conv(x, f"{name}_conv1", cin, cout, 3, stride=stride, pad=1)
        y = nb.conv(y, f"{name}_conv2", cout, cout, 3, pad=1, relu=False)
        if stride != 1 or cin != cout:
            x = nb.conv(x, f"{name}_down", cin, cout, 1, stride=stride, relu=False)
        return nb.emit(relax.op.nn.relu(nb.emit(relax.op.add(y, x))))

    def layers(nb: _NetBuilder, x):
        x = nb.conv(x, "conv1", 3, 64, 7, stride=2, pad=3)
        x = nb.emit(relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1))
        cin = 64
        for stage, cout in enumerate((64, 128, 256, 512), start=1):
            for i in range(2):
                stride = 2 if (stage > 1 and i == 0) else 1
                x = block(nb, x, f"layer{stage}_{i}", cin, cout, stride)
                cin = cout
        x = nb.emit(relax.op.nn.adaptive_avg_pool2d(x, output_size=1))
        x = nb.flatten(x)
        return nb.linear(x, "fc", 512, num_classes, relu=False)

    return _finish(_NetBuilder(seed), [_image(batch, 3, image_size)], layers)


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count as torchvision's MobileNetV2 does."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


MOBILENET_V2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1))
"""(expansion t, output channels c, repeats n, first stride s) of each MobileNetV2 stage."""


def mobilenet_v2(batch: int = 1, image_size: int = 224, num_classes: int = 1000,
                 width_mult: float = 1.0, seed: int = 0) -> tuple[tvm.IRModule, Params]:
    """MobileNetV2: inverted residual blocks of 1x1 expand, 3x3 depthwise and 1x1 project
    convolutions, each followed by batch norm (inference form) and ReLU6 (none after the
    projection), with a residual add where shapes allow; global average pooling (a mean over the
    spatial axes) and a linear classifier.  ``width_mult`` < 1 and a small ``image_size`` (a
    multiple of 32) keep tests fast.
    """
    if image_size % 32:
        raise ValueError(f"mobilenet_v2: image_size must be a multiple of 32, got {image_size}")

    def layers(nb: _NetBuilder, x):
        cin = _make_divisible(32 * width_mult)
        x = nb.conv(x, "features0", 3, cin, 3, stride=2, pad=1, bias=False, bn=True, relu6=True)
        index = 1
        for t, c, n, s in MOBILENET_V2_BLOCKS:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                stride = s if i == 0 else 1
                name = f"features{index}"
                hidden = cin * t
                y = x
                if t != 1:
                    y = nb.conv(y, f"{name}_expand", cin, hidden, 1, bias=False, bn=True, relu6=True)
                y = nb.conv(y, f"{name}_dw", hidden, hidden, 3, stride=stride, pad=1, bias=False,
                            bn=True, relu6=True, groups=hidden)
                y = nb.conv(y, f"{name}_project", hidden, cout, 1, bias=False, bn=True, relu=False)
                if stride == 1 and cin == cout:
                    y = nb.emit(relax.op.add(x, y))
                x, cin = y, cout
                index += 1
        last = _make_divisible(1280 * max(1.0, width_mult))
        x = nb.conv(x, f"features{index}", cin, last, 1, bias=False, bn=True, relu6=True)
        x = nb.emit(relax.op.mean(x, axis=[2, 3], keepdims=False))
        return nb.linear(x, "classifier", last, num_classes, relu=False)

    return _finish(_NetBuilder(seed), [_image(batch, 3, image_size)], layers)


def mlp(batch: int = 1, features: int = 784, hidden: tuple[int, ...] = (512, 256),
        num_classes: int = 10, seed: int = 0) -> tuple[tvm.IRModule, Params]:
    """A multi-layer perceptron with ONNX-style (in, out) weights: matmul + bias + ReLU per layer."""

    def layers(nb: _NetBuilder, x):
        fin = features
        for i, width in enumerate(hidden, start=1):
            x = nb.linear(x, f"fc{i}", fin, width, transposed=False)
            fin = width
        return nb.linear(x, f"fc{len(hidden) + 1}", fin, num_classes, relu=False, transposed=False)

    x = relax.Var("data", relax.TensorType((batch, features), "float32"))
    return _finish(_NetBuilder(seed), [x], layers)


def small_convnet(batch: int = 1, image_size: int = 16, seed: int = 0) -> tuple[tvm.IRModule, Params]:
    """A tiny conv/dense net for quick tests: every built-in rule form appears once."""

    def layers(nb: _NetBuilder, x):
        x = nb.conv(x, "conv1", 3, 8, 3, pad=1)                          # conv2d_bias_relu
        x = nb.conv(x, "conv2", 8, 16, 3, stride=2, pad=1, bias=False)   # conv2d_relu
        x = nb.conv(x, "conv3", 16, 16, 1, relu=False)                   # conv2d_bias
        x = nb.emit(relax.op.nn.max_pool2d(x, pool_size=2, strides=2))
        x = nb.flatten(x)
        feat = 16 * (image_size // 4) ** 2
        x = nb.linear(x, "fc1", feat, 32)                                # dense_bias_relu (transposed)
        return nb.linear(x, "fc2", 32, 10, relu=False, transposed=False)  # dense_bias

    return _finish(_NetBuilder(seed), [_image(batch, 3, image_size)], layers)
