"""The int8 / float boundary (issue 26, session 5): the runtime's one-pass edges in a bf16 region
(kernels/quantize.cc) against numpy and an llvm-only build, and the int8 level's accounting of
what the edges cost (byoc_hetero/tune/edges.py, solver.improve) on injected costs and the cache."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.tune import edges as E
from byoc_hetero.tune import measure
from byoc_hetero.tune.cache import TimingCache
from byoc_hetero.tune.precision import problem_of
from byoc_hetero.tune.plans import PrecisionUnit
from byoc_hetero.tune.solver import improve, plan_cost, solve

needs_bf16 = pytest.mark.skipif(not bh._C.bf16_native(), reason="no native bf16 on this CPU")
create = tvm.get_global_func("byoc_hetero.runtime.create")


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bf16 (nearest even), as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def _edge_region(shape, precision):
    """uint8 x -> dequantize -> 1x1 conv with identity weights -> quantize -> uint8: the two edges
    of a float layer between int8 ones, nothing else changing a number."""
    c = shape[1]
    t = [{"shape": list(shape), "dtype": "uint8"}, {"shape": [1], "dtype": "float32"}, {"shape": [1], "dtype": "uint8"},
         {"shape": list(shape), "dtype": "float32"}, {"shape": [c, c, 1, 1], "dtype": "float32"},
         {"shape": list(shape), "dtype": "float32"}, {"shape": [1], "dtype": "float32"},
         {"shape": [1], "dtype": "uint8"}, {"shape": list(shape), "dtype": "uint8"}]
    nodes = [{"op": "dequantize", "inputs": [0, 1, 2], "output": 3, "attrs": {}},
             {"op": "conv2d", "inputs": [3, 4], "output": 5,
              "attrs": {"strides": [1, 1], "padding": [0, 0, 0, 0], "dilation": [1, 1], "groups": 1}},
             {"op": "quantize", "inputs": [5, 6, 7], "output": 8, "attrs": {}}]
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "edges", "precision": precision, "tensors": t,
           "inputs": [0], "outputs": [8], "nodes": nodes,
           "constants": [{"tensor": k, "name": f"edges_c{k}"} for k in (1, 2, 4, 6, 7)]}
    mod = create(json.dumps(doc))
    consts = [np.array([0.05], "float32"), np.array([128], "uint8"), np.eye(c, dtype="float32").reshape(c, c, 1, 1),
              np.array([0.07], "float32"), np.array([120], "uint8")]
    assert mod["__init_edges"]([tvm.runtime.tensor(v) for v in consts]) == 0
    return mod


def _run(mod, x):
    out = tvm.runtime.tensor(np.zeros(x.shape, "uint8"))
    mod["edges"](tvm.runtime.tensor(x), out)
    return out.numpy()


@needs_bf16
@pytest.mark.parametrize("shape", [(1, 32, 8, 8), (1, 20, 3, 3)])  # the AVX2 loops, and a scalar tail
def test_bf16_edges_are_one_pass_each_and_match_numpy(shape):
    """In a bf16 region the dequantize writes bf16 for the conv and the quantize reads the conv's
    bf16 output: no float32 -> bf16 reorder between them, and the values are numpy's emulation
    (dequantize, round to bf16, quantize by the reciprocal scale) within one step where the
    reciprocal lands on the other side of a tie; the float32 region is ONNX's arithmetic exactly."""
    x = np.random.default_rng(0).integers(0, 256, shape).astype("uint8")
    v = (x.astype(np.float32) - 128) * np.float32(0.05)
    mod = _edge_region(shape, "bf16")
    mod["set_profiling"](True)
    got = _run(mod, x)
    want = np.clip(np.round(_bf16(v) / np.float32(0.07)) + 120, 0, 255)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and np.mean(diff == 0) > 0.99, (diff.max(), np.mean(diff == 0))
    steps = [s for s in json.loads(str(mod["get_profile"]())) if s["phase"] == "run"]
    ops = [s for s in steps if s["op"]]  # the rest are the plain region input's / output's relayouts
    assert [s["op"] for s in ops] == ["dequantize", "conv2d", "quantize"], steps
    assert ops[0]["layouts"].split("out=")[1].endswith(":bf16"), ops[0]
    assert ops[2]["layouts"].split()[0].endswith(":bf16"), ops[2]
    converting = [s for s in steps if not s["op"] and s["layouts"].count(":bf16") == 1]
    assert not converting, converting  # no float32 <-> bf16 reorder left at either edge
    f32 = _run(_edge_region(shape, "f32"), x)
    assert np.array_equal(f32, np.clip(np.round(v / np.float32(0.07)) + 120, 0, 255)), "float32 path changed"


@needs_bf16
def test_int8_bf16_mix_matches_llvm_and_keeps_its_edges_bf16():
    """A ResNet-18 with every other layer int8 and the rest bf16 (what the tuner's mixes are):
    within bf16's error of the llvm-only build of the same QDQ module, and every dequantize read
    only by bf16 convs' data writes bf16 (before session 5 each wrote float32 and a reorder
    converted it)."""
    mod, params = bh.models.resnet18(image_size=32, num_classes=10)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    q = bh.quantize(mod, params, calibration=[x], keep_float=lambda layer: layer.index % 2 == 1, verbose=False)
    ex = relax.build(bh.partition(q.mod, q.params, precision="bf16"), target="llvm")
    regions = bh.codegen.region_modules(ex)
    for m in regions:
        m["set_profiling"](True)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ref_ex = relax.build(bh.bind_params(q.mod, q.params), target="llvm")
    ref = relax.VirtualMachine(ref_ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < 0.06
    checked = 0
    for m in regions:
        graph = json.loads(str(m["get_graph_json"]()))
        steps = {s["label"].rsplit("node ", 1)[-1].split(" ")[0]: s for s in json.loads(str(m["get_profile"]()))
                 if s["phase"] == "run" and s["op"] == "dequantize"}
        for i, node in enumerate(graph["nodes"]):
            readers = [(n["op"], n["inputs"].index(node["output"])) for n in graph["nodes"] if node["output"] in n["inputs"]]
            if node["op"] == "dequantize" and readers and all(r == ("conv2d", 0) for r in readers) \
                    and str(i) in steps and node["output"] not in graph["outputs"]:
                assert steps[str(i)]["layouts"].endswith(":bf16"), steps[str(i)]
                checked += 1
    assert checked >= 3


#: a region document's source: the backend whose knob names its nodes (here by index: "r#0")
ONEDNN = {"source": {"target": "onednn"}}


def test_unit_edges_trace_through_non_anchor_ops():
    """conv A -> relu -> (conv B, conv C), B -> region output: A's input is a model input, the relu's
    output is one tensor read by both B and C (one conversion for both), B's output a model output."""
    t = [{"shape": [1, 8, 4, 4]} for _ in range(6)] + [{"shape": [8, 8, 1, 1]}]
    graph = {"tensors": t, "inputs": [0], "outputs": [4], "constants": [{"tensor": 6, "name": "w"}], **ONEDNN,
             "nodes": [{"op": "conv2d", "inputs": [0, 6], "output": 1}, {"op": "eltwise", "inputs": [1], "output": 2},
                       {"op": "conv2d", "inputs": [2, 6], "output": 4}, {"op": "conv2d", "inputs": [2, 6], "output": 5}]}
    edges = E.unit_edges({"a": ["r#0"], "b": ["r#2"], "c": ["r#3"]}, {"r": graph})
    assert edges.inputs == {"a": ["r:0"], "b": ["r:2"], "c": ["r:2"]}
    assert edges.outputs == {"a": ["r:2"], "b": ["r:4"], "c": []}
    assert edges.model_inputs == ["r:0"] and edges.model_outputs == ["r:4"]
    assert edges.elements["r:2"] == 128
    together = E.unit_edges({"a": ["r#0", "r#2"], "c": ["r#3"]}, {"r": graph})
    assert together.inputs["a"] == ["r:0"], "an edge inside a unit is no edge"


def test_weights_computed_at_init_are_no_edge():
    """A weight a node computes from constants (a folded batch norm) is known at init: no tensor,
    no conversion (the first ResNet-50 run counted 3x3x512x512 folded weights as model inputs)."""
    t = [{"shape": [1, 8, 4, 4]}, {"shape": [8, 8, 1, 1]}, {"shape": [8]}, {"shape": [8, 8, 1, 1]}, {"shape": [1, 8, 4, 4]}]
    graph = {"tensors": t, "inputs": [0], "outputs": [4], **ONEDNN,
             "constants": [{"tensor": 1, "name": "w"}, {"tensor": 2, "name": "s"}],
             "nodes": [{"op": "batch_norm_fold", "inputs": [1, 2], "output": 3}, {"op": "conv2d", "inputs": [0, 3], "output": 4}]}
    edges = E.unit_edges({"a": ["r#1"]}, {"r": graph})
    assert edges.inputs == {"a": ["r:0"]} and set(edges.elements) == {"r:0", "r:4"}


def _chain(edge_s: float):
    """Units a -> b -> c, each int8 1 s / f32 2 s; b in int8 misses the tolerance."""
    units = [PrecisionUnit(n, (f"r#{i}",), times={"f32": 2.0, "int8": 1.0}, errors={"int8": e})
             for i, (n, e) in enumerate((("a", 0.0), ("b", 1.0), ("c", 0.0)))]
    edges = E.UnitEdges({"a": ["x"], "b": ["ab"], "c": ["bc"]}, {"a": ["ab"], "b": ["bc"], "c": ["y"]},
                        {t: 100 for t in ("x", "ab", "bc", "y")}, ["x"], ["y"])
    costs = {(E.FLOAT, E.INT8, 100): edge_s, (E.INT8, E.FLOAT, 100): edge_s}
    return units, edges, costs


@pytest.mark.parametrize("edge_s,want", [(1.5, "fff"), (0.1, "ifi")])
def test_edge_costs_overturn_a_mix_the_unit_times_pick(edge_s, want):
    """Units alone pick a int8, b f32, c int8 (4 s against all-f32's 6 s); with 1.5 s a conversion
    that mix costs 4 + 4 x 1.5 = 10 s (input, a->b, b->c, output), and the edge-aware search keeps
    all f32; with 0.1 s conversions the mix stays (4.4 s)."""
    units, edges, costs = _chain(edge_s)
    alone = solve(problem_of(units), 0.5)
    assert "".join(alone.choices[u].name[0] for u in "abc") == "ifi" and alone.time_s == pytest.approx(4.0)
    counted = problem_of(units, edges, costs)
    assert plan_cost(counted, alone.choices)[0] == pytest.approx(4.0 + 4 * edge_s)
    better = improve(counted, alone.choices, 0.5)
    assert "".join(better.choices[u].name[0] for u in "abc") == want
    assert better.time_s == pytest.approx(min(6.0, 4.0 + 4 * edge_s))


def test_improve_moves_runs_and_respects_the_tolerance():
    """A run of units flips together when single flips cannot pay (each single int8 unit adds two
    conversions), and no move exceeds the tolerance."""
    units = [PrecisionUnit(n, (f"r#{i}",), times={"f32": 2.0, "int8": 1.0}, errors={"int8": 0.1}) for i, n in
             enumerate("abcd")]
    names = list("abcd")
    edges = E.UnitEdges({n: [f"t{i}"] for i, n in enumerate(names)}, {n: [f"t{i + 1}"] for i, n in enumerate(names)},
                        {f"t{i}": 10 for i in range(5)}, ["t0"], ["t4"])
    costs = {(E.FLOAT, E.INT8, 10): 0.8, (E.INT8, E.FLOAT, 10): 0.8}
    problem = problem_of(units, edges, costs)
    start = {r.name: r.choices[0] for r in problem.regions}  # all f32, 8 s
    best = improve(problem, start, tolerance=1.0)
    assert [best.choices[n].name for n in names] == ["int8"] * 4 and best.time_s == pytest.approx(5.6)
    capped = improve(problem, start, tolerance=0.25)  # at most two int8 units: adjacent ones save 2 s for 1.6 s
    picked = "".join("i" if capped.choices[n].name == "int8" else "f" for n in names)
    assert picked.count("i") == 2 and "ii" in picked and capped.error <= 0.25
    assert capped.time_s == pytest.approx(7.6)


def test_edges_count_a_unit_reading_a_later_units_output():
    """Layer groups are not in topological order where a model's program order differs from its
    dataflow (ResNet-50's shortcut conv: group a = conv1 + conv3 reads group b's shortcut output):
    plan_cost and improve raised IndexError there (bench/tune_decisions.py on the zoo ResNet-50,
    f32 / bf16 / int8 at 1e-2); a complete plan knows the later producer's domain."""
    units = [PrecisionUnit(n, (f"r#{i}",), times={"f32": 2.0, "int8": 1.0}, errors={"int8": 0.1}) for i, n in
             enumerate("ab")]
    # a reads the model input t0 and b's output t1 and writes the model output t2; b reads t0
    edges = E.UnitEdges({"a": ["t0", "t1"], "b": ["t0"]}, {"a": ["t2"], "b": ["t1"]}, {"t0": 10, "t1": 10, "t2": 10},
                        ["t0"], ["t2"])
    costs = {(E.FLOAT, E.INT8, 10): 0.5, (E.INT8, E.FLOAT, 10): 0.25}
    problem = problem_of(units, edges, costs)
    by = {r.name: {c.name: c for c in r.choices} for r in problem.regions}
    mixed = {"a": by["a"]["f32"], "b": by["b"]["int8"]}
    # a (f32) reads t1 from b (int8): one dequantize; b quantizes the model input t0: one quantize
    assert plan_cost(problem, mixed)[0] == pytest.approx(2.0 + 1.0 + 0.25 + 0.5)
    both = {"a": by["a"]["int8"], "b": by["b"]["int8"]}
    # t0 quantized once for both readers, t1 stays int8, t2 dequantized back: 2 + 0.5 + 0.25
    assert plan_cost(problem, both)[0] == pytest.approx(2.0 + 0.5 + 0.25)
    best = improve(problem, {"a": by["a"]["f32"], "b": by["b"]["f32"]}, tolerance=1.0)
    assert [best.choices[n].name for n in "ab"] == ["int8", "int8"] and best.time_s == pytest.approx(2.75)


def test_edge_timings_are_cached(tmp_path, monkeypatch):
    """Conversions measured once per size and direction, kept in the timing cache file: a second
    tune reads them back (hits, no run)."""
    path = tmp_path / "timings.json"
    cache = TimingCache(path)
    first = E.measure_edge_costs([64, 1000], cache, repeat=3)
    assert set(first) == {(s, d, n) for (s, d) in E.CONVERSIONS for n in (64, 1000)}
    assert all(v > 0 for v in first.values()) and cache.misses == 4
    cache.save()

    def no_timing(*args, **kwargs):
        raise AssertionError("timed again although cached")

    monkeypatch.setattr(measure, "time_call", no_timing)  # what time_cached times with
    again = TimingCache(path)
    assert E.measure_edge_costs([1000, 64], again, repeat=3) == first and again.hits == 4
    with pytest.raises(AssertionError):
        E.measure_edge_costs([65], again, repeat=3)


def test_conversion_region_computes_the_conversion():
    """The measured one-node regions do the work they stand for (not an empty call)."""
    q = E.Conversion("quantize", 40)
    q()
    x = q.args[0].numpy()
    assert np.array_equal(q.args[1].numpy(), np.clip(np.round(x / np.float32(0.05)) + 128, 0, 255))
    d = E.Conversion("dequantize", 40)
    d()
    assert np.allclose(d.args[1].numpy(), (d.args[0].numpy().astype(np.float32) - 128) * np.float32(0.05))


@needs_bf16
def test_add_read_by_a_quantize_stays_on_a_jit_kernel():
    """A residual add of two float32 plain tensors read by a quantize in a bf16 region: the add may
    write bf16 (its reader rounds), but oneDNN 3.2 has only ref:any for that; it writes float32 on a
    jit kernel instead (ref:any made a ResNet-50 mix 20x slower), and the result is the add quantized."""
    shape = [1, 64, 14, 14]
    t = [{"shape": shape, "dtype": "float32"}, {"shape": shape, "dtype": "float32"}, {"shape": shape, "dtype": "float32"},
         {"shape": [1], "dtype": "float32"}, {"shape": [1], "dtype": "uint8"}, {"shape": shape, "dtype": "uint8"}]
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "addq", "precision": "bf16", "tensors": t,
           "inputs": [0, 1], "outputs": [5], "constants": [{"tensor": 3, "name": "s"}, {"tensor": 4, "name": "z"}],
           "nodes": [{"op": "binary", "inputs": [0, 1], "output": 2, "attrs": {"algorithm": "add"}},
                     {"op": "quantize", "inputs": [2, 3, 4], "output": 5, "attrs": {}}]}
    mod = create(json.dumps(doc))
    assert mod["__init_addq"]([tvm.runtime.tensor(np.array([0.05], "float32")),
                               tvm.runtime.tensor(np.array([128], "uint8"))]) == 0
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(shape).astype("float32") for _ in range(2))
    out = tvm.runtime.tensor(np.zeros(shape, "uint8"))
    mod["set_profiling"](True)
    mod["addq"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    want = np.clip(np.round((a + b) / np.float32(0.05)) + 128, 0, 255)
    assert np.abs(out.numpy().astype(int) - want).max() <= 1
    binary = [s for s in json.loads(str(mod["get_profile"]())) if s["phase"] == "run" and s["op"] == "binary"]
    assert binary and not binary[0]["impl"].startswith("ref"), binary
