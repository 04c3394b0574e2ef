"""The oneDNN backend's op table: per Relax op its lowering and single-call check; its pattern rules.

Each op family module in :mod:`.ops` fills the table with decorators, side by side with its
patterns and checks:

* ``@lowers("relax.nn.softmax", check=check_softmax)`` registers how one call of the op becomes
  region-graph nodes, and the check a single call must pass (what guards op-attribute rules: an op
  without a check has a lowering only as part of a pattern, e.g. a batch norm after a conv2d);
* ``@pattern_rules`` registers a function yielding the family's :class:`PatternSpec` rules;
* ``@lowers_composite("rule", ...)`` registers how a whole composite of those rules becomes nodes,
  for patterns that are one kernel but several Relax ops none of which means much alone (a layer
  norm spelled out as mean / subtract / power / ... becomes one ``layer_norm`` node).

* ``@graph_pass`` registers a region-graph rewrite by its function name; the backend object lists
  the names in run order (:data:`byoc_hetero.backends.onednn.REGION_PASSES`).

All of it lives in one :class:`LoweringTable` (:data:`TABLE`), the backend object's ``lowering``;
the module-level decorators are its methods. The codegen dispatches on :func:`lowering_for`;
nothing else lists ops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tvm import relax
from tvm.relax.dpl import DFPattern

from ..._relax import shape_of
from ...rules import Check, CheckResult, Match, Variadic

if TYPE_CHECKING:
    from .lowering import RegionLowering

TARGET = "onednn"
"""The backend name: composites ``onednn.<rule>``, regions ``Codegen="onednn"``, codegen
``relax.ext.onednn``."""

ALIASES = ("byoc_hetero",)
"""Earlier names of the backend, still accepted everywhere a target name is (and
``relax.ext.byoc_hetero``, the op attribute ``target.byoc_hetero``)."""

Lowering = Callable[["RegionLowering", relax.Var, relax.Call], Any]
"""``lower(ctx, var, call) -> tensor id`` (or a tuple of ids): emit the nodes of one call."""

CompositeLowering = Callable[["RegionLowering", relax.Function], Any]
"""``lower(ctx, composite) -> tensor id``: emit the nodes of a whole composite function (its
parameters already have tensor ids)."""

GraphPass = Callable[[Any], None]
"""``rewrite(graph)``: changes a lowered region graph in place."""


@dataclass(frozen=True)
class PatternSpec:
    """One pattern rule of the backend (registered as ``onednn.<name>``)."""

    name: str
    pattern: DFPattern | Variadic = field(repr=False)
    annotations: dict[str, DFPattern] = field(repr=False)
    check: Check | None = field(repr=False)
    priority: int = 0


class LoweringTable:
    """What a region-graph backend knows per op: lowerings, single-call checks, pattern sources,
    whole-composite lowerings and region-graph passes (by name; the backend orders them)."""

    def __init__(self) -> None:
        self.lowerings: dict[str, Lowering] = {}
        self.single_checks: dict[str, Check] = {}
        self.pattern_sources: list[Callable[[], Iterable[PatternSpec]]] = []
        self.composite_lowerings: dict[str, CompositeLowering] = {}
        self.passes: dict[str, GraphPass] = {}

    def lowers(self, *ops: str, check: Check | None = None) -> Callable[[Lowering], Lowering]:
        """Decorator: ``fn`` lowers calls of ``ops``; ``check`` (if given) accepts a single call."""

        def decorate(fn: Lowering) -> Lowering:
            for op in ops:
                if op in self.lowerings:
                    raise ValueError(f"{op} already has a lowering ({self.lowerings[op].__module__})")
                self.lowerings[op] = fn
                if check is not None:
                    self.single_checks[op] = check
            return fn

        return decorate

    def pattern_rules(self, source: Callable[[], Iterable[PatternSpec]]) -> Callable[[], Iterable[PatternSpec]]:
        """Decorator: ``source()`` yields pattern rules of the backend (registered once, at import)."""
        self.pattern_sources.append(source)
        return source

    def lowers_composite(self, *rules: str) -> Callable[[CompositeLowering], CompositeLowering]:
        """Decorator: ``fn`` lowers whole composites of the pattern rules ``rules`` (names without
        the target prefix) instead of their calls one by one."""

        def decorate(fn: CompositeLowering) -> CompositeLowering:
            for rule in rules:
                if rule in self.composite_lowerings:
                    raise ValueError(f"rule {rule} already has a composite lowering")
                self.composite_lowerings[rule] = fn
            return fn

        return decorate

    def graph_pass(self, fn: GraphPass) -> GraphPass:
        """Decorator: ``fn(graph)`` rewrites every lowered region graph in place (e.g. folds
        permutes into matmul operands) before it is serialized. It runs where the backend's
        ``region_passes`` lists its name (the function's name)."""
        name = fn.__name__
        if name in self.passes and self.passes[name] is not fn:
            raise ValueError(f"region pass {name} is already registered ({self.passes[name].__module__})")
        self.passes[name] = fn
        return fn

    def graph_passes_by_name(self) -> list[tuple[str, GraphPass]]:
        """The registered region-graph passes, in registration order."""
        return list(self.passes.items())

    def composite_lowering_for(self, composite: str) -> CompositeLowering | None:
        """The lowering of a whole composite (``"<target>.<rule>"``), or None: lower its calls."""
        return self.composite_lowerings.get(composite.partition(".")[2])

    def lowering_for(self, op: str) -> Lowering | None:
        """The lowering of ``op``, or None when the runtime has no kernel for it."""
        return self.lowerings.get(op)

    def pattern_specs(self) -> list[PatternSpec]:
        """Every pattern rule the op families declare, in declaration order, each check preceded by
        :func:`empty_tensor_reason`."""
        return [replace(spec, check=_refusing_empty(spec.check)) for source in self.pattern_sources
                for spec in source()]

    def can_lower(self, call: relax.Call) -> str | None:
        """Whether the runtime has a kernel for this single call (guards op-attribute rules)."""
        op = call.op.name
        check = self.single_checks.get(op)
        if check is None:
            known = ", ".join(sorted(o.removeprefix("relax.") for o in self.single_checks))
            return f"the {TARGET} runtime has no kernel for {op} (it runs {known})"
        match = Match(call, single_call_names(call))
        return empty_tensor_reason(match) or check(match)


TABLE = LoweringTable()
"""The oneDNN backend's table (``bh.rules.get_target("onednn").lowering``). The module-level
decorators below fill it; op family modules use them as ``from ..table import lowers``."""

lowers = TABLE.lowers
pattern_rules = TABLE.pattern_rules
lowers_composite = TABLE.lowers_composite
graph_pass = TABLE.graph_pass
composite_lowering_for = TABLE.composite_lowering_for
lowering_for = TABLE.lowering_for
pattern_specs = TABLE.pattern_specs
can_lower = TABLE.can_lower


def empty_tensor_reason(match: Match) -> str | None:
    """Why a match cannot run in a region because one of its tensors holds no elements (a static
    dim of 0: the region format takes dims >= 1); None when none does. Every check of the table
    runs it first, so an empty tensor the import passes could not drop (``drop_empty_operands``)
    stays on llvm, which computes it, with this reason."""
    values = [*match.exprs.values(), *match.call.args, *match.bindings.keys()]
    for value in values:
        for v in value.fields if isinstance(value, relax.Tuple) else (value,):
            shape = shape_of(v)
            if shape is not None and 0 in shape:
                return f"a tensor of shape {list(shape)} holds no elements; empty tensors stay on llvm"
    return None


def _refusing_empty(check: Check | None) -> Check:
    """``check`` preceded by :func:`empty_tensor_reason`."""
    def checked(match: Match) -> CheckResult:
        return empty_tensor_reason(match) or (check(match) if check is not None else None)

    return functools.wraps(check)(checked) if check is not None else checked


def single_call_names(call: relax.Call) -> dict[str, relax.Expr]:
    """The part names a single call offers a check: root/anchor (the call), data, weight, binary."""
    names = {"root": call, "anchor": call, "binary": call}
    if call.args:
        names["data"] = call.args[0]
    if len(call.args) >= 2:
        names["weight"] = call.args[1]
    return names

