"""The tuner's building blocks: the solver on injected costs (checked against brute force), the
timing cache (hit, miss, stale, foreign, corrupt, atomic save) and the robust timing summary."""

from __future__ import annotations

import itertools
import json
import math
import random
import time
import warnings
from dataclasses import replace

import numpy as np
import pytest

from byoc_hetero.tune import (
    Choice,
    MachineKey,
    Problem,
    Region,
    Timing,
    TimingCache,
    TimingCacheWarning,
    linear_copy_cost,
    plan_cost,
    robust_timing,
    signature,
    solve,
    time_call,
)

# one copy between cpu and gpu: 10 µs + 1 ns per byte
COPY = linear_copy_cost({("cpu:0", "cuda:0"): 1e-5}, {("cpu:0", "cuda:0"): 1e9})


def brute_force(problem: Problem, tolerance: float = math.inf) -> tuple[float, dict]:
    best, best_plan = math.inf, None
    names = [r.name for r in problem.regions]
    for combo in itertools.product(*[r.choices for r in problem.regions]):
        plan = dict(zip(names, combo))
        t, e = plan_cost(problem, plan)
        if e <= tolerance and t < best:
            best, best_plan = t, plan
    return best, best_plan


def test_chain_prefers_staying_on_one_device_when_copies_cost_more():
    # the middle region is 20 µs faster on the GPU, but its input and output copies of 1 MB cost
    # 2 x 1.01 ms: everything stays on the CPU
    regions = [
        Region("a", [Choice("cpu", "cpu:0", 1e-3)], ["x"], ["t1"]),
        Region("b", [Choice("cpu", "cpu:0", 1e-3), Choice("gpu", "cuda:0", 0.98e-3)], ["t1"], ["t2"]),
        Region("c", [Choice("cpu", "cpu:0", 1e-3)], ["t2"], ["y"]),
    ]
    p = Problem(regions, {"x": 10**6, "t1": 10**6, "t2": 10**6, "y": 10**6}, COPY, ["x"], ["y"])
    sol = solve(p)
    assert sol.exact and sol.choices["b"].device == "cpu:0"
    assert sol.time_s == pytest.approx(3e-3)
    # a much faster GPU pays for its copies
    regions[1] = Region("b", [Choice("cpu", "cpu:0", 1e-2), Choice("gpu", "cuda:0", 1e-3)], ["t1"], ["t2"])
    sol = solve(replace(p, regions=regions))
    assert sol.choices["b"].device == "cuda:0"
    assert sol.time_s == pytest.approx(1e-3 + 1e-3 + 1e-3 + 2 * (1e-5 + 1e-3))


def test_shared_input_is_copied_once_per_device():
    # x feeds two GPU regions: one copy, not two
    regions = [
        Region("g1", [Choice("gpu", "cuda:0", 1e-3), Choice("cpu", "cpu:0", 5e-3)], ["x"], ["y1"]),
        Region("g2", [Choice("gpu", "cuda:0", 1e-3), Choice("cpu", "cpu:0", 5e-3)], ["x"], ["y2"]),
    ]
    p = Problem(regions, {"x": 4 * 10**6, "y1": 0, "y2": 0}, COPY, ["x"], ["y1", "y2"])
    t, _ = plan_cost(p, {"g1": regions[0].choices[0], "g2": regions[1].choices[0]})
    one_copy = 1e-5 + 4e-3
    assert t == pytest.approx(2e-3 + one_copy + 2 * 1e-5)  # outputs (0 bytes) copied back: latency only
    sol = solve(p)
    assert sol.choices["g1"].device == sol.choices["g2"].device == "cuda:0"
    assert sol.time_s == pytest.approx(t)


def test_precision_budget_is_respected():
    # bf16 halves each region's time at an error of 4e-3 each; tolerance 1e-2 admits two of three
    regions = [Region(f"r{i}", [Choice("f32", "cpu:0", t), Choice("bf16", "cpu:0", t / 2, 4e-3)],
                      [f"t{i}"], [f"t{i + 1}"]) for i, t in enumerate([1e-3, 3e-3, 2e-3])]
    p = Problem(regions, {f"t{i}": 0 for i in range(4)}, COPY, ["t0"], ["t3"])
    sol = solve(p, tolerance=1e-2)
    assert sol.exact and sol.error <= 1e-2
    assert sorted(n for n, c in sol.choices.items() if c.name == "bf16") == ["r1", "r2"]  # the big two
    assert sol.time_s == pytest.approx(1e-3 + 1.5e-3 + 1e-3)


def test_tolerance_no_plan_meets_returns_least_error_with_note():
    regions = [Region("r", [Choice("bf16", "cpu:0", 1e-3, 5e-2), Choice("int8", "cpu:0", 5e-4, 9e-2)])]
    sol = solve(Problem(regions, {}, COPY), tolerance=1e-2)
    assert sol.choices["r"].name == "bf16" and not sol.exact
    assert "no plan meets tolerance" in sol.notes[0]


def _random_problem(rng: random.Random, n: int) -> Problem:
    devices = ["cpu:0", "cuda:0"]
    regions, tensors = [], {"in": rng.randrange(1, 10**6)}
    for i in range(n):
        # inputs: 1-2 earlier tensors (a DAG, shared inputs included)
        pool = ["in"] + [f"t{j}" for j in range(i)]
        inputs = sorted(set(rng.sample(pool, min(len(pool), rng.randint(1, 2)))))
        tensors[f"t{i}"] = rng.randrange(1, 10**6)
        choices = [Choice(f"{d}/{prec}", d, rng.uniform(1e-4, 3e-3), err)
                   for d in devices for prec, err in (("f32", 0.0), ("bf16", rng.uniform(0, 4e-3)))
                   if rng.random() < 0.8] or [Choice("cpu:0/f32", "cpu:0", 1e-3)]
        regions.append(Region(f"r{i}", choices, inputs, [f"t{i}"]))
    return Problem(regions, tensors, COPY, ["in"], [f"t{n - 1}"])


@pytest.mark.parametrize("seed", range(40))
def test_solver_matches_brute_force_on_random_dags(seed):
    rng = random.Random(seed)
    p = _random_problem(rng, rng.randint(1, 6))
    tol = rng.choice([math.inf, 4e-3, 1e-2])
    want, _ = brute_force(p, tol)
    sol = solve(p, tolerance=None if tol == math.inf else tol)
    assert sol.exact
    assert sol.time_s == pytest.approx(want, rel=1e-12)
    assert sol.error <= tol
    assert plan_cost(p, sol.choices)[0] == pytest.approx(sol.time_s)


def test_budget_cut_returns_a_complete_plan_marked_inexact():
    p = _random_problem(random.Random(7), 300)
    sol = solve(p, budget_s=0.05)
    assert set(sol.choices) == {r.name for r in p.regions}
    if not sol.exact:  # a fast machine may finish; when cut, it says so
        assert "budget" in sol.notes[0]


def test_region_without_choices_is_an_error():
    with pytest.raises(ValueError, match="r0 has no candidate"):
        solve(Problem([Region("r0", [])], {}, COPY))


# ---- the timing cache ------------------------------------------------------------------------

MACHINE = MachineKey(cpu="Test CPU", cpu_flags="abc", isa="avx512_core", onednn="3.2.0",
                     tvm="0.27.0", byoc_hetero="0.1.0")


def test_signature_is_canonical():
    a = signature("conv2d", [(1, 64, 56, 56), (64, 64, 3, 3)], ["float32"], {"strides": [1, 1], "pad": 1},
                  "winograd")
    b = signature("conv2d", [[1, 64, 56, 56], [64, 64, 3, 3]], ["float32"], {"pad": 1, "strides": (1, 1)},
                  "winograd")
    assert a == b
    assert a != signature("conv2d", [(1, 64, 56, 56), (64, 64, 3, 3)], ["float32"],
                          {"strides": [1, 1], "pad": 1}, "direct")


def test_cache_round_trip_hits_and_misses(tmp_path):
    path = tmp_path / "timings.json"
    c = TimingCache(path, MACHINE)
    key = signature("dense", [(1, 512)], ["float32"], {}, "onednn")
    assert c.get(key) is None and c.misses == 1
    c.put(key, Timing(1.5e-5, 15, 0.02))
    c.save()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same machine: no warning
        again = TimingCache(path, MACHINE)
    assert again.get(key) == Timing(1.5e-5, 15, 0.02) and again.hits == 1 and len(again) == 1
    assert not list(tmp_path.glob(".timing-*"))  # the atomic save left no temporary file


@pytest.mark.parametrize("change,word", [
    ({"cpu": "Other CPU"}, "foreign"),
    ({"isa": "avx2"}, "foreign"),
    ({"gpu": "NVIDIA H100"}, "foreign"),
    ({"onednn": "3.3.0"}, "stale"),
    ({"byoc_hetero": "0.2.0"}, "stale"),
])
def test_foreign_or_stale_cache_is_ignored_with_a_warning(tmp_path, change, word):
    path = tmp_path / "timings.json"
    c = TimingCache(path, replace(MACHINE, **change))
    c.put("k", Timing(1e-3, 5))
    c.save()
    with pytest.warns(TimingCacheWarning, match=word):
        mine = TimingCache(path, MACHINE)
    assert len(mine) == 0 and mine.get("k") is None
    assert word in mine.ignored


@pytest.mark.parametrize("content", [
    "not json {",
    json.dumps({"format": "something-else"}),
    json.dumps({"format": "byoc-hetero-timing-cache", "version": 99}),
    json.dumps({"format": "byoc-hetero-timing-cache", "version": 1, "machine": {"cpu": "x"}, "entries": {}}),
    json.dumps({"format": "byoc-hetero-timing-cache", "version": 1,
                "machine": MACHINE.__dict__, "entries": {"k": {"median_s": -1, "samples": 3}}}),
])
def test_corrupt_cache_is_ignored_with_a_warning(tmp_path, content):
    path = tmp_path / "timings.json"
    path.write_text(content)
    with pytest.warns(TimingCacheWarning, match="ignored"):
        c = TimingCache(path, MACHINE)
    assert len(c) == 0
    c.put("k", Timing(1e-3, 5))
    c.save()  # the corrupt file is replaced by a good one
    assert TimingCache(path, MACHINE).get("k") == Timing(1e-3, 5)


def test_machine_key_of_this_machine_names_the_isa():
    key = MachineKey.current()
    from byoc_hetero import _C

    assert key.isa == _C.isa() and key.onednn == _C.onednn_version() and key.cpu


# ---- measuring -------------------------------------------------------------------------------

def test_robust_timing_drops_outliers():
    t = robust_timing([1.0] * 9 + [1.1] * 9 + [50.0])
    assert t.samples == 18 and 1.0 <= t.median_s <= 1.1
    with pytest.raises(ValueError):
        robust_timing([])


def test_time_call_measures_a_sleep():
    t = time_call(lambda: time.sleep(0.002), warmup=1, repeat=5)
    assert t.samples >= 4 and 0.0019 <= t.median_s < 0.05
    assert np.isfinite(t.spread)


# ---- the algorithm level ---------------------------------------------------------------------

def test_conv_sites_are_distinct_and_complete():
    import byoc_hetero as bh
    from byoc_hetero.tune.algorithms import ConvSite, conv_sites

    mod, params = bh.models.resnet18(image_size=32)
    sites = conv_sites(bh.partition(mod, params))
    assert len(sites) == len(set(sites)) == 11  # ResNet-18: 20 convolutions, 11 distinct
    stem = sites[0]
    assert stem == ConvSite((1, 3, 32, 32), (64, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1)
    assert stem.output_shape() == (1, 64, 16, 16)


def test_conv_algorithm_decisions_follow_the_measurements(tmp_path):
    from byoc_hetero.tune.algorithms import ConvSite, decisions_option, tune_conv_algorithms

    wino = ConvSite((1, 16, 20, 20), (16, 16, 3, 3), padding=(1, 1, 1, 1))  # Winograd applies
    strided = ConvSite((1, 16, 20, 20), (16, 16, 3, 3), strides=(2, 2), padding=(1, 1, 1, 1))
    cache = TimingCache(tmp_path / "t.json", MACHINE)
    d_wino, d_strided = tune_conv_algorithms([wino, strided], cache, repeat=5)
    assert set(d_wino.timings) == {"direct", "winograd"} and not d_wino.cached
    assert d_wino.chosen == min(d_wino.timings, key=lambda a: d_wino.timings[a].median_s)
    assert d_wino.default == "winograd"  # 25 tiles: the thresholds pick Winograd
    assert d_strided.timings == {} and d_strided.chosen == "direct" and "only algorithm" in d_strided.why()
    assert len(cache) == 2
    cache.save()
    # a second tune reads the timings back and decides the same; a cached timing that says
    # otherwise changes the decision (the cache is what is decided from)
    again = TimingCache(tmp_path / "t.json", MACHINE)
    slow = "winograd" if d_wino.chosen == "direct" else "direct"
    again.put(wino.timing_key(d_wino.chosen), Timing(1.0, 5))
    (d2, _) = tune_conv_algorithms([wino, strided], again)
    assert d2.cached and d2.chosen == slow and again.misses == 0
    option = json.loads(decisions_option([d2, d_strided]))
    assert option == ({wino.key(): slow} if slow != d2.default else {})  # only changes are written


# ---- bh.tune: decisions applied through the backend option, the never-slower guard -------------

def _small_cnn():
    import byoc_hetero as bh

    return bh.models.resnet18(image_size=64)


def test_algorithms_option_reaches_the_conv_nodes():
    import byoc_hetero as bh
    from byoc_hetero._relax import region_table
    from byoc_hetero.tune.algorithms import conv_sites

    mod, params = _small_cnn()
    sites = conv_sites(bh.partition(mod, params))
    wanted = {s.key(): ("winograd" if i % 2 else "direct") for i, s in enumerate(sites)}
    part = bh.partition(mod, params, options={"onednn": {"algorithms": json.dumps(wanted)}})
    seen = {}
    for entry in region_table(part).values():
        tensors = entry.graph["tensors"]
        for node in entry.graph["nodes"]:
            if node["op"] == "conv2d":
                from byoc_hetero.backends.onednn.ops.conv2d import conv_site_key

                key = conv_site_key(tensors[node["inputs"][0]]["shape"], tensors[node["inputs"][1]]["shape"],
                                    node.get("attrs", {}))
                seen[key] = node["attrs"].get("algo")
    assert seen == wanted
    with pytest.raises(bh.RuleError, match="expected one of"):
        bh.partition(mod, params, options={"onednn": {"algorithms": json.dumps({"x": "fft"})}})


@pytest.mark.parametrize("faster", [True, False])
def test_tune_keeps_the_tuned_plan_only_when_measured_faster(monkeypatch, tmp_path, faster):
    import tvm
    from tvm import relax

    import byoc_hetero as bh
    from byoc_hetero.tune import tuner
    from byoc_hetero.tune.algorithms import AlgorithmDecision

    # every timed site decides the opposite of the thresholds, so the tuned plan differs
    real = tuner.tune_conv_algorithms

    def flipped(sites, cache, repeat=15):
        out = real(sites, cache, repeat=3)
        for d in out:
            if d.timings:
                d.chosen = "direct" if d.default == "winograd" else "winograd"
        return out

    monkeypatch.setattr(tuner, "tune_conv_algorithms", flipped)
    monkeypatch.setattr(tuner, "_guard", lambda d, t, x, r, n: (Timing(2e-3, 5), Timing(1e-3 if faster else 3e-3, 5)))
    mod, params = _small_cnn()
    m, report = bh.tune(mod, params, cache=tmp_path / "c.json")
    assert report.kept == ("tuned" if faster else "default")
    assert any(d.chosen != d.default for d in report.algorithms)
    assert "kept the" in str(report) and (faster or "not measured faster" in str(report))
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype("float32")
    run = lambda mm: relax.VirtualMachine(relax.build(mm, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    want = run(bh.partition(mod, params))
    np.testing.assert_allclose(run(m), want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


def test_tune_rejects_levels_it_does_not_decide_yet_and_bad_precision_requests():
    import byoc_hetero as bh

    mod, params = bh.models.mlp()
    x = [np.zeros((1, 784), "float32")] * 2
    with pytest.raises(bh.PlacementError, match="cuda"):
        bh.tune(mod, params, devices=("cpu", "cuda"))
    for kwargs, match in [
        ({"precisions": ("f32", "fp8"), "tolerance": 1e-2, "calibration": x}, "unknown precision 'fp8'"),
        ({"precisions": ("f32", "int8"), "tolerance": 1e-2, "calibration": x}, "int8 is not a tune precision"),
        ({"precisions": ("f32", "bf16")}, "needs a tolerance"),
        ({"precisions": ("f32", "bf16"), "tolerance": 1e-2}, "needs calibration inputs"),
        ({"precisions": ("f32", "bf16"), "tolerance": -1.0, "calibration": x}, "finite number >= 0"),
        ({"precisions": ("f32", "bf16"), "tolerance": 1e-2, "calibration": x, "budget_s": 0}, "budget_s"),
        ({"tolerance": 1e-2}, "several precisions"),
        ({"precisions": ()}, "empty"),
    ]:
        with pytest.raises(bh.RuleError, match=match):
            bh.tune(mod, params, **kwargs)
