"""The precision level's one search (``tune/precision.py``) over a plan space, on a stand-in space.

No model, no timing: unit times and the errors a mix "measures" are given, so what is checked is the
search itself — the solver's mixes, the error budget each schedule moves, which mixes get built —
for both spaces' schedules (:class:`~byoc_hetero.tune.solver.RescaledBudget` of the float choices,
:class:`~byoc_hetero.tune.solver.BisectedBudget` of the quantized space).
"""

from __future__ import annotations

import math

import pytest

from byoc_hetero.tune.plans import PrecisionReport, PrecisionUnit
from byoc_hetero.tune.precision import fastest_each, measure_sensitivities, search
from byoc_hetero.tune.solver import BisectedBudget, RescaledBudget


class _Errors:
    """A mix's "measured" error: the sum of its bf16 units' errors alone, times ``factor`` where
    there are several (one unit alone measures its own error)."""

    def __init__(self, alone: dict[str, float], factor: float):
        self.alone, self.factor = alone, factor

    def error(self, table, which, built):
        chosen = [self.alone[k] for k, p in table.items() if p == "bf16"]
        return sum(chosen) * (self.factor if len(chosen) > 1 else 1.0)


class _Session:
    def __init__(self, errors):
        self.errors = errors

    def left_s(self) -> float:
        return math.inf

    def say(self, text: str) -> None:
        pass


class _Space:
    """Three units of one node each, bf16 twice as fast as f32, each alone 4e-3 off in bf16."""

    def __init__(self, schedule, factor: float):
        self.units = [PrecisionUnit(n, (f"r#{i}",), times={"f32": 2.0, "bf16": 1.0}) for i, n in enumerate("abc")]
        self.layers = [0, 1, 2]
        self.layer_of = {f"r#{i}": i for i in range(3)}
        self.edges = self.edge_costs = None
        self.session = _Session(_Errors({k: 4e-3 for k in self.layer_of}, factor))
        self._schedule, self.built = schedule, []

    def schedule(self):
        return self._schedule()

    def build(self, assignment):
        self.built.append(dict(assignment))
        return object()

    def prebuilt(self, precision):
        return None


@pytest.mark.parametrize("schedule", [RescaledBudget, BisectedBudget])
@pytest.mark.parametrize("factor,want", [(0.6, 3), (1.5, 1)])
def test_search_finds_the_fastest_mix_within_the_tolerance(schedule, factor, want):
    """Errors that add less than their sum (0.6x): a looser budget finds all three units in bf16
    (measured 7.2e-3); more (1.5x): the two-unit mix misses (1.2e-2), the budget tightens and one
    unit is kept. The search builds each distinct mix once."""
    space = _Space(schedule, factor)
    report = PrecisionReport(("f32", "bf16"), 1e-2)
    measure_sensitivities(space, report)
    assert [u.errors for u in space.units] == [{"bf16": 4e-3}] * 3 and all(u.error == 4e-3 for u in space.units)
    space.built.clear()  # (a sensitivity's table may come again in the search: its error is then cached)
    best = search(space, 1e-2, report)
    assert best is not None and best.bf16_nodes == want and best.calibration_error <= 1e-2
    assert best.calibration_error == pytest.approx(4e-3 * want * (factor if want > 1 else 1.0))
    assert len({frozenset(a.items()) for a in space.built}) == len(space.built)  # no mix built twice
    assert not report.search_cut


@pytest.mark.parametrize("schedule", [RescaledBudget, BisectedBudget])
def test_a_choice_over_the_tolerance_alone_is_not_offered(schedule):
    """Unit b alone in bf16 misses the tolerance (1.2e-2 > 1e-2); errors that cancel (0.5x) would let a
    mix with it meet the tolerance on the calibration inputs: such a mix is no candidate (on the int8
    test model natively, session 14, one measured 0.014 on the calibration inputs and 0.041 on the
    held-out ones). The other two units are found; b keeps f32."""
    space = _Space(schedule, 0.5)
    space.session.errors.alone["r#1"] = 1.2e-2
    report = PrecisionReport(("f32", "bf16"), 1e-2)
    measure_sensitivities(space, report)
    assert space.units[1].errors == {"bf16": 1.2e-2}
    space.built.clear()  # (b alone was built for its sensitivity)
    best = search(space, 1e-2, report)
    assert best is not None and best.table == {"r#0": "bf16", "r#1": "f32", "r#2": "bf16"}
    assert all(a[1] == "f32" for a in space.built if len(set(a.values())) > 1)  # b in no mix built


def test_budget_schedules_move_as_documented():
    rescaled = RescaledBudget()
    assert rescaled.next(1e-2, 2e-2, 1e-2, True) == pytest.approx(1e-2 * 0.8 * 0.5)  # a miss: tighter
    assert rescaled.next(1e-2, 9e-3, 1e-2, True) is None  # within 1.25x of the tolerance: stop
    assert rescaled.next(1e-2, 2e-3, 1e-2, True) == pytest.approx(4e-2)  # room: at most 4x looser
    assert rescaled.next(1e-2, 2e-3, 1e-2, False) is None  # a mix seen before, or all f32: stop
    bisected = BisectedBudget()
    assert bisected.next(1e-2, 2e-3, 1e-2, True) == pytest.approx(4e-2)  # met: raised
    assert bisected.next(4e-2, 2e-2, 1e-2, True) == pytest.approx(math.sqrt(1e-2 * 4e-2))  # then bisected
    assert bisected.next(2.1e-2, 2e-2, 1e-2, False) is not None
    assert bisected.next(2.05e-2, 5e-3, 1e-2, False) is None  # met and missed within 10%: stop


def test_fastest_each_keeps_f32_on_a_tie_and_skips_a_single_precision_plan():
    space = _Space(RescaledBudget, 1.0)
    report = PrecisionReport(("f32", "bf16"), 1e-2)
    space.units[1].times["bf16"] = 2.0  # a tie: f32 kept
    mix = fastest_each(space, report)
    assert mix is not None and mix.table == {"r#0": "bf16", "r#1": "f32", "r#2": "bf16"}
    space.units[1].times["bf16"] = 1.0
    assert fastest_each(space, report) is None  # all bf16: the all-bf16 candidate already


class _Timings:
    """Stand-in for :class:`~byoc_hetero.tune.plan_errors.PlanErrors`'s end-to-end timings: given ones, in order."""

    def __init__(self, timings):
        self.given = timings

    def timings(self, tables, sample, rounds, repeat, measure):
        assert len(tables) == len(self.given)
        return list(self.given)


@pytest.mark.parametrize("mix_ms,spread,kept", [
    (9.9, 0.05, "all bf16"),    # 1% faster, within a 5% spread: a tie, the smaller error wins
    (9.9, 0.0, "tuned mix"),    # 1% faster with no spread: faster wins
    (8.0, 0.05, "tuned mix"),   # 20% faster: beyond the spread
    (10.4, 0.05, "default"),    # the default within the spread of the fastest: float32 first
])
def test_pick_breaks_ties_within_the_spread_by_error(mix_ms, spread, kept):
    """End-to-end plans closer than their timings' spread are a tie; a tie keeps the smaller error (a float32 plan
    first), so a noisy 1% does not buy twice the error — yet a real gain, or any gain measured without spread, wins."""
    from byoc_hetero.tune.cache import Timing
    from byoc_hetero.tune.plans import PlanResult, pick

    default = PlanResult("default")
    bf16 = PlanResult("all bf16", {"a": "bf16", "b": "bf16"}, calibration_error=2e-3, holdout_error=2.5e-3)
    mix = PlanResult("tuned mix", {"a": "int8", "b": "bf16"}, calibration_error=4e-3, holdout_error=5e-3)
    default_ms = 10.4 if kept == "default" else 12.0
    timings = [Timing(default_ms * 1e-3, 9, spread), Timing(10.0e-3, 9, spread), Timing(mix_ms * 1e-3, 9, spread)]
    report = PrecisionReport(("f32", "bf16", "int8"), 1e-2)
    best = pick(report, [default], [bf16, mix], [], 3, 3, _Timings(timings))
    assert best.name == kept and report.kept == kept
