"""End to end: each workload, offloaded vs the llvm-only build of the same module."""

from __future__ import annotations

import pytest
from conftest import offload_and_compare

import byoc_hetero as bh


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
    res = offload_and_compare(mod, params)
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


def test_vgg11_full_size():
    mod, params = bh.models.vgg11()
    res = offload_and_compare(mod, params)
    assert res.profile.regions["byoc_hetero"] == 1


def test_resnet18_full_size():
    mod, params = bh.models.resnet18()
    res = offload_and_compare(mod, params)
    assert res.profile.counts["byoc_hetero"]["nn.conv2d"] == 20
