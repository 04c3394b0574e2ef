"""The option level of ``bh.tune`` (issue 38): an option a backend declares tunable
(``Option(..., tune=Tunable(...))``) is chosen per region from timings, a value that changes numerics
only within the tolerance (stated by the backend, then measured against the default); and the
precision level reading which node kinds take which precisions (and which are applied by quantizing)
from the backend.

No measured timing decides what a test asserts: the level's timings are injected (``time_all``
replaced) or come from a cache the test filled; the numerics (the error against the default) are
measured for real."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.rules import Option, Tunable, Variant
from byoc_hetero.tune import Timing, TimingCache

from conftest import graph

SHAPE = (4, 64)


def _softmax_model():
    return graph({"x": SHAPE}, lambda emit, v: relax.op.nn.softmax(v, axis=-1))


def _region_ir(part) -> str:
    (module,) = [m for m in part.attrs["external_mods"] if str(m.kind) == "llvm"]
    return module.inspect_source("ll")


def _run(part, x):
    return relax.VirtualMachine(relax.build(part, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _softmax(x):
    y = x.astype("float64")
    e = np.exp(y - y.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _flag(value):
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise bh.RuleError(f"expected true or false, got {value!r}")


def test_a_tunable_option_takes_a_per_region_table(restore_rules):
    """A tunable option: a plain value or ``{region key: value}`` (a mapping or JSON), each value
    checked by the option's check; ``region_option`` gives a region its entry, else the default."""
    backend = bh.register_target("opt_user", codegen="onednn", options={
        "unroll": Option("unroll", "unroll factor", 1, lambda v: int(v), Tunable((1, 4))),
        "plain": Option("plain", "not tunable", None)})
    assert backend.check_options({"unroll": {"k1": "4"}}) == {"unroll": '{"k1": 4}'}
    assert backend.check_options({"unroll": '{"k1": 2}'}) == {"unroll": '{"k1": 2}'}
    assert backend.check_options({"unroll": "3"}) == {"unroll": 3}
    assert backend.check_options({"plain": '{"a": 1}'}) == {"plain": '{"a": 1}'}  # not tunable: as given
    given = backend.check_options({"unroll": {"k1": 4}})
    assert backend.region_option(given, "unroll", "k1") == 4 and backend.region_option(given, "unroll", "k2") == 1
    assert backend.region_option({"unroll": 2}, "unroll", "k2") == 2 and backend.region_option({}, "unroll", "k") == 1
    assert list(backend.tunable_options()) == ["unroll"]
    with pytest.raises(bh.RuleError, match="per-region option table must be a JSON object"):
        backend.check_options({"unroll": '{"k1": '})


def test_option_choices_follow_the_stated_error_and_the_tolerance():
    from byoc_hetero.tune.options import option_choices

    exact = Option("o", "", False, _flag, Tunable((False, True)))
    assert option_choices(exact, None) == ((False, True), {})
    numeric = Option("o", "", False, _flag, Tunable((True,), 2e-6))  # the default is tried first anyway
    assert option_choices(numeric, 1e-5) == ((False, True), {})
    values, refused = option_choices(numeric, None)
    assert values == (False,) and "give bh.tune a tolerance" in refused["true"]
    values, refused = option_choices(numeric, 1e-7)
    assert values == (False,) and "up to 2e-06 (stated by the backend), above the tolerance 1e-07" in refused["true"]


def test_option_error_counts_equal_specials_as_equal_and_others_as_infinite():
    from byoc_hetero.tune.options import relative_error

    want = [np.array([1.0, np.inf, np.nan, -2.0], "float32")]
    assert relative_error(want, want) == 0.0
    assert relative_error([np.array([1.0, np.inf, np.nan, -2.5], "float32")], want) == 0.25
    assert relative_error([np.array([1.0, 5.0, np.nan, -2.0], "float32")], want) == float("inf")
    assert relative_error([np.array([1.0, np.inf, 0.0, -2.0], "float32")], want) == float("inf")


def test_fast_math_per_region_table_reaches_only_that_region():
    """tvm_cpu's fast_math given per region: the region the table names has no scalar exp in its IR,
    a region it does not name keeps expf; both compute softmax."""
    from byoc_hetero.tune.codegen import candidate_regions

    mod = _softmax_model()
    (region,) = candidate_regions(mod, targets=("tvm_cpu",))
    x = np.random.default_rng(0).standard_normal(SHAPE).astype("float32")
    for table, fast in (({region.key: True}, True), ({"another": True}, False)):
        part = bh.partition(mod, target="tvm_cpu", require_heavy_op=False,
                            options={"tvm_cpu": {"fast_math": json.dumps(table)}})
        ir = _region_ir(part)
        assert ("expf" not in ir and "llvm.exp" not in ir) == fast
        np.testing.assert_allclose(_run(part, x), _softmax(x), rtol=1e-5, atol=1e-7)


def _inject(monkeypatch, fastest, option_times):
    """The codegen level: backend ``fastest`` faster than the region's own and llvm; the option
    level: ``option_times`` (value text -> seconds); the end-to-end check: tuned faster."""
    from byoc_hetero.tune import codegen, options, tuner

    def codegen_times(fns, repeat, budget_s):
        assert fastest in fns, list(fns)
        return {n: Timing(0.5e-3 if n == fastest else 2e-3, 5) for n in fns}, ""

    calls = []

    def option_level_times(fns, repeat, budget_s):
        calls.append(sorted(fns))
        return {n: Timing(option_times[n], 5) for n in fns}, ""

    monkeypatch.setattr(codegen, "time_all", codegen_times)
    monkeypatch.setattr(options, "time_all", option_level_times)
    monkeypatch.setattr(tuner, "_guard", lambda *a: (Timing(2e-3, 5), Timing(1e-3, 5)))
    return calls


def _combo(schedule, fast):
    return json.dumps([schedule, fast])


@pytest.fixture
def small_search(monkeypatch):
    """tvm_cpu's MetaSchedule search kept small (3 candidates), this process's records emptied; skipped with the
    reason where this TVM cannot run it."""
    from byoc_hetero.backends.tvm_cpu import meta_schedule

    why = meta_schedule.unavailable()
    if why:
        pytest.skip(why)
    monkeypatch.setattr(meta_schedule, "TRIALS", 3)
    meta_schedule.forget()
    yield meta_schedule
    meta_schedule.forget()


@pytest.mark.parametrize("tolerance", [1e-5, None])
def test_option_level_picks_fast_math_within_the_tolerance(monkeypatch, tmp_path, tolerance, small_search):
    """fast_math (tvm_cpu) measured faster: chosen for the region where the tolerance admits the
    error the backend states (the region's measured error against the default within it), applied
    as the per-region table (no expf in the tuned region's IR); without a tolerance it is not tried
    and the report says why. tvm_cpu's two tunable options (schedule, fast_math) are one unit, every
    combination timed (MetaSchedule's schedule injected slower here)."""
    times = {_combo("dlight", False): 1e-3, _combo("dlight", True): 0.5e-3,
             _combo("meta_schedule", False): 2e-3, _combo("meta_schedule", True): 1.5e-3}
    calls = _inject(monkeypatch, "tvm_cpu", times)
    mod = _softmax_model()
    tuned, report = bh.tune(mod, targets=("onednn", "tvm_cpu"), tolerance=tolerance, cache=tmp_path / "c.json",
                            repeat=3, guard_rounds=1)
    (d,) = report.options
    assert d.unit.option == "schedule + fast_math" and d.default == ("dlight", False) and report.kept == "tuned"
    fast = d.chosen[1]
    if tolerance is None:
        assert d.chosen == ("dlight", False) and not calls
        assert "give bh.tune a tolerance" in d.refused["fast_math=true"]
        assert "give bh.tune a tolerance" in d.refused['schedule="meta_schedule"']
    else:
        assert d.chosen == ("dlight", True) and calls == [sorted(times)]
        assert 0.0 <= d.errors[_combo("dlight", True)] <= 2e-6
        assert len(small_search.stored()) == 2  # a search for the region with and without fast_math
    assert "fast_math" in str(report) and "options: 1 region options" in str(report)
    ir = _region_ir(tuned)
    assert ("expf" not in ir and "llvm.exp" not in ir) == fast
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    np.testing.assert_allclose(_run(tuned, x), _softmax(x), rtol=1e-5, atol=1e-7)


def test_option_level_picks_meta_schedule_and_keeps_its_record_in_the_timing_cache(monkeypatch, tmp_path,
                                                                                   small_search):
    """tvm_cpu's schedule: MetaSchedule's (injected faster) chosen for the region within the tolerance, applied as
    the per-region table; its record is kept in the timing cache's file, and a second tune with that file, in a
    process that forgot its records, replays it without searching and builds the same code; the outputs are
    softmax's."""
    times = {_combo("dlight", False): 1e-3, _combo("dlight", True): 0.9e-3,
             _combo("meta_schedule", False): 0.5e-3, _combo("meta_schedule", True): 0.6e-3}
    _inject(monkeypatch, "tvm_cpu", times)
    mod, cache = _softmax_model(), tmp_path / "c.json"
    tuned, report = bh.tune(mod, targets=("onednn", "tvm_cpu"), tolerance=1e-5, cache=cache, repeat=3, guard_rounds=1)
    (d,) = report.options
    assert d.chosen == ("meta_schedule", False) and d.errors[_combo("meta_schedule", False)] <= 1e-5, d.why()
    doc = json.loads(cache.read_text())
    kept = [k for k in doc["values"] if small_search.KEY_KIND in k]
    assert len(kept) == 2 and all(doc["values"][k]["trace"] for k in kept)
    small_search.forget()
    monkeypatch.setattr(small_search, "search", lambda *a, **k: pytest.fail("searched despite the cached record"))
    again, report2 = bh.tune(mod, targets=("onednn", "tvm_cpu"), tolerance=1e-5, cache=cache, repeat=3,
                             guard_rounds=1)
    assert report2.options[0].chosen == ("meta_schedule", False) and report2.options[0].cached
    same = [re.sub(r'"0x[0-9a-f]+"', '"0x"', _region_ir(m)) for m in (again, tuned)]  # metadata names addresses
    assert same[0] == same[1]
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    np.testing.assert_allclose(_run(tuned, x), _softmax(x), rtol=1e-5, atol=1e-7)


TARGETS = ("onednn", "mine_fast")


def _user_backend_with_a_tunable_option():
    """A user's backend ``mine_fast`` (softmax and multiply), registered through the public API: its
    codegen compiles regions with TVM (tvm_cpu's ``compile_regions``) and its option ``approx``, per
    region, turns on the polynomial exp; it states (wrongly) an error of at most 1e-12."""
    from byoc_hetero.backends.tvm_cpu.codegen import compile_regions
    from byoc_hetero.passes.retarget_regions import region_key_of

    def codegen(funcs, options, constant_names):
        backend = bh.rules.get_target("mine_fast")
        return [compile_regions(list(funcs), fast=lambda f: bool(backend.region_option(options, "approx",
                                                                                       region_key_of(f))))]

    bh.register_target("mine_fast", codegen=codegen, options={
        "approx": Option("approx", "a fast exp, per region", False, _flag, Tunable((False, True), 1e-12))})
    for op in ("relax.nn.softmax", "relax.multiply"):
        bh.op_rule(op, target="mine_fast")(lambda call: True)


def test_user_backend_tunable_option_refused_where_its_measured_error_exceeds_the_tolerance(
        monkeypatch, tmp_path, restore_rules):
    """A user's backend declaring a tunable option that changes numerics: tried (its stated error
    is within the tolerance), measured faster, but its outputs differ from the default's by more
    than the tolerance: refused, the default kept, the measured error in the report. A second tune
    with the same cache builds nothing: timings and the error come back from it."""
    from byoc_hetero.tune import options

    _user_backend_with_a_tunable_option()
    calls = _inject(monkeypatch, "mine_fast", {"false": 1e-3, "true": 0.2e-3})
    mod = _softmax_model()
    cache = TimingCache(tmp_path / "c.json")
    tuned, report = bh.tune(mod, targets=TARGETS, tolerance=1e-9, cache=cache, repeat=3, guard_rounds=1)
    (d,) = report.options
    assert d.unit.backend == "mine_fast" and d.chosen is False and calls == [["false", "true"]]
    assert d.errors["true"] > 1e-9 and "measured error" in d.refused["true"]
    assert "above the tolerance 1e-09" in str(report)
    assert "expf" in _region_ir(tuned) or "llvm.exp" in _region_ir(tuned)
    monkeypatch.setattr(options, "runner", lambda *a: pytest.fail("built again despite the cache"))
    _, again = bh.tune(mod, targets=TARGETS, tolerance=1e-9, cache=tmp_path / "c.json", repeat=3, guard_rounds=1)
    (warm,) = again.options
    assert warm.cached and warm.timings == d.timings and warm.errors == d.errors and warm.chosen is False
    assert len(calls) == 1


def _user_backend_with_two_tunable_options(seen: list):
    """A user's backend ``mine_two`` (softmax and multiply) compiling with TVM, with two tunable options
    that change no numerics (``vector`` and ``unroll``); ``seen`` gets the options each codegen call
    is given."""
    from byoc_hetero.backends.tvm_cpu.codegen import compile_regions

    def codegen(funcs, options, constant_names):
        seen.append(dict(options or {}))
        return [compile_regions(list(funcs))]

    bh.register_target("mine_two", codegen=codegen, options={
        "vector": Option("vector", "vectorize", False, _flag, Tunable((False, True))),
        "unroll": Option("unroll", "unroll factor", 1, lambda v: int(v), Tunable((1, 4)))})
    for op in ("relax.nn.softmax", "relax.multiply"):
        bh.op_rule(op, target="mine_two")(lambda call: True)


def test_options_of_one_backend_are_decided_together(monkeypatch, tmp_path, restore_rules):
    """Issue 38 (c): a backend's tunable options interact, so a region's unit is their combination:
    here each option alone at the other's default is no faster than the defaults (within the spread),
    both together are: the combination is chosen and each option applied as its own per-region table.
    Beyond MAX_COMBINATIONS the options are decided one at a time."""
    from byoc_hetero.tune import options

    seen: list = []
    _user_backend_with_two_tunable_options(seen)
    together = {"[false, 1]": 1e-3, "[true, 1]": 1e-3, "[false, 4]": 1e-3, "[true, 4]": 0.4e-3}
    calls = _inject(monkeypatch, "mine_two", together | {"false": 1e-3, "true": 1e-3, "1": 1e-3, "4": 1e-3})
    _, report = bh.tune(_softmax_model(), targets=("onednn", "mine_two"), cache=tmp_path / "c.json", repeat=3,
                        guard_rounds=1)
    (d,) = report.options
    assert d.unit.options == ("vector", "unroll") and d.default == (False, 1) and d.chosen == (True, 4)
    assert calls == [sorted(together)] and d.changes() == {"vector": True, "unroll": 4}
    key = d.unit.region.key
    tables = {"vector": json.dumps({key: True}), "unroll": json.dumps({key: 4})}
    assert options.options_of([d]) == {"mine_two": tables}
    assert any(all(str(given.get(o)) == t for o, t in tables.items()) for given in seen)  # what the codegen got
    assert "options vector + unroll" in str(report)
    declared = bh.rules.get_target("mine_two").options
    assert options.combinations(declared, ("vector", "unroll")) == 4
    monkeypatch.setattr(options, "MAX_COMBINATIONS", 3)
    _, alone = bh.tune(_softmax_model(), targets=("onednn", "mine_two"), cache=tmp_path / "d.json", repeat=3,
                       guard_rounds=1)
    assert [d.unit.options for d in alone.options] == [("vector",), ("unroll",)]


def test_tune_rejects_calibration_without_several_precisions_but_takes_a_tolerance():
    from byoc_hetero.tune.precision import check_precisions

    assert check_precisions(("f32",), 1e-3, None, None) == ("f32",)
    with pytest.raises(bh.RuleError, match="calibration inputs are for choosing among several precisions"):
        check_precisions(("f32",), None, [np.zeros(3)], None)
    with pytest.raises(bh.RuleError, match="finite number >= 0"):
        check_precisions(("f32",), -1.0, None, None)


def test_precisions_and_node_kinds_are_read_from_the_backends(restore_rules):
    """Issue 38: which node kinds take a precision and which precisions are applied by quantizing
    are what the backends declare (``Variant.level`` / ``Variant.applied``), not lists in tune/."""
    from byoc_hetero.tune.plans import offered_precisions, precision_ops, quantized_precisions
    from byoc_hetero.tune.precision import check_precisions

    assert precision_ops("onednn") == ("conv2d", "dense", "matmul")
    assert quantized_precisions(["onednn"]) == ("int8",) and offered_precisions(["onednn"]) == ("f32", "bf16", "int8")
    bh.register_target("mine_q", codegen="onednn", variants={"dense": (
        Variant("dense", "int4", "4-bit weights", level="precision", applied="quantize"),)})
    assert precision_ops("mine_q") == ("dense",) and quantized_precisions(["onednn", "mine_q"]) == ("int8", "int4")
    x = [np.zeros((1, 4), "float32")] * 2
    assert check_precisions(("f32", "int4"), 1e-2, x, None, ("onednn", "mine_q")) == ("f32", "int4")
    with pytest.raises(bh.RuleError, match="unknown precision 'int4'; the backends onednn offer f32, bf16, int8"):
        check_precisions(("f32", "int4"), 1e-2, x, None)
    with pytest.raises(bh.RuleError, match=r"precisions=\('int4',\) alone"):
        check_precisions(("int4",), None, None, None, ("mine_q",))
