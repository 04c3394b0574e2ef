"""The import paths a model test runs a torch module through, by name."""

from __future__ import annotations

import os

import pytest
from tvm import relax

import byoc_hetero as bh

PATHS = ("from_torch", "from_onnx", "from_onnx_torchscript")
"""``bh.from_torch`` (torch.export); ``bh.from_onnx`` of the file torch's default (dynamo) exporter
writes; ``bh.from_onnx`` of the TorchScript exporter's file (``dynamo=False``)."""


def import_model(model, inputs: tuple, path: str, tmp_path) -> tuple:
    """``(mod, params)`` of ``model`` called on ``inputs`` through the import path ``path`` (one of
    :data:`PATHS`); ONNX files are written under ``tmp_path``. Skips where the default exporter's
    ``onnxscript`` is missing."""
    if path == "from_torch":
        return bh.from_torch(model, inputs)
    import torch

    if path == "from_onnx":
        pytest.importorskip("onnxscript")
    file = os.path.join(tmp_path, "model.onnx")
    names = [f"input_{i}" for i in range(len(inputs))]
    torch.onnx.export(model, inputs, file, input_names=names, output_names=["output"], dynamo=path == "from_onnx")
    return bh.from_onnx(file)


def one_region(model, inputs: tuple, path: str, tmp_path, nothing_on_llvm: bool = True):
    """``model`` imported through ``path`` (:func:`import_model`) and partitioned; asserts it is one
    region and, with ``nothing_on_llvm``, that no op stays on llvm. Returns the partitioned module."""
    mod, params = import_model(model, inputs, path, tmp_path)
    part = bh.partition(mod, params)
    report = bh.report(part)
    assert len(report.regions) == 1, report
    assert not (nothing_on_llvm and report.fallbacks), report
    return part


def first_output(model, **kwargs):
    """A torch module calling ``model(*inputs, **kwargs)`` and returning its first output (what an
    exporter sees of a transformers model called with ``return_dict=False``)."""
    import torch

    class FirstOutput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return self.model(*inputs, **kwargs)[0]

    return FirstOutput().eval()


def dataflow_module(params, body):
    """``main(params)`` whose dataflow block is what ``body(bb, *params)`` emits (its last value returned)."""
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def run_profiled(part, inputs: list) -> tuple:
    """The partitioned module's output on ``inputs`` (numpy arrays) and its regions' run steps (one
    call, each a dict with ``op``, ``impl``, ``label``, ``layouts``)."""
    import json

    import tvm

    ex = relax.build(part, target="llvm")
    regions = bh.codegen.region_modules(ex)
    for region in regions:
        region["set_profiling"](True)
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x) for x in inputs])
    steps = [s for r in regions for s in json.loads(str(r["get_profile"]())) if s["phase"] == "run"]
    return out.numpy(), steps
