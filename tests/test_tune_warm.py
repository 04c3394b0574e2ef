"""What a warm tune reads from the timing cache instead of re-deriving it (issue 26, "tunecost").

Each new cache entry is tested for a hit (nothing rebuilt, the same answer), a miss (worked out and
stored), and a stale or malformed entry (not trusted: worked out again). Behaviour only: no timing
asserts; what a second tune may skip is checked by counting partitions and region creations.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

import byoc_hetero as bh
from byoc_hetero._relax import region_table
from byoc_hetero.tune import TimingCache
from byoc_hetero.tune.cache import signature
from conftest import needs_int8_kernels

precision = importlib.import_module("byoc_hetero.tune.precision")
tune_plans = importlib.import_module("byoc_hetero.tune.plans")
int8 = importlib.import_module("byoc_hetero.tune.int8")
node_maps = importlib.import_module("byoc_hetero.tune.node_maps")
stages = importlib.import_module("byoc_hetero.stages")


def _samples(n, seed, shape=(1, 3, 16, 16)):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype("float32") for _ in range(n)]


def _graphs(partitioned):
    return {s: e.graph for s, e in region_table(partitioned).items() if e.graph}


def _anchors(partitioned):
    return tune_plans.anchor_nodes(partitioned)


# -- node timing keys without a region -----------------------------------------------------------------


def test_node_timing_key_is_the_one_node_regions_key():
    mod, params = bh.models.small_convnet()
    graphs = _graphs(bh.partition(mod, params))
    anchors = _anchors(bh.partition(mod, params))
    assert len(anchors) == 5
    places = tune_plans.node_places([k for k, _ in anchors], graphs)
    assert len(places) == 5
    for key, _ in anchors:
        symbol, index = places[key]
        for p in ("f32", "bf16"):
            assert tune_plans.node_timing_key(graphs[symbol], int(index), p) == \
                tune_plans.OneNode(graphs[symbol], int(index), p).timing_key()
    # another precision, another key (the key is not blind to what is timed)
    symbol, index = places[anchors[0][0]]
    assert tune_plans.node_timing_key(graphs[symbol], int(index), "f32") != \
        tune_plans.node_timing_key(graphs[symbol], int(index), "bf16")


def test_unit_times_from_the_cache_create_no_region(monkeypatch):
    mod, params = bh.models.small_convnet()
    partitioned = bh.partition(mod, params)
    units = tune_plans.make_units(_anchors(partitioned))
    cache = TimingCache(None)
    created = []
    real = tune_plans.OneNode.__init__
    monkeypatch.setattr(tune_plans.OneNode, "__init__", lambda self, *a, **k: created.append(1) or real(self, *a, **k))
    tune_plans.measure_unit_times(units, _graphs(partitioned), cache, repeat=3)  # a miss: each node timed
    assert len(created) == 10 and cache.misses == 10 and len(cache) == 10
    again = tune_plans.make_units(_anchors(partitioned))
    created.clear()
    tune_plans.measure_unit_times(again, _graphs(partitioned), cache, repeat=3)  # a hit: none created
    assert created == [] and cache.hits == 10
    assert [u.times for u in again] == [u.times for u in units]


# -- the int8 level's node maps ------------------------------------------------------------------------


def test_node_maps_hit_miss_and_malformed(tmp_path):
    path = tmp_path / "c.json"
    identity = {"model": "m1", "inputs": "i1"}
    computed = []

    def compute(value):
        return lambda: computed.append(1) or value

    maps = node_maps.NodeMaps(TimingCache(path), identity, "s1")
    assert maps.get("float", {2, 0}, compute({1: "r#4", 3: "r#9"})) == {1: "r#4", 3: "r#9"}  # a miss
    assert maps.get("float", [0, 2], compute({})) == {1: "r#4", 3: "r#9"} and len(computed) == 1  # memory
    maps.cache.save()
    # another tune reading the file: a hit, nothing computed
    again = node_maps.NodeMaps(TimingCache(path), identity, "s1")
    assert again.get("float", {0, 2}, compute({})) == {1: "r#4", 3: "r#9"} and len(computed) == 1
    assert again.cache.hits == 1
    # any part of the key changed: a miss (another int8 set, map, model, inputs or settings)
    for other, int8_set, what in [(again, {0}, "float"), (again, {0, 2}, "int8 timing"),
                                  (node_maps.NodeMaps(TimingCache(path), {"model": "m2", "inputs": "i1"}, "s1"),
                                   {0, 2}, "float"),
                                  (node_maps.NodeMaps(TimingCache(path), {"model": "m1", "inputs": "i2"}, "s1"),
                                   {0, 2}, "float"),
                                  (node_maps.NodeMaps(TimingCache(path), identity, "s2"), {0, 2}, "float")]:
        n = len(computed)
        assert other.get(what, int8_set, compute({5: "x#1"})) == {5: "x#1"} and len(computed) == n + 1
    # a malformed stored value is not trusted
    cache = TimingCache(path)
    key = next(k for k in cache.values if '"float"' in k and '"0,2"' in k)
    for bad in ({"1": 4}, ["r#4"], {"one": "r#4"}):
        cache.values[key] = bad
        n = len(computed)
        got = node_maps.NodeMaps(cache, identity, "s1").get("float", {0, 2}, compute({1: "r#4", 3: "r#9"}))
        assert got == {1: "r#4", 3: "r#9"} and len(computed) == n + 1
    # without a cache identity (no model digest): computed every tune, nothing stored
    plain = node_maps.NodeMaps(TimingCache(None), None, "s1")
    assert plain.get("float", {0}, compute({1: "a#1"})) == {1: "a#1"} and plain.cache.values == {}


def _quantizer_session(cache):
    mod, params = bh.models.small_convnet()
    session = tune_plans.Session(mod, params, None, {}, None, False)
    quantizer = int8.Quantizer(mod, params, [[x] for x in _samples(3, 1)], cache, session.model_digest())
    maps = node_maps.NodeMaps(cache, quantizer.identity, "settings")
    base = bh.partition(mod, params)
    floats, _ = int8.layer_keys(base, quantizer, set())
    return session, quantizer, maps, floats


def _node_precisions(partitioned):
    """Each float anchor node's precision attr, in order (int8 nodes left out)."""
    return [n.get("attrs", {}).get("precision") for g in _graphs(partitioned).values() for n in g["nodes"]
            if n["op"] in ("conv2d", "dense", "matmul") and "src_scale" not in n.get("attrs", {})]


def test_a_mix_with_bf16_uses_a_stored_map_and_replaces_a_stale_one(monkeypatch):
    from byoc_hetero.backends.onednn.precision import effective_precision

    if effective_precision("bf16")[1]:
        pytest.skip("no native bf16 here")
    cache = TimingCache(None)
    session, quantizer, maps, floats = _quantizer_session(cache)
    assignment = {0: "int8", 1: "bf16", 2: "bf16", 3: "f32", 4: "f32"}
    calls = []
    real = stages.partition
    monkeypatch.setattr(stages, "partition", lambda *a, **k: calls.append(k.get("precision")) or real(*a, **k))
    builder = int8.MixBuilder(session, quantizer, floats, maps)
    first = builder._partition(assignment)  # a miss: the mix without bf16 first, then with it
    assert calls == [None, None] and _node_precisions(first) == ["bf16", "bf16", "f32", "f32"]
    # a second tune (the map from the cache, a new builder): one partition, the same module
    calls.clear()
    again = int8.MixBuilder(session, quantizer, floats, node_maps.NodeMaps(cache, quantizer.identity, "settings"))
    second = again._partition(assignment)
    assert calls == [None] and _node_precisions(second) == _node_precisions(first)
    x = [_samples(1, 7)[0]]
    assert np.array_equal(tune_plans.Built(first).run([x])[0][0], tune_plans.Built(second).run([x])[0][0])
    # a stale map (its keys name other nodes: a changed partition) is caught by the module made with it,
    # replaced, and the mix made again with the right keys
    key = next(k for k in cache.values if '"float"' in k)
    stored = cache.values[key]
    cache.values[key] = dict(zip(stored, reversed(list(stored.values()))))
    calls.clear()
    stale = node_maps.NodeMaps(cache, quantizer.identity, "settings")
    third = int8.MixBuilder(session, quantizer, floats, stale)._partition(assignment)
    assert stale.replaced == 1 and cache.values[key] == stored
    assert _node_precisions(third) == ["bf16", "bf16", "f32", "f32"] and calls == [None, None]


@needs_int8_kernels
def test_all_int8_partition_is_made_only_for_a_timing_key_not_in_the_cache(monkeypatch):
    cache = TimingCache(None)
    session, quantizer, maps, floats = _quantizer_session(cache)
    all_int8 = int8.AllInt8(session, quantizer, set(floats))
    keys = all_int8.timing_keys(maps)  # a miss: the partition is made
    assert all_int8.built._module is not None and len(keys) == 5
    assert keys == {i: int8.int8_timing_key(g, n) for i, (g, n) in all_int8.nodes.items()}
    fresh = int8.AllInt8(session, quantizer, set(floats))
    monkeypatch.setattr(stages, "partition", lambda *a, **k: pytest.fail("all-int8 partition made again"))
    assert fresh.timing_keys(node_maps.NodeMaps(cache, quantizer.identity, "settings")) == keys
    assert fresh.built._module is None


# -- the region documents of the float plan the units are timed on -------------------------------------


def test_timed_graphs_hit_miss_and_malformed():
    from byoc_hetero.tune.plan_errors import PlanErrors

    mod, params = bh.models.small_convnet()
    partitioned = bh.partition(mod, params)
    session = tune_plans.Session(mod, params, None, {}, None, False)
    cache = TimingCache(None)
    session.errors = PlanErrors(cache, "model", "settings")
    builds = []
    plans = [tune_plans.PlanResult("default", built=tune_plans.Built(partitioned)),
             tune_plans.PlanResult("tuned", built=tune_plans.Built(lambda: builds.append(1) or partitioned))]
    graphs = tune_plans.timed_graphs(session, plans, partitioned, cache)  # a miss: the plan is partitioned
    assert builds == [1] and graphs == _graphs(partitioned)
    plans[1] = tune_plans.PlanResult("tuned", built=tune_plans.Built(lambda: pytest.fail("partitioned again")))
    # JSON round trip, as a file would give it back: the same documents, the same timing keys
    cache.values = json.loads(json.dumps(cache.values))
    again = tune_plans.timed_graphs(session, plans, partitioned, cache)  # a hit
    assert again == graphs
    key = signature("region_graphs", attrs={"model": "model", "settings": "settings"})
    cache.values[key] = {"r": {"no nodes": []}}  # malformed: worked out again
    plans[1] = tune_plans.PlanResult("tuned", built=tune_plans.Built(lambda: builds.append(2) or partitioned))
    assert tune_plans.timed_graphs(session, plans, partitioned, cache) == graphs and builds == [1, 2]
    # one float plan (no decision of the other levels changed): the base's documents, nothing stored
    cache.values.clear()
    assert tune_plans.timed_graphs(session, plans[:1], partitioned, cache) == graphs and cache.values == {}


# -- a warm int8 tune, end to end ----------------------------------------------------------------------


@needs_int8_kernels
def test_a_warm_int8_tune_partitions_only_the_default_and_the_kept_plan(monkeypatch, tmp_path, codegen_by_the_rule):
    """The second tune of the same model with the same inputs and cache: every timing, error and
    node map from the cache; it partitions the default plan and the plan it returns, nothing else,
    and returns a module computing what the first tune's did."""
    from test_tune_int8 import _inject

    mod, params = bh.models.small_convnet()
    cal, held = _samples(6, 1), _samples(2, 2)
    _inject(monkeypatch, {"all int8"})
    args = dict(precisions=("f32", "bf16", "int8"), tolerance=0.5, calibration=cal, holdout=held, repeat=3,
                guard_rounds=1, cache=tmp_path / "c.json")
    m, report = bh.tune(mod, params, **args)
    assert report.precision.kept == "all int8"
    calls = []
    real = stages.partition
    monkeypatch.setattr(stages, "partition", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(tune_plans.Built, "run", lambda *a: pytest.fail("a plan run again on a warm cache"))
    m2, again = bh.tune(mod, params, **args)
    assert again.cache_misses == 0 and again.precision.kept == "all int8" and len(calls) == 2
    x = [_samples(1, 9)[0]]
    monkeypatch.undo()
    assert np.array_equal(tune_plans.Built(m).run([x])[0][0], tune_plans.Built(m2).run([x])[0][0])


# -- saving only what changed --------------------------------------------------------------------------


def test_cache_saves_only_when_something_was_stored(tmp_path):
    from byoc_hetero.tune import Timing, TimingCacheWarning

    path = tmp_path / "c.json"
    first = TimingCache(path)
    first.put("k", Timing(1e-3, 5))
    first.save()
    inode = path.stat().st_ino
    reader = TimingCache(path)
    assert reader.get("k") == Timing(1e-3, 5)
    reader.save()  # only read: the file is left as it is (an atomic save would give a new inode)
    assert path.stat().st_ino == inode
    reader.put_value("v", [1, 2])
    reader.save()
    assert path.stat().st_ino != inode and TimingCache(path).get_value("v") == [1, 2]
    # an ignored (corrupt) file is replaced by the next save, even with nothing stored
    path.write_text("not json {")
    with pytest.warns(TimingCacheWarning):
        broken = TimingCache(path)
    broken.save()
    assert len(TimingCache(path)) == 0 and json.loads(path.read_text())["format"] == "byoc-hetero-timing-cache"


@needs_int8_kernels
def test_int8_level_stores_into_the_cache_it_is_given_even_an_empty_one(monkeypatch):
    """An empty TimingCache is falsy (its length is 0): the int8 level once replaced it with a
    throwaway one, so nothing it measured reached the caller's file."""
    from test_tune_int8 import _inject

    mod, params = bh.models.small_convnet()
    _inject(monkeypatch, {"all int8"})
    cache = TimingCache(None)
    assert len(cache) == 0 and not cache
    kept, report = precision.choose_precisions(mod, params, bh.partition(mod, params), precisions=("f32", "int8"),
                                               tolerance=0.5, calibration=_samples(3, 1), holdout=_samples(1, 2),
                                               cache=cache, rounds=1, repeat=3)
    assert report.kept == "all int8" and cache.errors and any("int8_ranges" in k for k in cache.values)
