"""Choosing one candidate per region from measured costs, counting the copies between devices.

The tuner measures, for each region (a group of ops the stages made, or a single llvm op), a set of
:class:`Choice` s — each a device, a codegen, a precision and an algorithm, with its time and its
error contribution — and the bytes of every tensor between regions. :func:`solve` picks one choice
per region to minimise the total time

    sum of the chosen choices' times  +  sum of the copies their devices imply,

subject to the sum of the chosen choices' errors staying within a tolerance (the per-layer
sensitivities the tuner measured; the chosen plan's real error is then checked end to end on
held-out inputs, since errors need not add).

Copies follow the placement pass's rule (seed 004): a tensor produced on device ``p`` and read on
devices ``d1, d2, ...`` is copied once to each distinct ``di != p`` — one input feeding two
devices costs two copies only if the devices differ from each other and from the producer, and two
readers on one other device share one copy. Model inputs live on ``Problem.input_device`` and
model outputs must end there too.

The search is exact (depth-first branch and bound in topological order, bounded below by the
fastest remaining choices and the smallest remaining errors) and returns the best plan found when
``budget_s`` runs out, marked ``exact=False``. It handles the dozens to hundreds of regions a model
gives because most regions' choices are all on one device, where the bound is tight; the greedy
start (each region's fastest choice that fits the error budget) makes a cut search still useful.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

CopyCost = Callable[[str, str, int], float]


@dataclass(frozen=True)
class Choice:
    """One way to run a region: where and how, and what it costs."""

    name: str  # e.g. "bf16", "winograd"
    device: str  # e.g. "cpu:0", "cuda:0"
    time_s: float
    error: float = 0.0  # its contribution to the output error (0 for the float32 reference)


@dataclass
class Region:
    """A region of the model: the tensors it reads and writes and its candidate choices."""

    name: str
    choices: Sequence[Choice]
    inputs: Sequence[str] = ()
    outputs: Sequence[str] = ()


@dataclass
class Problem:
    """Regions in topological order, the bytes of each tensor, and the cost of a copy."""

    regions: Sequence[Region]
    tensor_bytes: Mapping[str, int]
    copy_cost: CopyCost
    model_inputs: Sequence[str] = ()
    model_outputs: Sequence[str] = ()
    input_device: str = "cpu:0"
    #: a model input lives where its first reader runs (``bh.place``'s rule for parameters: the VM
    #: moves it there when called, one copy when that is not ``input_device``), so a later reader on
    #: another device copies it from there; False: it stays on ``input_device``
    inputs_follow_first_reader: bool = False


@dataclass
class Solution:
    """The chosen choice per region, the plan's modelled time and error, and how it was found."""

    choices: dict[str, Choice]
    time_s: float
    error: float
    exact: bool
    explored: int = 0
    notes: list[str] = field(default_factory=list)


def linear_copy_cost(latency_s: Mapping[tuple[str, str], float],
                     bytes_per_s: Mapping[tuple[str, str], float]) -> CopyCost:
    """A copy cost from measured link figures: ``latency + bytes / bandwidth`` per device pair
    (pairs in either order); the same device costs nothing, an unmeasured pair is an error."""

    def cost(src: str, dst: str, nbytes: int) -> float:
        if src == dst:
            return 0.0
        key = (src, dst) if (src, dst) in bytes_per_s else (dst, src)
        if key not in bytes_per_s:
            raise KeyError(f"no measured copy cost between {src} and {dst}")
        return latency_s.get(key, 0.0) + nbytes / bytes_per_s[key]

    return cost


class _Search:
    """Depth-first branch and bound over the regions' choices (see :func:`solve`)."""

    def __init__(self, problem: Problem, tolerance: float, deadline: float):
        self.p = problem
        self.tolerance = tolerance
        self.deadline = deadline
        self.regions = list(problem.regions)
        self.producer: dict[str, int] = {}
        for i, r in enumerate(self.regions):
            for t in r.outputs:
                self.producer[t] = i
        # readers of each tensor, and at which region index the tensor's last reader is decided
        self.readers: dict[str, list[int]] = {}
        for i, r in enumerate(self.regions):
            for t in r.inputs:
                self.readers.setdefault(t, []).append(i)
        n = len(self.regions)
        self.min_time_after = [0.0] * (n + 1)
        self.min_error_after = [0.0] * (n + 1)
        for i in range(n - 1, -1, -1):
            self.min_time_after[i] = self.min_time_after[i + 1] + min(c.time_s for c in self.regions[i].choices)
            self.min_error_after[i] = self.min_error_after[i + 1] + min(c.error for c in self.regions[i].choices)
        self.best: list[Choice] | None = None
        self.best_time = math.inf
        self.explored = 0
        self.cut = False

    def _source_device(self, tensor: str, chosen: list[Choice], plan: Sequence[Choice] | None = None) -> str:
        i = self.producer.get(tensor)
        if i is None and self.p.inputs_follow_first_reader:
            first = self.readers.get(tensor, [len(chosen)])[0]
            return chosen[first].device if first < len(chosen) else self.p.input_device
        if i is not None and i >= len(chosen) and plan is not None:
            return plan[i].device  # produced by a region listed later (a complete plan knows its device)
        return self.p.input_device if i is None else chosen[i].device

    def copies_for(self, index: int, choice: Choice, chosen: list[Choice], copied: dict[str, set[str]],
                   plan: Sequence[Choice] | None = None) -> tuple[float, list[tuple[str, str]]]:
        """The copies region ``index`` adds by running on ``choice.device`` (each tensor is copied
        once per destination device), and the (tensor, device) pairs it adds to ``copied``.
        ``plan``: every region's choice, for a complete plan whose regions are not in topological
        order (the precision level's layer groups: a group may read a later group's output)."""
        cost, added = 0.0, []
        region = self.regions[index]
        for t in region.inputs:
            src = self._source_device(t, chosen, plan)
            if src != choice.device and choice.device not in copied.get(t, ()):
                cost += self.p.copy_cost(src, choice.device, int(self.p.tensor_bytes.get(t, 0)))
                added.append((t, choice.device))
        for t in region.outputs:  # a model output goes back to the input device
            if t in self.p.model_outputs and choice.device != self.p.input_device:
                cost += self.p.copy_cost(choice.device, self.p.input_device,
                                         int(self.p.tensor_bytes.get(t, 0)))
        return cost, added

    def run(self, index: int, chosen: list[Choice], spent: float, error: float,
            copied: dict[str, set[str]]) -> None:
        if index == len(self.regions):
            if spent < self.best_time:
                self.best, self.best_time = list(chosen), spent
            return
        self.explored += 1
        if self.explored % 256 == 0 and time.perf_counter() > self.deadline:
            self.cut = True
        if self.cut:
            return
        options = []
        for choice in self.regions[index].choices:
            if error + choice.error + self.min_error_after[index + 1] > self.tolerance:
                continue
            cost, added = self.copies_for(index, choice, chosen, copied)
            options.append((spent + choice.time_s + cost, choice, added))
        for total, choice, added in sorted(options, key=lambda o: o[0]):
            if total + self.min_time_after[index + 1] >= self.best_time:
                break  # sorted: every later option is bound to be worse too
            for t, dev in added:
                copied.setdefault(t, set()).add(dev)
            chosen.append(choice)
            self.run(index + 1, chosen, total, error + choice.error, copied)
            chosen.pop()
            for t, dev in added:
                copied[t].discard(dev)


def plan_cost(problem: Problem, choices: Mapping[str, Choice], search: _Search | None = None) -> tuple[float, float]:
    """The modelled (time, error) of a complete plan: region times, copies, summed errors.
    ``search``: a ``_Search`` of ``problem`` to reuse (its tables of producers and readers; making
    them was half of :func:`improve`'s time, which costs thousands of plans)."""
    search = search if search is not None else _Search(problem, math.inf, math.inf)
    chosen: list[Choice] = []
    plan = [choices[r.name] for r in search.regions]
    copied: dict[str, set[str]] = {}
    spent = error = 0.0
    for i, region in enumerate(search.regions):
        choice = plan[i]
        cost, added = search.copies_for(i, choice, chosen, copied, plan)
        for t, dev in added:
            copied.setdefault(t, set()).add(dev)
        chosen.append(choice)
        spent += choice.time_s + cost
        error += choice.error
    return spent, error


def plan_copies(problem: Problem, choices: Mapping[str, Choice]) -> list[tuple[str, str]]:
    """The copies a complete plan implies: ``(tensor, destination device)`` per copy, a model
    output's copy back to the input device included."""
    search = _Search(problem, math.inf, math.inf)
    chosen: list[Choice] = []
    plan = [choices[r.name] for r in search.regions]
    copied: dict[str, set[str]] = {}
    out = []
    for i, region in enumerate(search.regions):
        choice = plan[i]
        _, added = search.copies_for(i, choice, chosen, copied, plan)
        for t, dev in added:
            copied.setdefault(t, set()).add(dev)
        out += added
        out += [(t, problem.input_device) for t in region.outputs
                if t in problem.model_outputs and choice.device != problem.input_device]
        chosen.append(choice)
    return out


def solve(problem: Problem, tolerance: float | None = None, budget_s: float | None = None) -> Solution:
    """The plan of least modelled time whose summed error is within ``tolerance`` (None: any).

    Exact unless ``budget_s`` runs out first; then the best plan found so far, with
    ``exact=False`` and a note. When no plan meets the tolerance, the plan of least error is
    returned with a note saying so (the caller decides whether to fall back to float32).
    """
    tol = math.inf if tolerance is None else float(tolerance)
    for r in problem.regions:
        if not r.choices:
            raise ValueError(f"region {r.name} has no candidate choice")
    deadline = math.inf if budget_s is None else time.perf_counter() + float(budget_s)
    search = _Search(problem, tol, deadline)
    notes: list[str] = []
    if search.min_error_after[0] > tol:
        notes.append(f"no plan meets tolerance {tol:g}: the least summed error is "
                     f"{search.min_error_after[0]:.3g}; returning the plan of least error")
        least = {r.name: min(r.choices, key=lambda c: (c.error, c.time_s)) for r in problem.regions}
        t, e = plan_cost(problem, least)
        return Solution(least, t, e, exact=False, notes=notes)
    search.run(0, [], 0.0, 0.0, {})
    if search.best is None:  # cut before any complete plan: fall back on the least-error plan
        least = {r.name: min(r.choices, key=lambda c: (c.error, c.time_s)) for r in problem.regions}
        t, e = plan_cost(problem, least)
        notes.append("the search budget ran out before a complete plan; returning the least-error plan")
        return Solution(least, t, e, exact=False, explored=search.explored, notes=notes)
    if search.cut:
        notes.append(f"the search budget ({budget_s:g} s) ran out: best plan so far, not proven optimal")
    chosen = {r.name: c for r, c in zip(search.regions, search.best)}
    t, e = plan_cost(problem, chosen)
    return Solution(chosen, t, e, exact=not search.cut, explored=search.explored, notes=notes)


def improve(problem: Problem, start: Mapping[str, Choice], tolerance: float | None = None,
            max_run: int = 8, max_passes: int = 50) -> Solution:
    """Local search from the complete plan ``start`` (whose summed error must be within
    ``tolerance``): moves of one region to another choice, or of a run of up to ``max_run``
    consecutive regions to one choice name (all int8, all bf16, ...), taken while one lowers the
    modelled time (:func:`plan_cost`, copies included) within the tolerance, best move first.

    Why: :func:`solve`'s bound ignores copies, which is tight when most regions' choices share a
    device; when every region has choices in two domains with a cost between them (the int8 choice's
    precision domains, :mod:`.edges`) the exact search runs out of any budget on a ResNet-50's 54
    units. Contiguous runs are the moves that matter there: they remove edges that single flips
    cannot remove one at a time. Not exact: ``exact=False``."""
    tol = math.inf if tolerance is None else float(tolerance)
    names = [r.name for r in problem.regions]
    by_name = {r.name: {c.name: c for c in r.choices} for r in problem.regions}
    current = dict(start)
    tables = _Search(problem, math.inf, math.inf)
    best_time, best_error = plan_cost(problem, current, tables)
    if best_error > tol:
        raise ValueError(f"the start plan's summed error {best_error:.3g} exceeds the tolerance {tol:g}")
    explored = 0
    for _ in range(max_passes):
        move = None
        for i in range(len(names)):
            for length in range(1, max_run + 1):
                run = names[i:i + length]
                if len(run) < length:
                    break
                for option in {c for n in run for c in by_name[n]}:
                    if any(option not in by_name[n] for n in run) or all(current[n].name == option for n in run):
                        continue
                    trial = dict(current) | {n: by_name[n][option] for n in run}
                    t, e = plan_cost(problem, trial, tables)
                    explored += 1
                    if e <= tol and t < best_time - 1e-15:
                        move, best_time, best_error = trial, t, e
        if move is None:
            break
        current = move
    return Solution(current, best_time, best_error, exact=False, explored=explored,
                    notes=["local search over single regions and runs of regions (copies counted)"])


class RescaledBudget:
    """The error budget of a mix search whose summed errors stand in for a mix's real one, rescaled
    by what each mix measured: ``tolerance / measured`` (times 0.8 after a miss, at most 4x after a
    hit); the search stops on a mix close to the tolerance (within 1.25x), on nothing to build (all
    float32) and on a mix measured before. The budget of a space whose choices are one domain
    (float32 and bf16 nodes of one partition), up to :attr:`rounds` rounds."""

    rounds = 4

    def next(self, budget: float, measured: float, tolerance: float, fresh: bool) -> float | None:
        """The next round's budget after a mix that measured ``measured`` (``fresh``: built this
        round, not all float32 nor seen before); None: stop."""
        if not fresh:
            return None
        if measured > tolerance:
            return budget * 0.8 * tolerance / measured
        if measured > 0 and tolerance / measured < 1.25:
            return None  # close to the tolerance already: little to gain from a looser budget
        return budget * (4.0 if measured == 0 else min(4.0, tolerance / measured))


class BisectedBudget:
    """The error budget searched between the largest budget whose mix met the tolerance (``lo``)
    and the smallest whose mix missed (``hi``): their geometric mean once both are known, else
    rescaled by what was measured (lowered after a miss, raised at least 2x after a hit); stops
    once they are within 10%. The budget of a space with choices in two domains (the int8 one and
    the float one, a conversion between them): its summed errors stand in less well, so it takes
    up to :attr:`rounds` rounds, a mix met twice (or all float32, error 0) measured once."""

    rounds = 8

    def __init__(self) -> None:
        self.lo, self.hi = 0.0, math.inf

    def next(self, budget: float, measured: float, tolerance: float, fresh: bool) -> float | None:
        """The next round's budget after a mix that measured ``measured``; None: stop."""
        if measured <= tolerance:
            self.lo = max(self.lo, budget)
        else:
            self.hi = min(self.hi, budget)
        if self.hi < 1.1 * self.lo:
            return None
        if self.lo > 0 and math.isfinite(self.hi):
            return math.sqrt(self.lo * self.hi)
        if measured > tolerance:
            return budget * 0.8 * tolerance / measured
        return budget * (4.0 if measured == 0 else min(4.0, max(2.0, tolerance / measured)))
