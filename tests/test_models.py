"""End to end: each workload, offloaded vs the llvm-only build of the same module."""

from __future__ import annotations

import pytest
from conftest import TOLERANCE, offload_and_compare

import byoc_hetero as bh
from byoc_hetero.timing import random_inputs, relative_error


def test_small_convnet():
    mod, params = bh.models.small_convnet(batch=2)
    res = offload_and_compare(mod, params)
    # one region: 3 convs, the max-pool, the flatten+dense and the dense; nothing left on llvm
    assert res.profile.regions["byoc_hetero"] == 1
    assert res.profile.composites["byoc_hetero"] == 6
    assert "llvm" not in res.profile.counts


@pytest.mark.parametrize("batch", [1, 8])
def test_mlp(batch):
    mod, params = bh.models.mlp(batch=batch)
    res = offload_and_compare(mod, params)
    assert res.profile.regions["byoc_hetero"] == 1  # the whole MLP is one region
    assert res.profile.composites["byoc_hetero"] == 3
    assert "llvm" not in res.profile.counts


def test_mlp_with_weights_as_runtime_inputs():
    """No bind_params: weights reach the region as inputs on every call and are still right."""
    mod, params = bh.models.mlp(batch=2, features=64, hidden=(32,), num_classes=8)
    res = offload_and_compare(mod, params, bind=False)
    assert res.profile.regions["byoc_hetero"] == 1


def test_vgg11_reduced():
    mod, params = bh.models.vgg11(image_size=32, fc_width=64)
    inputs = random_inputs(mod, params)
    res = offload_and_compare(mod, params, inputs=inputs)
    # the full-size test's torch reference computes what the llvm-only build does
    assert relative_error(_vgg11_in_torch(params)(inputs), res.want) <= TOLERANCE
    # the whole network is one region: 8 convs, 5 max-pools, 3 dense (the flatten fused into fc1)
    assert res.profile.regions["byoc_hetero"] == 1
    assert res.profile.composites["byoc_hetero"] == 16
    assert "llvm" not in res.profile.counts


def test_resnet18_reduced():
    mod, params = bh.models.resnet18(image_size=64, num_classes=10)
    res = offload_and_compare(mod, params)
    # 20 convs (3 downsample; residual add + relu fused into the second conv of each block),
    # the max-pool, the global average pool and the fc: one region
    assert res.profile.composites["byoc_hetero"] == 23
    assert res.profile.counts["byoc_hetero"]["nn.conv2d"] == 20
    assert res.profile.regions["byoc_hetero"] == 1 and "llvm" not in res.profile.counts


def _vgg11_in_torch(params):
    """VGG-11 as ``bh.models.vgg11`` writes it (conv + bias + ReLU, 2x2 max-pools, flatten, linear layers with
    (out, in) weights), computed by torch from the same weights: the full-size reference, in place of the
    llvm-only build (TVM's untuned CPU schedules for 224x224 convs and a 25088-wide dense: the test took 42 s
    in session 12's full run, the suite's 18th slowest)."""
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    w = {name: torch.from_numpy(value) for name, value in params.items()}

    def forward(inputs):
        y, n = torch.from_numpy(inputs[0]), 0
        with torch.no_grad():
            for item in bh.models.VGG11_LAYERS:
                if item == "M":
                    y = functional.max_pool2d(y, 2, 2)
                else:
                    n += 1
                    y = functional.relu(functional.conv2d(y, w[f"conv{n}_weight"], w[f"conv{n}_bias"], padding=1))
            y = y.flatten(1)
            for fc in ("fc1", "fc2", "fc3"):
                y = functional.linear(y, w[f"{fc}_weight"], w[f"{fc}_bias"])
                y = functional.relu(y) if fc != "fc3" else y
        return y.numpy()
    return forward


def test_vgg11_full_size():
    mod, params = bh.models.vgg11()
    res = offload_and_compare(mod, params, reference=_vgg11_in_torch(params))
    assert res.profile.regions["byoc_hetero"] == 1


def test_resnet18_full_size():
    mod, params = bh.models.resnet18()
    res = offload_and_compare(mod, params)
    assert res.profile.counts["byoc_hetero"]["nn.conv2d"] == 20
