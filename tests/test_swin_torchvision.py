"""torchvision's Swin-T and Swin-V2-T (small configs) through both import paths vs torch eager.

Issue 39 item 1: torchvision's Swin builds its shifted-window attention masks from zeros in every
forward (``full`` + ``slice_scatter`` from torch.export; ``strided_slice`` + ``scatter_nd`` + ``where``
from the default ONNX exporter), Swin-V2 computes its continuous position bias with a small MLP on a
constant table (``gather_nd``), zeroes the K third of its qkv bias (``full_like`` + ``slice_scatter``)
and clamps its cosine attention norms with ``Clip`` (which TVM's importer writes as TE ``maximum`` of
a NaN-guarded bound: ``where(isnan(eps), -inf, eps)``) and divides by the norms expanded to Q's / K's
shape (no ``broadcast_to`` copy may be left: :mod:`byoc_hetero.passes.drop_needless_broadcasts`). All of it depends on constants alone:
:mod:`byoc_hetero.passes.fold_weight_subgraphs` folds it at bind time and
:mod:`byoc_hetero.passes.te_clips` turns the Clip back into a ``clip`` the rules read; the pad of a token grid that is not a multiple of the window is
the runtime's ``pad`` node (:mod:`byoc_hetero.passes.te_pads` on the ONNX path). Each model must
be one region with nothing left on llvm, and within 1e-4 (relative) of torch.

Needs torchvision (imported with its C++ operators stubbed out, as bench/zoo_models.py does) and, for
the default exporter, onnxscript.
"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

import byoc_hetero as bh

torch = pytest.importorskip("torch")
for _name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_name, types.ModuleType(_name))  # the models never call torchvision's C++ ops
pytest.importorskip("torchvision")

from torchvision.models.swin_transformer import (  # noqa: E402
    PatchMergingV2,
    SwinTransformer,
    SwinTransformerBlockV2,
)

TOLERANCE = 1e-4
#: 32x32 image, patch 4: 8x8 tokens in windows of 4; one stage of two blocks, the second shifted by 2
#: (the masks); patch merging is Hugging Face Swin's part of tests/test_zoo_models.py. 40x40: 10x10
#: tokens, which torchvision pads on H and W of [N, H, W, C] to 12x12 before each window attention (as
#: full-size Swin-V2-T's window 8 on 28x28 / 14x14 / 7x7 grids): the runtime's ``pad`` node
IMAGES = (32, 40)


def _swin(version: str) -> torch.nn.Module:
    torch.manual_seed(0)
    extra = {"block": SwinTransformerBlockV2, "downsample_layer": PatchMergingV2} if version == "v2" else {}
    model = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2], num_heads=[2], window_size=[4, 4],
                            num_classes=10, **extra).eval()
    with torch.no_grad():  # random, not-trivial norm affines and position bias tables
        for name, p in model.named_parameters():
            if "norm" in name or "relative_position_bias_table" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _import(model, x, path, tmp_path):
    if path == "from_torch":
        return bh.from_torch(model, (x,))
    pytest.importorskip("onnxscript", reason="torch.onnx.export's default (dynamo) exporter needs onnxscript")
    onnx_path = str(tmp_path / "swin.onnx")
    torch.onnx.export(model, (x,), onnx_path, input_names=["x"], output_names=["y"])
    return bh.from_onnx(onnx_path)


@pytest.mark.parametrize("path", ["from_torch", "from_onnx_dynamo"])
@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvision_swin_is_one_region_with_nothing_on_llvm(version, image, path, tmp_path):
    import tvm
    from tvm import relax

    model = _swin(version)
    x = torch.randn(1, 3, image, image, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x).numpy()
    mod, params = _import(model, x, path, tmp_path)
    part = bh.partition(mod, params)
    rep = bh.report(part)
    assert len(rep.regions) == 1, f"Swin-{version} via {path}: {len(rep.regions)} regions\n{rep}"
    assert not rep.fallbacks, f"Swin-{version} via {path}: left on llvm\n{rep}"
    ex = relax.build(part, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    regions = bh.codegen.region_modules(ex)
    for region in regions:
        region["set_profiling"](True)
    out = vm["main"](tvm.runtime.tensor(x.numpy()))
    ops = [st["op"] for r in regions for st in json.loads(str(r["get_profile"]())) if st["phase"] == "run"]
    # Swin-V2's F.normalize of Q and K (x / norm.expand_as(x)): the divide broadcasts the norms itself
    assert "broadcast_to" not in ops, f"Swin-{version} via {path}: {ops.count('broadcast_to')} broadcast_to copies"
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    assert got.shape == want.shape
    err = float(np.max(np.abs(got.astype("float64") - want)) / np.max(np.abs(want)))
    assert err <= TOLERANCE, f"Swin-{version} via {path}: relative error {err:.2e} > {TOLERANCE}"
