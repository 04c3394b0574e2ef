"""``bh.tune`` with precisions f32 / bf16 on the zoo's model families (issue 35, item 4).

The zoo's small configs (``bench/zoo_models.py``, ``small=True``), imported by ``bh.from_torch``: a CNN
(ResNet-50's bottlenecks) and a transformer (BERT: attention, which the float32 partition fuses at these
sizes with BYOC_HETERO_ATTENTION=fused, as it does at BERT-base's by default). Each takes about 40 s of
CPU (most of it the tuner's candidate builds), so the other families (ConvNeXt, ViT, the decoders) are
left to bench/tune_precision.py. ``bh.tune`` must
finish on each, return a module whose output matches the default partition's within the tolerance, and
report a decision for every conv2d / dense / matmul it found. On a CPU without native bf16 the tuner skips
the bf16 candidates with a note; ``bf16_native`` makes it build them anyway (the runtime then computes the
bf16 nodes in float32): what is checked is that every plan it builds is a valid partition of the model,
the failure of issue 35 (BERT-base: ``RuleError ... is a reshape``). Tiny timing budgets (one guard
round, two repeats): speed is the benchmark's (bench/tune_precision.py), not this test's.

With ``"int8"`` among the precisions (f32 / bf16 / int8) the tuner also quantizes layer groups
(``bh.quantize`` on the calibration inputs): on ResNet-50 (conv layer groups), BERT (dense /
matmul groups) and ConvNeXt-T (whose float32 partition fuses its layers into nodes the int8 level
cannot name: it keeps the default for them and the report says so, issue 35's bad-input rule). The
codegen and algorithm levels run in every ``bh.tune`` call. bench/tune_precision.py ``--model
zoo:NAME`` runs the full sizes. The other families' small configs (ViT, GPT-2, Whisper's encoder,
wav2vec2) were tuned with f32 / bf16 / int8 outside the suite in session 8 (minutes each on a loaded
2-core machine); Whisper's conv1d made the algorithm level raise, now tests/test_tune.py's
test_conv1d_sites_keep_the_default_and_say_why.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import byoc_hetero as bh

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from zoo_models import build  # noqa: E402

FAMILIES = ("resnet50", "bert_base")
INT8_FAMILIES = ("resnet50", "bert_base", "convnext_tiny")


@pytest.fixture
def bf16_native(monkeypatch):
    from byoc_hetero.backends.onednn import precision

    monkeypatch.setattr(precision, "effective_precision", lambda p: (p, ""))


def _calibration(zm, n: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(3)
    samples = []
    for _ in range(n):
        sample = []
        for t in zm.inputs:
            x = t.numpy()
            sample.append(rng.standard_normal(x.shape).astype(x.dtype) if x.dtype == np.float32 else x)
        samples.append(sample)
    return samples


def _run(module, sample):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(module, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in sample])
    return (out if hasattr(out, "numpy") else out[0]).numpy()


@pytest.mark.parametrize("name", FAMILIES)
def test_tune_f32_bf16_on_a_zoo_family_never_raises(name, bf16_native, monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_ATTENTION", "fused")  # the small configs' rows are short: fuse anyway
    zm = build(name, small=True)
    mod, params = bh.from_torch(zm.module, zm.inputs)
    calibration = _calibration(zm, 3)
    tuned, report = bh.tune(mod, params, precisions=("f32", "bf16"), tolerance=1e-2, calibration=calibration,
                            guard_rounds=1, repeat=2)
    rep = report.precision
    assert rep is not None and rep.units, str(report)
    assert not any("could not be applied" in n for n in rep.notes), str(report)
    assert rep.plan("all bf16") is not None, str(report)
    want = _run(bh.partition(mod, params), calibration[0])
    got = _run(tuned, calibration[0])
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= 1e-2, (name, err, str(report))


@pytest.mark.parametrize("name", INT8_FAMILIES)
def test_tune_f32_bf16_int8_on_a_zoo_family_never_raises(name, bf16_native, monkeypatch):
    """f32 / bf16 / int8 with the codegen and algorithm levels: never raises; the returned module is
    the guard's choice (tuned only where measured faster than the default), within the tolerance of
    the default partition; a level that cannot apply its decision says which nodes and why."""
    monkeypatch.setenv("BYOC_HETERO_ATTENTION", "fused")
    zm = build(name, small=True)
    mod, params = bh.from_torch(zm.module, zm.inputs)
    calibration = _calibration(zm, 3)
    tolerance = 5e-2
    tuned, report = bh.tune(mod, params, precisions=("f32", "bf16", "int8"), tolerance=tolerance,
                            calibration=calibration, guard_rounds=1, repeat=2)
    rep = report.precision
    assert rep is not None and rep.plans, str(report)
    assert report.kept in ("default", "tuned"), str(report)
    if report.kept == "tuned":  # never slower than the default, as measured side by side
        assert report.tuned.median_s < report.default.median_s, str(report)
    # int8 was measured (an "all int8" plan) or the report says why it was not (never an exception)
    assert rep.plan("all int8") is not None or any(n.startswith("int8 candidates skipped: ") for n in rep.notes), \
        str(report)
    want = _run(bh.partition(mod, params), calibration[0])
    got = _run(tuned, calibration[0])
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= tolerance, (name, err, str(report))
