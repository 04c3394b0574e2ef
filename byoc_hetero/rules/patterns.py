"""Pattern rules: a dataflow pattern that becomes composite ``<target>.<name>`` if its check agrees.

Also the bridge to TVM: :func:`checked_fusion_pattern` turns a rule (pattern or op rule) into a
``FusionPattern`` whose check records rejections in the run's :class:`DecisionLog` and tags each
composite with a digest of its constants (:class:`ConstantsDigest`).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import tvm
from tvm import relax
from tvm.relax import dpl
from tvm.relax.dpl import DFPattern
from tvm.relax.transform import FusionPattern, PatternCheckContext

from ..errors import ByocError, RuleError
from .decisions import DecisionLog
from .match import Check, Match, match_from_context, run_check
from ..targets import declared_target, get_target

_ORDER = itertools.count()


@dataclass(frozen=True)
class Variadic:
    """A pattern over calls of ``op`` whose first argument is a tuple of any length (concat's inputs).

    TVM's dataflow patterns match a tuple of one fixed length (``is_tuple([...])``), and a wildcard
    in its place would hand the composite one tuple-typed parameter instead of one per tensor. So a
    variadic rule says how to build its pattern for ``n`` fields — ``make(n) -> (pattern,
    annotations)`` — and the partitioner instantiates it once for each length the module's calls of
    ``op`` have (:meth:`arities`). It stays one rule (one name, one check, one composite name),
    whatever lengths occur: DenseNet-121 concatenates up to 33 tensors.
    """

    op: str
    make: Callable[[int], tuple[DFPattern, Mapping[str, DFPattern]]] = field(repr=False)
    min_arity: int = 1

    def arities(self, mod: tvm.IRModule) -> list[int]:
        """The tuple lengths of the first argument of every call of :attr:`op` in ``mod``."""
        found: set[int] = set()
        op = tvm.ir.Op.get(self.op)

        def visit(expr) -> None:
            if isinstance(expr, relax.Call) and expr.op.same_as(op) and expr.args:
                fields = getattr(expr.args[0].ty, "fields", None)
                if fields is not None and len(fields) >= self.min_arity:
                    found.add(len(fields))

        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, visit)
        return sorted(found)


@dataclass(frozen=True)
class PatternRule:
    """A dataflow-pattern rule: ``pattern`` becomes composite ``<target>.<name>`` if ``check`` agrees.
    ``pattern`` is a :class:`Variadic` for an op with a tuple of any length (then ``annotations``
    is unused: each instance brings its own)."""

    target: str
    name: str
    pattern: DFPattern | Variadic = field(repr=False)
    annotations: Mapping[str, DFPattern] = field(repr=False)
    check: Check | None = field(repr=False)
    priority: int = 0
    order: int = 0

    @property
    def composite_name(self) -> str:
        return f"{self.target}.{self.name}"

    @cached_property
    def ops_needed(self) -> frozenset[str]:
        """:func:`required_ops` of the pattern, worked out once per rule: MergeComposite asks it of
        every rule on every partition, and walking the ~100 built-in patterns each time was most of
        a partition of ResNet-18 (0.9 s of 1.2 s; ``bh.tune`` partitions several times)."""
        return required_ops(self.pattern)

    def fusion_pattern(self, log: DecisionLog) -> FusionPattern:
        """The rule as a TVM FusionPattern whose check runs ours and records rejections in ``log``
        (a fixed pattern only; see :meth:`fusion_patterns`)."""
        if isinstance(self.pattern, Variadic):
            raise RuleError(f"rule {self.composite_name} is variadic: use fusion_patterns(log, mod)")
        return self._fusion(self.pattern, self.annotations, log)

    def fusion_patterns(self, log: DecisionLog, mod: tvm.IRModule) -> list[FusionPattern]:
        """The rule as FusionPatterns for ``mod``: one, or for a :class:`Variadic` rule one per
        tuple length that ``mod``'s calls of its op have (all named ``<target>.<name>``)."""
        if not isinstance(self.pattern, Variadic):
            return [self._fusion(self.pattern, self.annotations, log)]
        return [self._fusion(*self.pattern.make(n), log) for n in self.pattern.arities(mod)]

    def _fusion(self, pattern: DFPattern, annotations: Mapping[str, DFPattern], log: DecisionLog) -> FusionPattern:
        rule_name, check = self.composite_name, self.check

        def decide(match: Match) -> str | None:
            if match.leaks:
                return "an intermediate value of the match is used outside it"
            return run_check(check, match, rule_name)

        return checked_fusion_pattern(rule_name, pattern, annotations, decide, log)


def checked_fusion_pattern(name: str, pattern: DFPattern, annotations: Mapping[str, DFPattern],
                           decide: Callable[[Match], str | None], log: DecisionLog,
                           rule_name: str | None = None) -> FusionPattern:
    """A FusionPattern named ``name`` accepting a match when ``decide(match)`` returns None.

    A rejection is recorded in ``log`` with its reason, under ``rule_name`` (default: ``name``). A :class:`ByocError` raised by ``decide``
    (a rule's bug) is kept in ``log`` and the match refused: TVM would re-wrap it as its own error
    type, so the stage re-raises it from the log after the pass (``log.raise_pending()``).
    """
    digest = ConstantsDigest()

    def tvm_check(ctx: PatternCheckContext) -> bool:
        match = match_from_context(ctx)
        try:
            reason = decide(match)
        except ByocError as err:
            log.fail(err)
            return False
        if reason is not None:
            log.add(rule_name or name, match.call, reason)
            return False
        return digest.accept(ctx)

    return FusionPattern(name, pattern, dict(annotations), tvm_check, digest.attrs)


CONST_DIGEST_ATTR = "byoc_hetero.const_digest"
"""Attribute of a composite function: a digest of the constants bound inside it (see below)."""


def _data_crc(tensor) -> int:
    try:
        data = np.ascontiguousarray(np.from_dlpack(tensor))  # no copy for a CPU tensor
    except (TypeError, RuntimeError, BufferError):
        data = tensor.numpy()
    return zlib.crc32(data.view(np.uint8).reshape(-1)) if data.size else 0


class ConstantsDigest:
    """Tags each composite with a digest of the constants it binds (``CONST_DIGEST_ATTR``).

    Why: TVM's BlockBuilder de-duplicates the functions it adds with a hash that *ignores the
    data of constants* and an equality that compares it. All composites of one rule on same-shaped
    weights (a deep network's repeated blocks) then share one hash bucket, and each new one is
    compared with every earlier one: FuseOpsByPattern and MergeCompositeFunctions became quadratic
    in the number of such composites. Function attributes are hashed, so a digest of the constants'
    data gives each composite its own bucket. The digest only spreads the hash: composites with
    equal constants get equal digests (and are still merged, as before), and a digest collision
    merely falls back on TVM's exact comparison.

    TVM hands the ``attrs_getter`` of a FusionPattern only the annotated sub-expressions, right
    after the pattern's check accepted the same match; so the check calls :meth:`accept` with the
    full context and :meth:`attrs` returns what it computed.
    """

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def accept(self, ctx: PatternCheckContext) -> bool:
        crcs = []

        def visit(expr) -> None:
            if isinstance(expr, tvm.ir.GenericConst):
                crcs.append(_data_crc(expr.value))

        for value in [ctx.matched_expr, *ctx.matched_bindings.values()]:
            relax.analysis.post_order_visit(value, visit)
        # order-free (matched_bindings has no fixed order): equal constants give equal digests
        self._last = ({CONST_DIGEST_ATTR: "%08x" % zlib.crc32(",".join(map(str, sorted(crcs))).encode())}
                      if crcs else {})
        return True

    def attrs(self, _annotated) -> dict[str, str]:
        return self._last


def required_ops(pattern: DFPattern) -> frozenset[str]:
    """Op names every match of ``pattern`` must contain (the ops outside ``|`` alternatives).

    Used to skip rules that cannot match a module at all, which keeps MergeComposite fast when a
    target has many rules.
    """
    if isinstance(pattern, Variadic):
        return frozenset({pattern.op})
    if isinstance(pattern, dpl.CallPattern):
        ops = set()
        if isinstance(pattern.op, dpl.ExprPattern) and isinstance(pattern.op.expr, tvm.ir.Op):
            ops.add(pattern.op.expr.name)
        for arg in pattern.args or []:
            ops |= required_ops(arg)
        return frozenset(ops)
    if isinstance(pattern, dpl.OrPattern):
        return required_ops(pattern.left) & required_ops(pattern.right)
    if isinstance(pattern, dpl.AndPattern):
        return required_ops(pattern.left) | required_ops(pattern.right)
    if isinstance(pattern, dpl.TupleGetItemPattern):
        return required_ops(pattern.tuple)
    if isinstance(pattern, dpl.TuplePattern):
        return frozenset().union(*(required_ops(f) for f in pattern.fields))
    inner = getattr(pattern, "pattern", None)  # attribute/type/shape/dtype wrappers
    if isinstance(inner, DFPattern):
        return required_ops(inner)
    return frozenset()


def register_pattern(
    target: str,
    name: str,
    pattern: DFPattern | Variadic,
    annotations: Mapping[str, DFPattern] | None = None,
    check: Check | None = None,
    priority: int = 0,
) -> PatternRule:
    """Register a pattern rule for ``target`` (declared before with :func:`register_target`).

    Parameters
    ----------
    target: the offload target, e.g. ``"onednn"`` or your backend's name (an alias is accepted).
    name: the rule's name; the composite function is named ``<target>.<name>``.
    pattern: a ``tvm.relax.dpl`` pattern, or a :class:`Variadic` for an op taking a tuple of any
        length (one rule whatever the length; its ``make(n)`` gives each instance's annotations).
    annotations: names for sub-patterns, visible to the check as ``match.expr(name)``.
    check: ``check(match) -> True | None | False | "reason"``.
    priority: higher is tried first (ties: registration order).

    Example
    -------
    >>> from tvm.relax.dpl import is_op, wildcard
    >>> x, w = wildcard(), wildcard()
    >>> register_pattern("mynpu", "dense", is_op("relax.matmul")(x, w), {"data": x, "weight": w},
    ...                  check=lambda m: m.dtype("data") == "float32" or "only float32")
    """
    if not isinstance(pattern, (DFPattern, Variadic)):
        raise RuleError(
            f"rule {target}.{name}: pattern must be a tvm.relax.dpl.DFPattern or a Variadic, "
            f"got {type(pattern).__name__}"
        )
    annotations = dict(annotations or {})
    for key, sub in annotations.items():
        if not isinstance(sub, DFPattern):
            raise RuleError(
                f"rule {target}.{name}: annotation {key!r} must be a DFPattern, got {type(sub).__name__}"
            )
    if check is not None and not callable(check):
        raise RuleError(f"rule {target}.{name}: check must be callable, got {type(check).__name__}")
    tgt = declared_target(target, f"rule {target}.{name}")
    if any(r.name == name for r in tgt.patterns):
        raise RuleError(f"rule {target}.{name} is already registered; unregister it first")
    rule = PatternRule(tgt.name, name, pattern, annotations, check, priority, next(_ORDER))
    tgt.patterns.append(rule)
    return rule


def unregister_pattern(target: str, name: str) -> None:
    """Remove pattern rule ``<target>.<name>``."""
    tgt = get_target(target)
    kept = [r for r in tgt.patterns if r.name != name]
    if len(kept) == len(tgt.patterns):
        raise RuleError(f"no pattern rule {target}.{name}; known: {[r.name for r in tgt.patterns]}")
    tgt.patterns[:] = kept


def pattern_rules(target: str) -> list[PatternRule]:
    """The pattern rules of ``target`` in the order they are tried."""
    return sorted(get_target(target).patterns, key=lambda r: (-r.priority, r.order))
