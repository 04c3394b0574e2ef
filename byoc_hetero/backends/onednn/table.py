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

The codegen dispatches on :func:`lowering_for`; nothing else lists ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tvm import relax
from tvm.relax.dpl import DFPattern

from ...rules import Check, Match, Variadic

if TYPE_CHECKING:
    from .lowering import RegionLowering

TARGET = "byoc_hetero"
"""The target name: composites ``byoc_hetero.<rule>``, regions ``Codegen="byoc_hetero"``,
codegen ``relax.ext.byoc_hetero``."""

Lowering = Callable[["RegionLowering", relax.Var, relax.Call], Any]
"""``lower(ctx, var, call) -> tensor id`` (or a tuple of ids): emit the nodes of one call."""

CompositeLowering = Callable[["RegionLowering", relax.Function], Any]
"""``lower(ctx, composite) -> tensor id``: emit the nodes of a whole composite function (its
parameters already have tensor ids)."""


@dataclass(frozen=True)
class PatternSpec:
    """One pattern rule of the backend (registered as ``byoc_hetero.<name>``)."""

    name: str
    pattern: DFPattern | Variadic = field(repr=False)
    annotations: dict[str, DFPattern] = field(repr=False)
    check: Check | None = field(repr=False)
    priority: int = 0


_LOWERINGS: dict[str, Lowering] = {}
_SINGLE_CHECKS: dict[str, Check] = {}
_PATTERN_SOURCES: list[Callable[[], Iterable[PatternSpec]]] = []
_COMPOSITE_LOWERINGS: dict[str, CompositeLowering] = {}
_GRAPH_PASSES: list[Callable[[Any], None]] = []


def lowers(*ops: str, check: Check | None = None) -> Callable[[Lowering], Lowering]:
    """Decorator: ``fn`` lowers calls of ``ops``; ``check`` (if given) accepts a single call of them."""

    def decorate(fn: Lowering) -> Lowering:
        for op in ops:
            if op in _LOWERINGS:
                raise ValueError(f"{op} already has a lowering ({_LOWERINGS[op].__module__})")
            _LOWERINGS[op] = fn
            if check is not None:
                _SINGLE_CHECKS[op] = check
        return fn

    return decorate


def pattern_rules(source: Callable[[], Iterable[PatternSpec]]) -> Callable[[], Iterable[PatternSpec]]:
    """Decorator: ``source()`` yields pattern rules of the backend (registered once, at import)."""
    _PATTERN_SOURCES.append(source)
    return source


def lowers_composite(*rules: str) -> Callable[[CompositeLowering], CompositeLowering]:
    """Decorator: ``fn`` lowers whole composites of the pattern rules ``rules`` (names without
    the target prefix) instead of their calls one by one."""

    def decorate(fn: CompositeLowering) -> CompositeLowering:
        for rule in rules:
            if rule in _COMPOSITE_LOWERINGS:
                raise ValueError(f"rule {rule} already has a composite lowering")
            _COMPOSITE_LOWERINGS[rule] = fn
        return fn

    return decorate


def composite_lowering_for(composite: str) -> CompositeLowering | None:
    """The lowering of a whole composite (``"<target>.<rule>"``), or None: lower its calls."""
    return _COMPOSITE_LOWERINGS.get(composite.partition(".")[2])


def graph_pass(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Decorator: ``fn(graph)`` rewrites every lowered region graph in place (e.g. folds permutes
    into matmul operands), in registration order, before it is serialized."""
    _GRAPH_PASSES.append(fn)
    return fn


def graph_passes() -> list[Callable[[Any], None]]:
    """The registered region-graph passes."""
    return list(_GRAPH_PASSES)


def lowering_for(op: str) -> Lowering | None:
    """The lowering of ``op``, or None when the runtime has no kernel for it."""
    return _LOWERINGS.get(op)


def pattern_specs() -> list[PatternSpec]:
    """Every pattern rule the op families declare, in declaration order."""
    return [spec for source in _PATTERN_SOURCES for spec in source()]


def single_call_names(call: relax.Call) -> dict[str, relax.Expr]:
    """The part names a single call offers a check: root/anchor (the call), data, weight, binary."""
    names = {"root": call, "anchor": call, "binary": call}
    if call.args:
        names["data"] = call.args[0]
    if len(call.args) >= 2:
        names["weight"] = call.args[1]
    return names


def can_lower(call: relax.Call) -> str | None:
    """Whether the runtime has a kernel for this single call (guards op-attribute rules)."""
    op = call.op.name
    check = _SINGLE_CHECKS.get(op)
    if check is None:
        known = ", ".join(sorted(o.removeprefix("relax.") for o in _SINGLE_CHECKS))
        return f"the byoc_hetero runtime has no kernel for {op} (it runs {known})"
    return check(Match(call, single_call_names(call)))
