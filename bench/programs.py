"""The benchmark's networks, written once against a tiny graph API and run by three backends:

* ``TorchGraph``  — PyTorch eager (torch.nn.functional on the weights of ``byoc_hetero.models``);
* ``OnnxGraph``   — an ONNX model (onnx.helper) with the same weights, for ONNX Runtime;
* ``FlopGraph``   — counts multiply-adds (x2 = FLOPs) and checks shapes.

Each program mirrors the Relax builder of the same name in ``byoc_hetero/models.py`` layer for
layer, with the same parameter names, so ``params`` from the Relax builder load unchanged; the
benchmark checks that every backend computes the same output, which also proves the mirrors right.
"""

from __future__ import annotations

import numpy as np

# Copies of byoc_hetero.models' layer tables (the peers' processes do not import TVM; bench/run.py
# checks that these agree with byoc_hetero.models before it starts).
VGG11_LAYERS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
MOBILENET_V2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1))


def _make_divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


# ------------------------------------------------------------------------------------------------
# Programs (same layers and names as byoc_hetero.models)


def vgg11(g, x, image_size=224, num_classes=1000, fc_width=4096):
    cin, n = 3, 0
    for item in VGG11_LAYERS:
        if item == "M":
            x = g.max_pool(x, 2, 2, 0)
        else:
            n += 1
            x = g.conv(x, f"conv{n}", cin, item, 3, pad=1, bias=True, act="relu")
            cin = item
    x = g.flatten(x)
    x = g.linear(x, "fc1", relu=True)
    x = g.linear(x, "fc2", relu=True)
    return g.linear(x, "fc3", relu=False)


def resnet18(g, x, image_size=224, num_classes=1000):
    def block(x, name, cin, cout, stride):
        y = g.conv(x, f"{name}_conv1", cin, cout, 3, stride=stride, pad=1, bias=True, act="relu")
        y = g.conv(y, f"{name}_conv2", cout, cout, 3, pad=1, bias=True, act=None)
        if stride != 1 or cin != cout:
            x = g.conv(x, f"{name}_down", cin, cout, 1, stride=stride, bias=True, act=None)
        return g.relu(g.add(y, x))

    x = g.conv(x, "conv1", 3, 64, 7, stride=2, pad=3, bias=True, act="relu")
    x = g.max_pool(x, 3, 2, 1)
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for i in range(2):
            stride = 2 if (stage > 1 and i == 0) else 1
            x = block(x, f"layer{stage}_{i}", cin, cout, stride)
            cin = cout
    x = g.global_avg_pool(x)
    return g.linear(x, "fc", relu=False)


def mobilenet_v2(g, x, image_size=224, num_classes=1000, width_mult=1.0):
    cin = _make_divisible(32 * width_mult)
    x = g.conv(x, "features0", 3, cin, 3, stride=2, pad=1, bn=True, act="relu6")
    index = 1
    for t, c, n, s in MOBILENET_V2_BLOCKS:
        cout = _make_divisible(c * width_mult)
        for i in range(n):
            stride = s if i == 0 else 1
            name = f"features{index}"
            hidden = cin * t
            y = x
            if t != 1:
                y = g.conv(y, f"{name}_expand", cin, hidden, 1, bn=True, act="relu6")
            y = g.conv(y, f"{name}_dw", hidden, hidden, 3, stride=stride, pad=1, groups=hidden, bn=True,
                       act="relu6")
            y = g.conv(y, f"{name}_project", hidden, cout, 1, bn=True, act=None)
            if stride == 1 and cin == cout:
                y = g.add(x, y)
            x, cin = y, cout
            index += 1
    last = _make_divisible(1280 * max(1.0, width_mult))
    x = g.conv(x, f"features{index}", cin, last, 1, bn=True, act="relu6")
    x = g.global_avg_pool(x)
    return g.linear(x, "classifier", relu=False)


def mlp(g, x, features=784, hidden=(512, 256), num_classes=10):
    for i in range(1, len(hidden) + 1):
        x = g.linear(x, f"fc{i}", relu=True, transposed=False)
    return g.linear(x, f"fc{len(hidden) + 1}", relu=False, transposed=False)


PROGRAMS = {"vgg11": vgg11, "resnet18": resnet18, "mobilenet_v2": mobilenet_v2, "mlp": mlp}


# ------------------------------------------------------------------------------------------------
# Backends


class FlopGraph:
    """Shapes only; counts FLOPs (2 per multiply-add) of convolutions and linear layers."""

    def __init__(self, params):
        self.params = params
        self.flops = 0

    def conv(self, x, name, cin, cout, k, stride=1, pad=0, groups=1, bias=False, bn=False, act=None):
        n, c, h, w = x
        oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        self.flops += 2 * n * cout * oh * ow * (cin // groups) * k * k
        return (n, cout, oh, ow)

    def max_pool(self, x, k, s, p):
        n, c, h, w = x
        return (n, c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)

    def add(self, a, b):
        return a

    def relu(self, x):
        return x

    def global_avg_pool(self, x):
        return (x[0], x[1])

    def flatten(self, x):
        return (x[0], int(np.prod(x[1:])))

    def linear(self, x, name, relu, transposed=True):
        w = self.params[f"{name}_weight"]
        fout = w.shape[0] if transposed else w.shape[1]
        self.flops += 2 * int(np.prod(x[:-1])) * x[-1] * fout
        return x[:-1] + (fout,)


class TorchGraph:
    """PyTorch eager: torch.nn.functional calls on torch tensors holding the same weights."""

    def __init__(self, params):
        import torch

        self.torch = torch
        self.F = torch.nn.functional
        self.p = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in params.items()}

    def conv(self, x, name, cin, cout, k, stride=1, pad=0, groups=1, bias=False, bn=False, act=None):
        p = self.p
        y = self.F.conv2d(x, p[f"{name}_weight"], p.get(f"{name}_bias") if bias else None, stride=stride,
                          padding=pad, groups=groups)
        if bn:
            y = self.F.batch_norm(y, p[f"{name}_bn_mean"], p[f"{name}_bn_var"], p[f"{name}_bn_gamma"],
                                  p[f"{name}_bn_beta"], training=False, eps=1e-5)
        if act == "relu":
            y = self.F.relu(y)
        elif act == "relu6":
            y = self.F.relu6(y)
        return y

    def max_pool(self, x, k, s, p):
        return self.F.max_pool2d(x, k, s, p)

    def add(self, a, b):
        return a + b

    def relu(self, x):
        return self.F.relu(x)

    def global_avg_pool(self, x):
        return x.mean(dim=(2, 3))

    def flatten(self, x):
        return x.flatten(1)

    def linear(self, x, name, relu, transposed=True):
        if not transposed and f"{name}_weight_t" not in self.p:  # (in, out) -> (out, in), once
            self.p[f"{name}_weight_t"] = self.p[f"{name}_weight"].t().contiguous()
        w = self.p[f"{name}_weight" if transposed else f"{name}_weight_t"]
        y = self.F.linear(x, w, self.p[f"{name}_bias"])
        return self.F.relu(y) if relu else y


class OnnxGraph:
    """Builds an ONNX model (opset 17) node by node; weights become initializers."""

    def __init__(self, params):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.params = params
        self.nodes, self.inits, self.used = [], [], set()
        self.count = 0

    def _name(self, prefix):
        self.count += 1
        return f"{prefix}_{self.count}"

    def _init(self, name, value=None):
        if name not in self.used:
            array = self.params[name] if value is None else value
            self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(array), name))
            self.used.add(name)
        return name

    def _node(self, op, inputs, **attrs):
        out = self._name(op.lower())
        self.nodes.append(self.helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(self, x, name, cin, cout, k, stride=1, pad=0, groups=1, bias=False, bn=False, act=None):
        inputs = [x, self._init(f"{name}_weight")] + ([self._init(f"{name}_bias")] if bias else [])
        y = self._node("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)
        if bn:
            y = self._node("BatchNormalization", [y] + [self._init(f"{name}_bn_{p}") for p in ("gamma", "beta", "mean", "var")],
                           epsilon=1e-5)
        if act == "relu":
            y = self._node("Relu", [y])
        elif act == "relu6":
            lo = self._init("relu6_min", np.array(0, np.float32))
            hi = self._init("relu6_max", np.array(6, np.float32))
            y = self._node("Clip", [y, lo, hi])
        return y

    def max_pool(self, x, k, s, p):
        return self._node("MaxPool", [x], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)

    def add(self, a, b):
        return self._node("Add", [a, b])

    def relu(self, x):
        return self._node("Relu", [x])

    def global_avg_pool(self, x):
        return self._node("Flatten", [self._node("GlobalAveragePool", [x])], axis=1)

    def flatten(self, x):
        return self._node("Flatten", [x], axis=1)

    def linear(self, x, name, relu, transposed=True):
        y = self._node("Gemm", [x, self._init(f"{name}_weight"), self._init(f"{name}_bias")], transB=int(transposed))
        return self._node("Relu", [y]) if relu else y

    def model(self, input_shape, output):
        from onnx import TensorProto

        h = self.helper
        graph = h.make_graph(self.nodes, "bench", [h.make_tensor_value_info("data", TensorProto.FLOAT, list(input_shape))],
                             [h.make_tensor_value_info(output, TensorProto.FLOAT, None)], self.inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="byoc-hetero bench")
        model.ir_version = 8
        return model


def gflop(name, params, input_shape) -> float:
    """GFLOP of one inference: convolutions and linear layers, 2 per multiply-add."""
    g = FlopGraph(params)
    PROGRAMS[name](g, tuple(input_shape))
    return g.flops / 1e9
