"""Issue 28: what a newcomer tripped over, each fixed and kept fixed.

The exporter dependency in the extras; rules for an undeclared target; ``bench`` on a dynamic model;
one-line usage errors; a text file named ``.npy``; a demo whose output shows what each stage changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

import byoc_hetero as bh

ROOT = Path(__file__).resolve().parent.parent


def cli(*args):
    """``byoc-hetero *args`` run in this process from the repository root (conftest.run_cli: the function
    the entry point calls, output captured, no fresh interpreter's imports); tests/test_cli.py runs the real
    entry point in a subprocess for usage errors and a command end to end."""
    from conftest import run_cli

    return run_cli(*args, cwd=ROOT)


def _one_line(out, code: int, *needles: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, out.stderr
    assert len(lines) == 1 and lines[0].startswith("byoc-hetero: error: "), out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- 1. torch.onnx.export's default exporter needs onnxscript: the extras that export install it ---------

def test_extras_that_export_install_onnxscript():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("test", "bench", "zoo"):
        names = {req.split("[")[0].split("=")[0].split(">")[0].strip() for req in extras[extra]}
        assert "torch==2.13.0" in extras[extra] and "onnxscript" in names, extra


def test_default_torch_onnx_export_imports_and_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 10)).eval()
    x = torch.randn(1, 3, 8, 8)
    path = tmp_path / "net.onnx"
    torch.onnx.export(net, (x,), str(path))  # torch 2.13's default: the dynamo exporter (onnxscript)
    part = bh.partition(*bh.from_onnx(path))
    assert bh.op_profile(part).regions["byoc_hetero"] >= 1
    got = relax.VirtualMachine(relax.build(part, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    with torch.no_grad():
        np.testing.assert_allclose(got.numpy(), net(x).numpy(), rtol=1e-4, atol=1e-4)


# -- 2. rules for an undeclared target: bh.RuleError when registered, or before TVM's codegen lookup ------

def test_rule_for_an_undeclared_target_is_rejected_when_registered(restore_rules):
    x, w = wildcard(), wildcard()
    with pytest.raises(bh.RuleError, match=r"rule mybackend.dense: target 'mybackend' is not declared.*"
                                           r"register_target\('mybackend'"):
        bh.register_pattern("mybackend", "dense", is_op("relax.matmul")(x, w), {"data": x, "weight": w})
    with pytest.raises(bh.RuleError, match="op rule mybackend.relax.matmul: target 'mybackend' is not declared"):
        bh.op_rule("relax.matmul", target="mybackend")(lambda m: True)
    assert "mybackend" not in bh.rules.targets()  # nothing half-registered


def test_target_without_codegen_fails_at_partition_with_a_rule_error(restore_rules):
    x, w = wildcard(), wildcard()
    bh.register_target("nocodegen")  # declared, but no codegen given and none registered elsewhere
    bh.register_pattern("nocodegen", "dense", is_op("relax.matmul")(x, w), {"data": x, "weight": w})
    mod, params = bh.models.mlp(batch=1, features=16, hidden=(8,))
    with pytest.raises(bh.RuleError, match="target 'nocodegen' has no codegen"):
        bh.partition(mod, params, target=["nocodegen", "byoc_hetero"])
    # the same target with a codegen partitions and runs, against the llvm-only build
    bh.register_target("nocodegen", codegen="byoc_hetero")
    part = bh.partition(mod, params, target=["nocodegen", "byoc_hetero"])
    assert bh.op_profile(part).regions["nocodegen"] >= 1
    x = np.random.default_rng(0).standard_normal((1, 16)).astype("float32")
    run = lambda m: relax.VirtualMachine(relax.build(m, target="llvm"), tvm.cpu())["main"](  # noqa: E731
        tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(run(part), run(bh.bind_params(mod, params)), rtol=1e-5, atol=1e-5)


# -- 3. bench on a model with a dynamic batch ------------------------------------------------------------

@pytest.fixture(scope="module")
def dynamic_cnn(tmp_path_factory):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU()).eval()
    path = tmp_path_factory.mktemp("dyn") / "cnn.onnx"
    torch.onnx.export(net, (torch.randn(2, 3, 8, 8),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}, dynamo=False, opset_version=17)
    return path


def test_bench_inputs_of_a_dynamic_model_take_the_declared_lower_end(dynamic_cnn, capsys):
    from byoc_hetero.cli import _bench_inputs

    mod, params = bh.from_onnx(dynamic_cnn, dim_ranges={"N": (3, 16)})
    (x,) = _bench_inputs(mod, params, {})
    assert x.shape == (3, 3, 8, 8) and x.dtype == np.float32
    assert "N=3" in capsys.readouterr().err
    mod, params = bh.from_onnx(dynamic_cnn)  # no declared range: 1
    assert _bench_inputs(mod, params, {})[0].shape == (1, 3, 8, 8)
    assert _bench_inputs(mod, params, {"N": 5})[0].shape == (5, 3, 8, 8)
    with pytest.raises(bh.InputError, match="--dim B: no such symbolic dim .*N"):
        _bench_inputs(mod, params, {"B": 2})


def test_cli_bench_runs_a_dynamic_model(dynamic_cnn):
    out = cli("bench", dynamic_cnn, "--repeat", "1", "--dim", "N=2")
    assert out.returncode == 0, out.stderr
    assert "note: symbolic dims timed at N=2" in out.stderr
    assert "speed-up" in out.stdout
    diff = float(out.stdout.split("max relative difference")[1].strip(" )\n"))
    assert diff < 1e-4


def test_cli_report_renders_svg_and_html_with_pip_only(dynamic_cnn, tmp_path, monkeypatch):
    """issue 28 item 3 from the command line: no graphviz needed (PATH without 'dot', which the command
    looks up with shutil.which on the PATH of the moment)."""
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    for name in ("g.svg", "g.html"):
        out = cli("report", dynamic_cnn, "--render", tmp_path / name)
        assert out.returncode == 0, out.stderr
        assert f"picture: {tmp_path / name}" in out.stdout and "<svg" in (tmp_path / name).read_text()


# -- 4. usage errors are one line, like every other error ------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (("frobnicate",), "invalid choice: 'frobnicate'"),
    (("run", "m.onnx"), "the following arguments are required: --input"),
    (("bench", "m.onnx", "--dim", "N=0"), "'N=0' is not NAME=SIZE"),
    (("demo", "--image-size", "100"), "not a positive multiple of 32"),
])
def test_usage_errors_are_one_line(args, needle):
    _one_line(cli(*args), 2, needle)


def test_report_render_that_cannot_be_written_fails_before_any_work(tmp_path, monkeypatch):
    import shutil

    from byoc_hetero import cli as cli_module

    monkeypatch.setattr(shutil, "which", lambda name: None)
    called = []
    monkeypatch.setattr(cli_module, "_load_and_partition", lambda *a: called.append(a))
    for name, needle in (("g.png", "needs graphviz's 'dot' program"), ("g.txt", "write .svg, .html or .dot")):
        with pytest.raises(bh.InputError, match=needle):
            cli_module._cmd_report(type("Args", (), {"render": tmp_path / name, "model": "m.onnx",
                                                     "precision": "f32"})())
    assert called == []


# -- 5. a text file named .npy ---------------------------------------------------------------------------

def test_text_file_named_npy_says_it_is_not_a_npy_file(tmp_path):
    from byoc_hetero.cli import _load_inputs

    bad = tmp_path / "x.npy"
    bad.write_text("1 2 3\n")
    with pytest.raises(bh.InputError, match=r"x.npy' is not a readable .npy file: it does not start with "
                                            r"NumPy's header \(it starts with b'1 2 3\\n'\)"):
        _load_inputs([bad])
    good = tmp_path / "y.npy"
    np.save(good, np.arange(3, dtype="float32"))
    np.testing.assert_array_equal(_load_inputs([good])[0], np.arange(3, dtype="float32"))


# -- 6. the demo shows what each stage changed -----------------------------------------------------------

def test_demo_output_shows_what_each_stage_changed():
    from byoc_hetero.demo import demo

    lines: list[str] = []
    figures = demo(image_size=32, repeat=1, out=lambda text="": lines.extend(str(text).splitlines()))
    text = "\n".join(lines)
    sections = text.split("== after ")[1:]
    assert [s.split(" ", 1)[0] for s in sections] == ["MergeComposite", "AnnotateTarget", "MergeCompilerRegions",
                                                      "PartitionGraph"]
    assert all("changed: " in s for s in sections)
    merge, _, regions, partition = sections
    assert "llvm: ops 49 -> 0" in merge and "composites 0 -> " in merge
    assert "not offloaded yet (0 regions)" in merge  # marked, not offloaded: no bare "onednn: 49 ops"
    assert "onednn: regions 0 -> 1" in regions
    assert "1 region(s) now runtime modules" in partition
    for line in lines:
        if line.startswith("onednn: ") and "ops" in line.split(";")[0] and "->" not in line:
            assert "region" in line, line  # every headline says whether its ops are in regions yet
    assert figures["regions"] == 1 and figures["relative_error"] < 1e-4


def test_profile_changes_lists_moves_per_target():
    mod, params = bh.models.mlp(batch=1, features=16, hidden=(8,))
    m = bh.bind_params(mod, params)
    before = bh.op_profile(m)
    after = bh.op_profile(bh.partition(mod, params))
    changes = after.changes(before)
    assert any(c.startswith("llvm: ops ") and c.split("->")[1].split(";")[0].strip() == "0" for c in changes)
    assert any(c.startswith("onednn: ") and "regions 0 -> 1" in c for c in changes)
    assert after.changes(after) == []
