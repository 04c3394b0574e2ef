"""The precision level on a transformer-shaped partition (issue 35, item 2).

``bh.tune`` on BERT-base raised ``RuleError: option node_precisions: node ...#100 is a reshape``: the
node keys (region symbol and node index) came from the float32 partition, and the candidates were
partitioned as bf16 regions, where the region-graph passes differ (a bf16 region keeps attention
unfused, ops/fused_attention.py), so the same index named another node. The candidates are now
float32 regions whose named nodes alone change precision (one partition shape for both); a decision
that still names no conv2d / dense / matmul keeps float32 and the report says which and why.

The graph: a self-attention block (Q, K, V projections, scores of 72 keys, which the default fuses
into one attention node, an output projection) and a two-layer MLP. On a CPU without native bf16
the runtime computes the bf16 nodes in float32; what is checked here is where the decisions land.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import graph
from test_ops_attention import _heads, _weight
from tvm import relax

import byoc_hetero as bh
from byoc_hetero._relax import region_table
from byoc_hetero.backends.onednn import precision as backend_precision
from byoc_hetero.backends.onednn.precision import content_keys, node_key
from byoc_hetero.tune.plans import Session, anchor_nodes, partition_with_node_precisions

R = relax.op
SEQ, HEADS, DIM = 72, 2, 8  # 72 keys: more than MIN_KEYS, so the float32 partition fuses the attention


def _encoder_layer():
    """x [1, S, H*D] -> attention (+ residual) -> dense, relu, dense (+ residual)."""
    width = HEADS * DIM

    def body(emit, x):
        q, k, v = (_heads(emit, x, SEQ, HEADS, DIM) for _ in range(3))
        s = emit(R.multiply(emit(R.matmul(q, emit(R.permute_dims(k, [0, 1, 3, 2])))),
                            relax.const(np.float32(DIM ** -0.5))))
        o = emit(R.matmul(emit(R.nn.softmax(s, axis=-1)), v))
        merged = emit(R.reshape(emit(R.permute_dims(o, [0, 2, 1, 3])), (1, SEQ, width)))
        h = emit(R.add(x, emit(R.matmul(merged, _weight(width, width)))))
        up = emit(R.nn.relu(emit(R.matmul(h, _weight(width, 2 * width)))))
        return R.add(h, emit(R.matmul(up, _weight(2 * width, width))))

    return graph({"x": (1, SEQ, HEADS * DIM)}, body)


def _precisions(partitioned) -> dict[str, str]:
    """node key (by content) -> precision attr, for every node that has one."""
    return {key: node["attrs"]["precision"] for symbol, entry in region_table(partitioned).items() if entry.graph
            for key, node in zip(content_keys(symbol, entry.graph), entry.graph["nodes"])
            if "precision" in node.get("attrs", {})}


def _ops(partitioned) -> list[str]:
    return [n["op"] for e in region_table(partitioned).values() if e.graph for n in e.graph["nodes"]]


@pytest.fixture(scope="module")
def layer():
    mod = _encoder_layer()
    base = bh.partition(mod)
    assert "attention" in _ops(base)  # the pass that differs between f32 and bf16 regions fires
    return mod, base


def test_float_partition_keys_name_the_same_nodes_in_every_candidate(layer):
    """Every candidate the precision level builds gets its decisions on exactly the nodes it measured."""
    mod, base = layer
    keys = [k for k, _ in anchor_nodes(base)]
    assert len(keys) == 4  # Q, K, V as one dense (combine_parallel_denses), output projection, two MLP denses
    session = Session(mod, None, None, {}, None, False)
    for table in ({k: "bf16" for k in keys}, {k: "bf16" if i % 2 else "f32" for i, k in enumerate(keys)}):
        built = session.build(table).module
        assert _precisions(built) == table
        assert [k for k, _ in anchor_nodes(built)] == keys
    assert session.skipped == {}


def test_a_decision_naming_another_node_keeps_float32_and_says_why(layer):
    mod, base = layer
    keys = [k for k, _ in anchor_nodes(base)]
    symbol = keys[0].rpartition("#")[0]
    ops = _ops(base)
    not_anchor = next(i for i, op in enumerate(ops) if op not in backend_precision.PRECISION_OPS)
    bad = {f"{symbol}#{not_anchor}": "bf16", f"{symbol}#{len(ops) + 3}": "bf16"}
    with pytest.raises(bh.RuleError, match="only float conv2d, dense, matmul nodes take a precision"):
        bh.partition(mod, options={"onednn": {"node_precisions": json.dumps(bad | {keys[0]: "bf16"})}})
    skipped: dict[str, str] = {}
    got = partition_with_node_precisions(mod, None, bad | {keys[0]: "bf16"}, targets=None, options={},
                                         skipped=skipped)
    assert _precisions(got) == {keys[0]: "bf16"}
    assert set(skipped) == set(bad)
    assert ops[not_anchor] in skipped[f"{symbol}#{not_anchor}"]
    assert "no node" in skipped[f"{symbol}#{len(ops) + 3}"]


def _nodes(partitioned) -> tuple[dict[str, int], list[tuple[str, str | None]]]:
    """(content key -> node index, and per node its op and the digest of the constant its second
    operand is read from, None for none), read from the (one) region document directly."""
    (symbol, entry), = [(s, e) for s, e in region_table(partitioned).items() if e.graph]
    digests = {c["tensor"]: c["digest"] for c in entry.graph["constants"]}
    producer = {n["output"]: n for n in entry.graph["nodes"]}
    nodes = []
    for node in entry.graph["nodes"]:
        t = node["inputs"][1] if len(node["inputs"]) > 1 else None
        while t is not None and t not in digests and t in producer and producer[t]["inputs"]:
            t = producer[t]["inputs"][0]
        nodes.append((node["op"], digests.get(t)))
    keys = {k: i for i, k in enumerate(content_keys(symbol, entry.graph)) if k is not None}
    return keys, nodes


def test_keys_by_content_survive_passes_that_move_the_nodes(layer):
    """Issue 38 (a), issue 35: the keys the precision level measured on the float32 partition name the
    same nodes in a partition whose region passes differ — a bf16 region keeps the attention unfused,
    so every node after it sits at another index. By index (the keys before session 14) the same
    decisions name other nodes there (BERT-base: a reshape)."""
    mod, base = layer
    keys = [k for k, _ in anchor_nodes(base)]
    table = {k: "bf16" if i % 2 else "f32" for i, k in enumerate(keys)}
    moved = bh.partition(mod, precision="bf16", options={"onednn": {"node_precisions": json.dumps(table)}})
    assert "attention" not in _ops(moved)  # other region passes ran: other nodes, other places
    assert _precisions(moved) == table
    (where, before), (where_now, now) = _nodes(base), _nodes(moved)
    assert all(before[where[k]][1] is not None for k in keys)  # each anchor here reads a weight
    assert [before[where[k]] for k in keys] == [now[where_now[k]] for k in keys]  # the same op and weight ...
    assert any(where[k] != where_now[k] for k in keys)  # ... at other indices
    # the indices of the float partition name other nodes here (what the positional keys did)
    assert any(where[k] >= len(now) or now[where[k]] != before[where[k]] for k in keys)


def test_content_keys_follow_the_node_not_its_place():
    """The key of a conv2d / dense / matmul is its op, its weight's shape and digest (both operands'
    shapes for a product of two run-time values) and how many earlier nodes compute the same: a node
    put before it changes its index, not its key; tied weights get keys of their own."""
    tensor = {"shape": [4, 8], "dtype": "float32"}
    doc = {"symbol": "r", "tensors": [dict(tensor) for _ in range(6)], "inputs": [0], "outputs": [4],
           "constants": [{"tensor": 1, "name": "w", "digest": "0123456789abcdef"}],
           "nodes": [{"op": "dense", "inputs": [0, 1], "output": 2, "attrs": {}},
                     {"op": "dense", "inputs": [2, 1], "output": 3, "attrs": {}},  # the same weight (tied)
                     {"op": "matmul", "inputs": [2, 3], "output": 4, "attrs": {}}]}
    keys = content_keys("r", doc)
    assert len(set(keys)) == 3 and [k.rpartition(".")[2] for k in keys] == ["0", "1", "0"]
    assert keys[0].rpartition(".")[0] == keys[1].rpartition(".")[0]  # one content, counted
    assert all(k.startswith("r#") for k in keys)
    shifted = dict(doc, nodes=[{"op": "relu", "inputs": [0], "output": 5, "attrs": {}}, *doc["nodes"]])
    assert content_keys("r", shifted) == [None, *keys]
    assert [backend_precision.locate_node(k, shifted) for k in keys] == [1, 2, 3]
    assert backend_precision.locate_node(node_key("r", 2), shifted) == 2  # an index still names a place
    other = dict(doc, constants=[{"tensor": 1, "name": "w", "digest": "fedcba9876543210"}])
    assert content_keys("r", other)[:2] != keys[:2] and content_keys("r", other)[2] == keys[2]
    assert backend_precision.locate_node("r#dense.000000000000.0", doc) is None
    assert json.loads(backend_precision.check_node_precisions(json.dumps({keys[0]: "bf16", "r#1": "f32"})))
    with pytest.raises(bh.RuleError, match="content key"):
        backend_precision.check_node_precisions(json.dumps({"r#dense.xyz.0": "bf16"}))


@pytest.fixture
def bf16_native(monkeypatch):
    """The tuner's bf16 candidates as on a CPU with native bf16 (here the runtime still computes the
    bf16 nodes in float32: the plan's structure is what these tests check, not bf16 rounding)."""
    monkeypatch.setattr(backend_precision, "effective_precision", lambda precision: (precision, ""))


def _samples(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, SEQ, HEADS * DIM)).astype("float32") for _ in range(n)]


def test_tune_with_bf16_on_a_transformer_layer_never_raises(layer, bf16_native, codegen_by_the_rule):
    import tvm

    mod, base = layer
    xs = _samples(4, 1)
    tuned, report = bh.tune(mod, precisions=("f32", "bf16"), tolerance=1e-2, calibration=xs,
                            guard_rounds=1, repeat=2)
    rep = report.precision
    assert rep is not None and len(rep.units) == 4, str(report)
    all_bf16 = rep.plan("all bf16")
    assert all_bf16 is not None and all_bf16.calibration_error is not None, str(report)
    assert not any("could not be applied" in n for n in rep.notes), str(report)
    kept = rep.plan(rep.kept)
    assert _precisions(tuned) == {k: v for k, v in kept.table.items()}
    vm = relax.VirtualMachine(relax.build(tuned, target="llvm"), tvm.cpu())
    ref = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    x = tvm.runtime.tensor(xs[0])
    got, want = vm["main"](x).numpy(), ref["main"](x).numpy()
    # within the tolerance asked (bf16 rounding where the CPU computes bf16 natively: Zen 5, 0.3-0.7%)
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max(), str(report)


def test_tune_reports_a_decision_it_cannot_apply(layer, bf16_native, monkeypatch, codegen_by_the_rule):
    """A unit whose key names no anchor of the candidates' partition (as BERT-base's did): the tune
    finishes, those nodes keep float32, and the report names them with the reason."""
    from byoc_hetero.tune import precision as tune_precision

    mod, base = layer
    real = tune_precision.anchor_nodes
    symbol = real(base)[0][0].rpartition("#")[0]
    fused = _ops(base).index("attention")

    def with_a_stray_key(partitioned):
        return [*real(partitioned), (f"{symbol}#{fused}", "node that is no anchor")]

    monkeypatch.setattr(tune_precision, "anchor_nodes", with_a_stray_key)
    _, report = bh.tune(mod, precisions=("f32", "bf16"), tolerance=1e-2, calibration=_samples(4, 2),
                        guard_rounds=1, repeat=2)
    text = str(report)
    assert f"{symbol}#{fused}: names an attention" in text and "kept float32" in text, text
