"""End to end: each workload, offloaded vs the llvm-only build of the same module."""

from __future__ import annotations

import pytest
from conftest import offload_and_compare

import byoc_hetero as bh


def test_small_convnet():
    mod, params = bh.models.small_convnet(batch=2)
    res = offload_and_compare(mod, params)
    assert res.profile.regions["byoc_hetero"] == 2
    assert res.profile.composites["byoc_hetero"] == 5


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
    res = offload_and_compare(mod, params)
    # [c1] [c2] [c3 c4] [c5 c6] [c7 c8] [fc1 fc2 fc3]: max-pools and the flatten stay on llvm
    assert res.profile.regions["byoc_hetero"] == 6
    assert res.profile.composites["byoc_hetero"] == 11
    assert res.profile.counts["llvm"] == {"nn.max_pool2d": 5, "reshape": 1}


def test_resnet18_reduced():
    mod, params = bh.models.resnet18(image_size=64, num_classes=10)
    res = offload_and_compare(mod, params)
    assert res.profile.composites["byoc_hetero"] == 21  # 20 convs (3 downsample) + fc
    assert res.profile.counts["byoc_hetero"]["nn.conv2d"] == 20


def test_vgg11_full_size():
    mod, params = bh.models.vgg11()
    res = offload_and_compare(mod, params)
    assert res.profile.regions["byoc_hetero"] == 6


def test_resnet18_full_size():
    mod, params = bh.models.resnet18()
    res = offload_and_compare(mod, params)
    assert res.profile.counts["byoc_hetero"]["nn.conv2d"] == 20
