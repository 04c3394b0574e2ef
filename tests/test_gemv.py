"""The float32 dense of a plan with few rows runs our own GEMV (cpp/kernels/dense_gemv.h) instead of oneDNN's
matmul: one-node dense regions at M = 1..4 on odd N and K, both weight layouts, with bias and residual, against
numpy in float64, on each ISA path (BYOC_HETERO_GEMV_ISA, read when a plan is made), then an activation; more
rows, an activation before a residual sum or BYOC_HETERO_GEMV_ROWS=0 keep oneDNN's matmul, and say so in the plan.
Under ONEDNN_MAX_CPU_ISA=AVX2 (a CPU without AVX-512) with BYOC_HETERO_GEMV_LAYOUT=prefill / rows the module runs again
in a subprocess, the GEMV then reading the prefill inner product's panels of 24 columns (2 threads) or oneDNN's sgemm's
[N, K] rows."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
from conftest import isa_under

from byoc_hetero import _C

create = tvm.get_global_func("byoc_hetero.runtime.create")


def _dense(x: np.ndarray, w: np.ndarray, layout: str, bias=None, residual=None, gate=None,
           **attrs) -> tuple[np.ndarray, list]:
    """Run one dense node (weight and bias constants, data, gate and residual region inputs); its output and
    plan."""
    n = w.shape[0] if layout == "NK" else w.shape[1]
    out_shape = list(x.shape[:-1]) + [n]
    consts = [w] + ([bias] if bias is not None else [])
    tensors = [{"shape": list(x.shape), "dtype": "float32"}]
    tensors += [{"shape": list(c.shape), "dtype": "float32"} for c in consts]
    inputs = [0]
    for extra in (gate, residual):
        if extra is not None:
            tensors.append({"shape": list(extra.shape), "dtype": "float32"})
            inputs.append(len(tensors) - 1)
    tensors.append({"shape": out_shape, "dtype": "float32"})
    node_attrs = {"weight_layout": layout, "has_bias": int(bias is not None),
                  "residual": int(residual is not None)} | ({"has_gate": 1} if gate is not None else {}) | attrs
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "gv", "tensors": tensors, "inputs": inputs,
           "outputs": [len(tensors) - 1],
           "constants": [{"tensor": i + 1, "name": f"gv_c{i}"} for i in range(len(consts))],
           "nodes": [{"op": "dense", "inputs": list(range(len(tensors) - 1)), "output": len(tensors) - 1,
                      "attrs": node_attrs}]}
    mod = create(json.dumps(doc))
    assert mod["__init_gv"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]) == 0
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, np.float32))
    args = [tvm.runtime.tensor(x)] + [tvm.runtime.tensor(e) for e in (gate, residual) if e is not None]
    mod["gv"](*args, out)
    return out.numpy(), list(mod["get_plan"]())


def _reference(x, w, layout, bias=None, residual=None, relu=False, gate=None) -> np.ndarray:
    wk = (w.T if layout == "NK" else w).astype(np.float64)
    y = x.astype(np.float64) @ wk
    if bias is not None:
        y = y + bias.astype(np.float64)
    if relu:
        y = np.maximum(y, 0)
    if gate is not None:
        y = y * gate
    if residual is not None:
        y = y + residual
    return y


def _close(got, want, k):
    # float32 accumulation over K terms: the error grows like sqrt(K) ulps of the dot products' magnitude
    scale = max(float(np.abs(want).max()), 1e-6)
    tol = 4e-7 * scale * max(8.0, np.sqrt(k) * 4)
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= tol, f"max error {err} > {tol} (scale {scale})"
    assert np.isfinite(got).all()


def _best_isa() -> str:
    """What `auto` picks on this CPU (simd_isa.h): AVX-512F, else AVX2 with FMA, else generic."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return "generic"
    return "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "generic"


#: whether oneDNN gives a few-row matmul the BA16a<16-64>b weight copy the GEMV reads (dense_gemv.cc PanelLayout):
#: oneDNN 3.2 does on an AVX-512 ISA; under ONEDNN_MAX_CPU_ISA=AVX2 the weights stay plain
NATIVE_PANELS = _C.isa().startswith("avx512")
#: whether the GEMV runs: on the matmul's panels, or (BYOC_HETERO_GEMV_LAYOUT=prefill or rows, as the process starts)
#: on the prefill inner product's panels or the matmul's rows where the matmul keeps the weights plain; else the
#: matmul keeps every dense (the numerics are checked all the same)
LAYOUT = os.environ.get("BYOC_HETERO_GEMV_LAYOUT") or "prefill"  # unset: prefill (the default, session 17)
MATMUL_PANELS = NATIVE_PANELS or LAYOUT in ("prefill", "rows", "panels")


def _gemv_steps(plan) -> list[str]:
    return [s for s in plan if ": gemv (" in s]


def _gemv_ran(plan, isa: str | None = None) -> bool:
    """Whether the plan runs the GEMV (on ``isa`` where given), where the matmul's weight copy allows it
    (MATMUL_PANELS); elsewhere whether it runs none (oneDNN's matmul)."""
    steps = _gemv_steps(plan)
    if not MATMUL_PANELS:
        return not steps
    if isa == "avx512" and not NATIVE_PANELS:  # panels of 24 or rows: AVX2 code reads them
        isa = "avx2"
    return bool(steps) and (isa is None or (len(steps) == 1 and f"gemv ({isa})" in steps[0]))


def _operands(rng, m, k, n, layout, bias, residual, lead=()):
    x = rng.standard_normal(lead + (m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if layout == "NK" else (k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    r = rng.standard_normal(lead + (m, n)).astype(np.float32) if residual else None
    return x, w, b, r


@pytest.mark.parametrize("isa", ["auto", "avx2", "generic"])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("layout,bias,residual", [("NK", False, False), ("KN", True, False), ("NK", True, True)])
def test_gemv_matches_numpy(monkeypatch, isa, m, layout, bias, residual):
    monkeypatch.setenv("BYOC_HETERO_GEMV_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_GEMV_ROWS", "4")  # the default is 2 (bench/gemv.py): the kernel takes up to 4
    rng = np.random.default_rng(m * 10 + len(isa))
    k, n = 53, 37  # odd: a partial K block of 16, a partial panel
    x, w, b, r = _operands(rng, m, k, n, layout, bias, residual)
    got, plan = _dense(x, w, layout, b, r)
    _close(got, _reference(x, w, layout, b, r), k)
    assert _gemv_ran(plan, _best_isa() if isa == "auto" else isa), plan


@pytest.mark.parametrize("isa", ["auto", "avx2", "generic"])
def test_gemv_many_panels_threaded_3d_data(monkeypatch, isa):
    """Enough work to split the panels across threads; leading data dims flattened into M = 2."""
    monkeypatch.setenv("BYOC_HETERO_GEMV_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_NUM_THREADS", "2")
    rng = np.random.default_rng(7)
    x, w, b, r = _operands(rng, 1, 301, 999, "NK", True, True, lead=(2,))
    got, plan = _dense(x, w, "NK", b, r)
    _close(got, _reference(x, w, "NK", b, r), 301)
    assert _gemv_ran(plan), plan


ACTIVATIONS = {  # float64 references of the activations the tests run
    "relu": lambda y: np.maximum(y, 0),
    "silu": lambda y: y / (1 + np.exp(-y)),
    "gelu_tanh": lambda y: 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3))),
    "sigmoid": lambda y: 1 / (1 + np.exp(-y)),
}


@pytest.mark.parametrize("isa", ["auto", "generic"])
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("m", [1, 2])
def test_gemv_then_activation(monkeypatch, isa, act, m):
    """act(x @ W + bias) without a residual: the GEMV, then oneDNN's eltwise in place (a second step)."""
    monkeypatch.setenv("BYOC_HETERO_GEMV_ISA", isa)
    rng = np.random.default_rng(20 + m)
    x, w, b, _ = _operands(rng, m, 45, 33, "NK", True, False)
    got, plan = _dense(x, w, "NK", b, activation=act)
    _close(got, ACTIVATIONS[act](_reference(x, w, "NK", b)), 45)
    assert _gemv_ran(plan) and (any(f"{act} after the gemv" in s for s in plan) or not MATMUL_PANELS), plan


def test_gemv_residual_then_post_activation_and_clip():
    rng = np.random.default_rng(30)
    x, w, b, r = _operands(rng, 1, 29, 21, "KN", True, True)
    got, plan = _dense(x, w, "KN", b, r, post_activation="silu")
    _close(got, ACTIVATIONS["silu"](_reference(x, w, "KN", b, r)), 29)
    assert _gemv_ran(plan), plan
    got, plan = _dense(x, w, "KN", b, activation="clip", clip=[-0.5, 0.25])
    _close(got, np.clip(_reference(x, w, "KN", b), -0.5, 0.25), 29)
    assert _gemv_ran(plan), plan


def test_more_rows_or_activation_before_residual_keep_onednn(monkeypatch):
    rng = np.random.default_rng(11)
    x, w, b, r = _operands(rng, 5, 40, 24, "NK", True, True)
    for rows in (3, 5):  # more than the default 2
        got, plan = _dense(x[:rows], w, "NK", b)
        _close(got, _reference(x[:rows], w, "NK", b), 40)
        assert not _gemv_steps(plan), plan
    x1, r1 = x[:1], r[:1]
    got, plan = _dense(x1, w, "NK", b, r1, activation="relu")  # relu(x @ W + b) + r: oneDNN's post-op chain
    _close(got, _reference(x1, w, "NK", b, r1, relu=True), 40)
    assert not _gemv_steps(plan), plan
    monkeypatch.setenv("BYOC_HETERO_GEMV_ROWS", "0")
    got, plan = _dense(x1, w, "NK", b)
    _close(got, _reference(x1, w, "NK", b), 40)
    assert not _gemv_steps(plan), plan
    monkeypatch.setenv("BYOC_HETERO_GEMV_ROWS", "8")
    got, plan = _dense(x, w, "NK", b)
    _close(got, _reference(x, w, "NK", b), 40)
    assert _gemv_ran(plan), plan


@pytest.mark.parametrize("isa", ["auto", "generic"])
@pytest.mark.parametrize("m", [1, 2, 5, 70])
@pytest.mark.parametrize("bias,residual,relu", [(False, False, False), (True, True, False), (True, False, True)])
def test_a_gate_multiplies_the_output_before_the_residual(monkeypatch, isa, m, bias, residual, relu):
    """has_gate (a GLU's product, region pass fold_gate_products): act(x @ W + b) * gate + residual, against numpy;
    the GEMV's own loop at 1 and 2 rows without an activation (an activation before the gate keeps oneDNN), oneDNN's
    binary multiply post-op (inner product or matmul) at 5 and 70."""
    monkeypatch.setenv("BYOC_HETERO_GEMV_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_NUM_THREADS", "2")
    rng = np.random.default_rng(40 + m)
    k, n = 53, 37
    x, w, b, r = _operands(rng, m, k, n, "NK", bias, residual)
    g = rng.standard_normal((m, n)).astype(np.float32)
    got, plan = _dense(x, w, "NK", b, r, gate=g, activation="relu" if relu else "none")
    _close(got, _reference(x, w, "NK", b, r, relu=relu, gate=g), k)
    assert bool(_gemv_steps(plan)) == (m <= 2 and not relu and MATMUL_PANELS), plan


def test_a_gate_of_another_shape_or_dtype_says_which_input():
    rng = np.random.default_rng(50)
    x, w, _, _ = _operands(rng, 3, 16, 8, "NK", False, False)
    with pytest.raises(ValueError, match=r"gate.*\[3, 8\].*\[3, 9\]|gate.*\[3, 9\].*\[3, 8\]"):
        _dense(x, w, "NK", gate=np.ones((3, 9), np.float32))


@pytest.mark.parametrize("var,value,message", [
    ("BYOC_HETERO_GEMV_ISA", "sse9", "BYOC_HETERO_GEMV_ISA must be auto, avx512, avx2 or generic"),
    ("BYOC_HETERO_GEMV_ROWS", "two", "BYOC_HETERO_GEMV_ROWS must be an integer >= 0"),
    ("BYOC_HETERO_GEMV_LAYOUT", "own", "BYOC_HETERO_GEMV_LAYOUT must be matmul, prefill, rows or panels, got 'own'"),
])
def test_switches_reject_unknown_values(monkeypatch, var, value, message):
    if var == "BYOC_HETERO_GEMV_ISA" and not MATMUL_PANELS:
        pytest.skip("BYOC_HETERO_GEMV_ISA is read where the GEMV can run (MATMUL_PANELS)")
    monkeypatch.setenv(var, value)
    w = np.ones((16, 32), np.float32)
    with pytest.raises(ValueError, match=message):
        _dense(np.ones((1, 32), np.float32), w, "NK")


def test_decode_step_denses_run_the_gemv_and_generate_transformers_tokens(monkeypatch):
    """A small Llama through bh.llm: greedy tokens equal transformers', and the decode step's plan (one row) runs
    every dense as the GEMV (the prefill's rows keep oneDNN)."""
    monkeypatch.setenv("BYOC_HETERO_NUM_THREADS", "1")  # no contention plans of fewer threads beside the profiled ones
    # every layer's denses at every row (the last layer's rows picked: test_last_layer_rows)
    monkeypatch.setenv("BYOC_HETERO_LAST_LAYER_ROWS", "all")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import byoc_hetero as bh

    torch.manual_seed(8)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      initializer_range=0.4, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = np.array([[5, 71, 13, 88, 2, 40, 19]], dtype="int64")
    gen = bh.llm.from_hf(model, max_length=32)
    (region,) = bh.codegen.region_modules(gen._executable)
    region["set_profiling"](True)
    got = gen.generate(prompt, max_new_tokens=12)
    with torch.no_grad():
        want = model.generate(torch.from_numpy(prompt), max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=0).numpy()
    np.testing.assert_array_equal(got, want)
    steps = [s for s in json.loads(region["get_profile"]()) if s["phase"] == "run" and s["op"] == "dense"
             and "after the gemv" not in s["label"]]
    decode = [s for s in steps if s["label"].endswith("S=1")]  # the decode plan's binding: one row
    prefill = [s for s in steps if s["label"].endswith("S=7")]
    # q/k/v, o (residual), gate (silu), up, down (residual) per layer, and the LM head
    assert len(decode) == 5 * config.num_hidden_layers + 1, decode
    assert all((": gemv (" in s["label"]) == MATMUL_PANELS and s["calls"] == 11 for s in decode), decode
    # the prefill's 7 rows keep oneDNN, but for the LM head, which reads the last row only
    head = [MATMUL_PANELS]
    assert [": gemv (" in s["label"] for s in prefill] == [False] * (5 * config.num_hidden_layers) + head, prefill


def _tiny_llama(torch, transformers, max_positions: int):
    torch.manual_seed(8)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=max_positions, initializer_range=0.4,
                                      tie_word_embeddings=True)
    return config, transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("threads,layout", [(2, "BA8a24b"), (1, "ba")])
def test_the_decode_gemv_reads_the_prefill_copy_under_avx2(monkeypatch, threads, layout):
    """Under an AVX2 cap with BYOC_HETERO_GEMV_LAYOUT=prefill (run by the subprocess test below) the decode step's
    GEMVs read the weight copy the prefill reads: at 2 threads a 130-row prefill runs oneDNN's inner product on
    AB8b24a copies ([K, N] BA8a24b), at 1 thread its sgemm on the [N, K] rows; no weight bytes are prepared for the
    decode plan; greedy tokens equal transformers'."""
    if _C.isa() != "avx2" or LAYOUT != "prefill":
        pytest.skip("runs under ONEDNN_MAX_CPU_ISA=AVX2 with BYOC_HETERO_GEMV_LAYOUT=prefill (the subprocess test)")
    monkeypatch.setenv("BYOC_HETERO_ADAPT_THREADS", "off")  # the one plan per shape
    monkeypatch.setenv("BYOC_HETERO_LAST_LAYER_ROWS", "all")  # every layer's denses at the prefill's 130 rows
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import byoc_hetero as bh

    config, model = _tiny_llama(torch, transformers, 256)
    prompt = np.random.default_rng(3).integers(1, config.vocab_size, (1, 130)).astype("int64")
    saved = _C.num_threads()
    _C.set_num_threads(threads)  # the region's plans, and the process's threads the GEMV's layout follows
    try:
        _decode_reads_the_prefill_copy(bh, torch, config, model, prompt, threads, layout)
    finally:
        _C.set_num_threads(saved)


def _decode_reads_the_prefill_copy(bh, torch, config, model, prompt, threads: int, layout: str):
    gen = bh.llm.from_hf(model, max_length=160)
    (region,) = bh.codegen.region_modules(gen._executable)
    gen.generate(prompt, max_new_tokens=1)  # the prefill plan alone
    prepared = json.loads(region["get_runtime_info"]())["shared_bytes"]
    region["set_profiling"](True)
    got = gen.generate(prompt, max_new_tokens=6)
    assert json.loads(region["get_runtime_info"]())["shared_bytes"] == prepared
    with torch.no_grad():
        want = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(torch.from_numpy(prompt)),
                              max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    np.testing.assert_array_equal(got, want)
    denses = [s for s in json.loads(region["get_profile"]()) if s["phase"] == "run" and s["op"] == "dense"
              and "after the gemv" not in s["label"]]
    decode = [s for s in denses if s["label"].endswith("S=1")]
    prefill = [s["impl"] for s in denses if s["label"].endswith("S=130")]
    assert len(decode) == 5 * config.num_hidden_layers + 1, decode
    assert all(": gemv (avx2)" in s["label"] and f"]:{layout} " in s["layouts"] + " " for s in decode), \
        [s["layouts"] for s in decode]
    want_prefill = "brgemm:avx2" if threads == 2 else "gemm:jit:f32"
    assert prefill.count(want_prefill) == 5 * config.num_hidden_layers, prefill


def test_a_plan_of_fewer_threads_reads_the_panels_of_the_process_threads():
    """Under an AVX2 cap with BYOC_HETERO_GEMV_LAYOUT=prefill (the subprocess test below): the GEMV's copy follows the
    process's threads, not the plan's, so that a plan made for fewer threads under contention reads the same panels
    (the same bits) as the full plan; a process of one thread reads the [N, K] rows."""
    if _C.isa() != "avx2" or LAYOUT != "prefill":
        pytest.skip("runs under ONEDNN_MAX_CPU_ISA=AVX2 with BYOC_HETERO_GEMV_LAYOUT=prefill (the subprocess test)")
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "gv",
           "tensors": [{"shape": [1, 53], "dtype": "float32"}, {"shape": [37, 53], "dtype": "float32"},
                       {"shape": [1, 37], "dtype": "float32"}],
           "inputs": [0], "outputs": [2], "constants": [{"tensor": 1, "name": "gv_w"}],
           "nodes": [{"op": "dense", "inputs": [0, 1], "output": 2, "attrs": {"weight_layout": "NK"}}]}

    def layouts(threads: int) -> list[str]:
        steps = _C.plan_region(json.dumps(doc), threads=threads)["run_steps"]
        assert len(steps) == 1 and ": gemv (avx2)" in steps[0]["label"], steps
        return steps[0]["layouts"]

    saved = _C.num_threads()
    try:
        _C.set_num_threads(2)
        assert "[53,37]:BA8a24b" in layouts(2) and layouts(1) == layouts(2)
        _C.set_num_threads(1)
        assert "[53,37]:ba" in layouts(1)
    finally:
        _C.set_num_threads(saved)


@pytest.mark.parametrize("layout,tests", [("prefill", "not under_an_avx2_cap"),
                                          ("rows", "matches_numpy or many_panels or gate")])
def test_the_module_under_an_avx2_cap_reads_the_prefill_panels(layout, tests):
    """This module's tests again in a subprocess capped to AVX2 (oneDNN reads its cap when it starts) with
    BYOC_HETERO_GEMV_LAYOUT unset (prefill, the default: all of them) and =rows (the numerics): every few-row dense
    then runs the GEMV,
    on the panels of 24 columns oneDNN's AVX2 inner product lays out or on the sgemm's [N, K] rows, against numpy."""
    if not NATIVE_PANELS or "BYOC_HETERO_GEMV_LAYOUT" in os.environ:
        pytest.skip("the subprocess itself (or a CPU without AVX-512: this module runs capped as it is)")
    if isa_under("AVX2") != "avx2":
        pytest.skip(f"this CPU cannot run oneDNN's avx2 kernels (got {isa_under('AVX2')})")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, *sys.path]), ONEDNN_MAX_CPU_ISA="AVX2",
               BYOC_HETERO_GEMV_LAYOUT=layout)
    if layout == "prefill":  # the default: the variable unset
        env.pop("BYOC_HETERO_GEMV_LAYOUT")
    env.pop("BYOC_HETERO_GEMV_ISA", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-rA",
                           os.path.join(here, "test_gemv.py"), "-k", tests],
                          env=env, cwd=here, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "oneDNN ISA: avx2" in proc.stdout, proc.stdout[-2000:]
    if layout == "prefill":
        for case in ("2-BA8a24b", "1-ba"):
            assert f"PASSED test_gemv.py::test_the_decode_gemv_reads_the_prefill_copy_under_avx2[{case}]" in \
                proc.stdout, proc.stdout[-4000:]
        assert "PASSED test_gemv.py::test_a_plan_of_fewer_threads_reads_the_panels_of_the_process_threads" in \
            proc.stdout, proc.stdout[-4000:]
