"""bh.report: counts, regions, fallback reasons, and the picture."""

from __future__ import annotations

import shutil

import pytest

import byoc_hetero as bh


@pytest.fixture(scope="module")
def resnet_report():
    """ResNet-18 partitioned with the pooling rules removed: pools stay on llvm and split regions."""
    from conftest import saved_rules

    from byoc_hetero.rules import pattern_rules

    mod, params = bh.models.resnet18(image_size=32, num_classes=10)
    with saved_rules():
        for rule in pattern_rules("byoc_hetero"):
            if "pool" in rule.name:
                bh.unregister_pattern("byoc_hetero", rule.name)
        return bh.report(bh.partition(mod, params))


def test_counts_and_regions(resnet_report):
    rep = resnet_report
    assert rep.profile.counts["byoc_hetero"]["nn.conv2d"] == 20
    assert sum(r.ops["nn.conv2d"] for r in rep.regions) == 20
    assert len(rep.regions) == rep.profile.regions["byoc_hetero"] == 3  # conv1 | 8 blocks | fc
    first = rep.regions[0]
    assert first.inputs == ["float32[1, 3, 32, 32]"] and first.outputs == ["float32[1, 64, 16, 16]"]
    assert first.rules == ["onednn.conv2d_bias_relu"]
    # conv1: 64 x 16 x 16 outputs, each 3 x 7 x 7 multiply-adds
    assert first.flops == 2 * 64 * 16 * 16 * 3 * 7 * 7
    assert rep.offloaded_flops == sum(r.flops for r in rep.regions)


def test_every_llvm_op_has_a_reason(resnet_report):
    rep = resnet_report
    assert len(rep.fallbacks) == rep.profile.total("llvm")
    assert {f.op: f.reason for f in rep.fallbacks} == {"nn.max_pool2d": "no offload rule matches it",
                                                       "nn.adaptive_avg_pool2d": "no offload rule matches it"}


def test_check_failure_reason_names_the_rule():
    from conftest import graph
    from tvm import relax

    mod = graph({"x": (1, 4, 8, 8), "w": (4, 4, 3, 3)}, lambda e, x, w: e(relax.op.nn.conv2d(x, w)),
                dtype="float16")
    (fallback,) = bh.report(bh.partition(mod)).fallbacks
    assert fallback.op == "nn.conv2d" and fallback.rule == "onednn.conv2d"
    assert "float16" in fallback.reason


def test_a_partition_run_starts_with_no_earlier_reasons():
    """The reasons on the module partition is given (an earlier run's, kept as a module attribute)
    are not this run's: the float16 conv's reason is its own check's, and the stale one is gone."""
    from conftest import graph
    from tvm import relax

    from byoc_hetero.rules import DECISIONS_ATTR

    mod = graph({"x": (1, 4, 8, 8), "w": (4, 4, 3, 3)}, lambda e, x, w: e(relax.op.nn.conv2d(x, w)),
                dtype="float16")
    (fresh,) = bh.report(bh.partition(mod)).fallbacks
    stale = {"rule": "earlier", "op": "relax.nn.conv2d", "reason": "an earlier run's reason", "value": fresh.value}
    part = bh.partition(mod.with_attr(DECISIONS_ATTR, [stale]))
    rules = [r.rule for r in bh.rules.rejections(part)]
    assert "earlier" not in rules and "onednn.conv2d" in rules, rules
    (fallback,) = bh.report(part).fallbacks
    assert fallback.rule == "onednn.conv2d" and "float16" in fallback.reason


def test_text_and_dot(resnet_report, tmp_path):
    text = str(resnet_report)
    assert "onednn" in text and "left on llvm" in text and "MFLOP" in text
    dot = resnet_report.to_dot()
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    # one fill colour per target, every region node drawn
    assert dot.count("onednn region") == len(resnet_report.regions)
    colours = {line.split('fillcolor="')[1].split('"')[0] for line in dot.splitlines() if "fillcolor" in line}
    assert len(colours) == 2
    assert resnet_report.render(tmp_path / "g.dot").read_text() == dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz 'dot' is not installed")
def test_render_svg_with_dot(resnet_report, tmp_path):
    out = resnet_report.render(tmp_path / "g.svg", engine="dot")
    assert out.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_render_svg_and_html_need_no_graphviz(resnet_report, tmp_path, monkeypatch):
    """issue 28: pip only (tests/test_picture.py checks the drawing itself)"""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert resnet_report.render(tmp_path / "g.svg").read_text().startswith("<svg")
    assert "<svg" in resnet_report.render(tmp_path / "g.html").read_text()


def test_render_without_graphviz_says_what_to_do(resnet_report, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(bh.ByocError, match="graphviz"):
        resnet_report.render(tmp_path / "g.png")


def test_report_says_which_conv_algorithm_ran_and_why(monkeypatch):
    """A 1024-channel 3x3 conv runs direct under "auto" for float32 accuracy (and the report says
    so); a 32-channel one at the same size runs Winograd; BYOC_HETERO_CONV_ALGO=winograd runs both so."""
    torch = pytest.importorskip("torch")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1024, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 32, 3, padding=1)).eval()
    x = torch.randn(1, 1024, 20, 20)
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "auto")
    (region,) = bh.report(bh.partition(*bh.from_torch(model, (x,)))).regions
    assert region.algorithms.startswith("winograd 1, direct 1 (1 direct by 'auto' for float32 accuracy"), region.algorithms
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "winograd")
    rep = bh.report(bh.partition(*bh.from_torch(model, (x,))))
    assert rep.regions[0].algorithms == "winograd 2"
    assert "conv2d algorithms: winograd 2" in str(rep)


def test_conv_algorithm_line_counts_1d_and_3d_convs_as_direct():
    """conv1d and conv3d also run as the conv2d node (3-D / 5-D weights); Winograd is 2-D only, so
    the report counts them direct (it once unpacked every weight as 4-D and raised on a conv1d)."""
    torch = pytest.importorskip("torch")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv1d(16, 16, 3, padding=1)).eval()
    (region,) = bh.report(bh.partition(*bh.from_torch(model, (torch.randn(1, 16, 40),)))).regions
    assert region.algorithms == "direct 2", region.algorithms
