"""Video models' 3-D ops (issue 39 item 3): a small R3D-style network (3-D convolutions with batch
norm, ReLU and a residual, 3-D max / average / adaptive pooling) through ``bh.from_torch`` and
``bh.from_onnx`` of the file torch's default exporter writes (and the TorchScript exporter's), against
torch: one region, nothing on llvm, every conv3d a ``conv2d`` node over rank-5 tensors."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero._relax import region_graph_json
from model_paths import PATHS, one_region

torch = pytest.importorskip("torch")
nn = torch.nn


class BasicBlock3d(nn.Module):
    """R3D-18's basic block: two 3x3x3 convs with batch norm, the input added before the last ReLU."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv3d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm3d(channels)
        self.conv2, self.bn2 = nn.Conv3d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm3d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class TinyR3D(nn.Module):
    """R3D-18's stem (3x7x7, stride 1x2x2), a max pool, a basic block, a strided 1x1x1 projection, an
    average pool and the classifier's adaptive pool + linear, at a few channels."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 8, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False),
                                  nn.BatchNorm3d(8), nn.ReLU())
        self.pool = nn.MaxPool3d(3, stride=2, padding=1)
        self.block = BasicBlock3d(8)
        self.down = nn.Conv3d(8, 16, 1, stride=2)
        self.avg = nn.AvgPool3d(2, stride=1)
        self.head = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.block(self.pool(self.stem(x)))
        x = self.avg(torch.relu(self.down(x)))
        return self.fc(torch.flatten(self.head(x), 1))


@pytest.fixture(scope="module")
def r3d():
    torch.manual_seed(0)
    model = TinyR3D().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm3d):  # statistics that make the folded batch norms matter
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(1, 3, 8, 32, 32)
    with torch.no_grad():
        want = model(x).numpy()
    return model, x, want


@pytest.mark.parametrize("path", PATHS)
def test_r3d_block_is_one_region_and_matches_torch(r3d, path, tmp_path):
    model, x, want = r3d
    part = one_region(model, (x,), path, tmp_path)
    graphs = [region_graph_json(m) for m in part.attrs["external_mods"]]
    ranks = {(n["op"], len(g["tensors"][n["inputs"][0]]["shape"])) for g in graphs for n in g["nodes"]}
    assert {("conv2d", 5), ("pool2d", 5)} <= ranks
    vm = relax.VirtualMachine(relax.build(part, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def _conv3d_document(attrs: dict, out_shape: list[int]) -> str:
    """A region of one conv2d node over rank-5 tensors (data and weight passed at run time)."""
    import json

    return json.dumps({
        "format": "byoc_hetero.region", "version": 4, "symbol": "conv3d_doc",
        "tensors": [{"shape": [1, 2, 3, 6, 6]}, {"shape": [4, 2, 3, 3, 3]}, {"shape": out_shape}],
        "inputs": [0, 1], "outputs": [2],
        "nodes": [{"op": "conv2d", "inputs": [0, 1], "output": 2, "attrs": attrs}],
    })


def test_conv3d_document_checks_its_spatial_attrs():
    """Rank-5 data takes three entries per spatial attr (six paddings); a 2-D attr is an error naming it,
    and the output shape is checked over all three spatial dims."""
    plan = bh._C.plan_region(_conv3d_document({"padding": [1, 1, 1, 1, 1, 1], "strides": [1, 2, 2]}, [1, 4, 3, 3, 3]))
    assert plan
    with pytest.raises(ValueError, match="padding"):
        bh._C.plan_region(_conv3d_document({"padding": [1, 1, 1, 1]}, [1, 4, 3, 6, 6]))
    with pytest.raises(ValueError, match=r"\[1,4,1,4,4\]|\[1, 4, 1, 4, 4\]"):
        bh._C.plan_region(_conv3d_document({}, [1, 4, 3, 6, 6]))
