"""The rule registry: which calls each offload target (backend) can run.

Two kinds of rules, as in TVM's classic BYOC:

* **Pattern rules** (:func:`register_pattern`): a dataflow pattern such as conv2d → add(bias) → relu,
  grouped by ``MergeComposite`` into one composite function named ``<target>.<rule name>``.
* **Op-attribute rules** (:func:`op_rule`, or ``tvm.ir.register_op_attr(op, "target.<target>", fn)``
  directly): a single op whose attribute function returns True for a call becomes a single-op
  composite in ``AnnotateTarget``.

Every rule may carry a *check*. A check receives a :class:`Match` and returns ``True``/``None`` to
accept, or ``False`` or a string (the reason) to reject; a rejected call stays with TVM (llvm).

Priority: within one target, pattern rules are tried by descending ``priority``, then in
registration order; a larger pattern should therefore get a higher priority than its prefixes.
Across targets, the order given to :func:`byoc_hetero.stages` decides: earlier targets win, for
patterns and op rules alike (as ``AnnotateTarget([A, B])`` did in Relay).
"""

from __future__ import annotations

import itertools
import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard
from tvm.relax.transform import FusionPattern, PatternCheckContext

from .._relax import describe, op_name, static_shape, tensor_dtype, tensor_type  # noqa: F401  (re-exported)
from ..errors import RuleError

_log = logging.getLogger("byoc_hetero.rules")

CheckResult = Union[bool, str, None]


# ----------------------------------------------------------------------------------------------
# What a check sees
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Match:
    """A matched pattern (or a single call) as a check sees it.

    Attributes
    ----------
    call:
        The call at the root of the match (the last op of the pattern).
    exprs:
        The annotated sub-expressions by name (for built-in rules: ``data``, ``weight``, ``bias``,
        ``anchor``), plus ``root``.
    leaks:
        True when a value computed inside the match is also used outside it, so fusing the match
        would have to compute that value twice.
    """

    call: relax.Call
    exprs: Mapping[str, relax.Expr]
    leaks: bool = False
    bindings: Mapping[relax.Var, relax.Expr] = field(default_factory=dict)

    def value(self, expr: relax.Expr) -> relax.Expr:
        """``expr`` with a variable bound inside the match replaced by its bound value."""
        return self.bindings.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def expr(self, name: str) -> relax.Expr:
        """The sub-expression annotated ``name``; KeyError naming the known ones if absent."""
        if name not in self.exprs:
            raise KeyError(f"match has no part named {name!r}; parts: {sorted(self.exprs)}")
        return self.exprs[name]

    def has(self, name: str) -> bool:
        """Whether an optional part (e.g. ``bias``) was matched."""
        return name in self.exprs

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The static shape of part ``name``, or None if its shape is not fully static."""
        return static_shape(self.expr(name))

    def dtype(self, name: str) -> str:
        """The dtype of part ``name`` (``""`` if it is not a tensor)."""
        return tensor_dtype(self.expr(name))


Check = Callable[[Match], CheckResult]


def run_check(check: Check | None, match: Match, rule_name: str) -> str | None:
    """Run ``check``; return None to accept or the reason of the rejection.

    A check that raises is a bug in the rule: the error is re-raised as :class:`RuleError`
    naming the rule and the call.
    """
    if check is None:
        return None
    try:
        verdict = check(match)
    except Exception as err:  # noqa: BLE001 - re-raised with the rule's name
        raise RuleError(
            f"check of rule {rule_name!r} raised {type(err).__name__}: {err} "
            f"(on {op_name(match.call) or match.call.op})"
        ) from err
    if verdict is None or verdict is True:
        return None
    if verdict is False:
        return f"check {getattr(check, '__name__', 'check')} of {rule_name} rejected it"
    if isinstance(verdict, str):
        return verdict
    raise RuleError(
        f"check of rule {rule_name!r} must return bool, None or a reason string, "
        f"got {type(verdict).__name__}"
    )


# ----------------------------------------------------------------------------------------------
# Decisions: why a candidate was not offloaded (read by the op profile and reports)
# ----------------------------------------------------------------------------------------------
@dataclass
class Rejection:
    """A rule matched a call but said no (its check, or the cost gate)."""

    rule: str
    op: str
    reason: str
    value: str = ""  # the call's result, e.g. ``float32[1, 64, 56, 56]``


@dataclass
class DecisionLog:
    """Rejections recorded while the stages ran (most recent run of each stage)."""

    rejections: list[Rejection] = field(default_factory=list)

    def add(self, rule: str, call: relax.Call, reason: str) -> None:
        op = op_name(call) or str(call.op)
        self.rejections.append(Rejection(rule, op, reason, describe(call)))
        _log.info("rule %s rejected %s: %s", rule, op, reason)



DECISIONS = DecisionLog()


def latest_rejection(rejections: list[Rejection], op: str, value: str) -> Rejection | None:
    """The latest rejection of a call of ``op`` whose result is ``value``, if any."""
    for rej in reversed(rejections):
        if rej.op == op and rej.value == value:
            return rej
    return None


# ----------------------------------------------------------------------------------------------
# Targets
# ----------------------------------------------------------------------------------------------
@dataclass
class Target:
    """An offload target (a backend): its name and, optionally, what its codegen can lower.

    ``can_lower(call)`` returns None when the target's codegen can run a single call of that op,
    or the reason it cannot; it guards op-attribute rules so that an op marked for a target whose
    runtime has no kernel for it stays with TVM instead of failing at build time.
    """

    name: str
    can_lower: Callable[[relax.Call], str | None] | None = field(default=None, repr=False)
    patterns: list["PatternRule"] = field(default_factory=list)

    @property
    def has_codegen(self) -> bool:
        """Whether ``relax.ext.<name>`` exists, so PartitionGraph can compile this target's regions."""
        return tvm.get_global_func(f"relax.ext.{self.name}", allow_missing=True) is not None


_TARGETS: dict[str, Target] = {}
_ORDER = itertools.count()

Codegen = Callable[[Any, Any, Any], list]


def register_target(
    name: str,
    can_lower: Callable[[relax.Call], str | None] | None = None,
    codegen: str | Codegen | None = None,
) -> Target:
    """Declare an offload target. Registering an existing name returns it (updating what is given).

    Parameters
    ----------
    name: the target (backend) name: composites are ``<name>.<rule>``, regions get
        ``Codegen=<name>`` and PartitionGraph calls ``relax.ext.<name>``.
    can_lower: optional guard for op-attribute rules (None = can run, else the reason).
    codegen: the codegen of the target's regions: a function ``(funcs, options, constant_names)
        -> list[Module]`` registered as ``relax.ext.<name>``, or the name of an existing target
        whose codegen to reuse (e.g. ``"byoc_hetero"`` to run this target's regions on the oneDNN
        runtime too). Without one, PartitionGraph needs ``relax.ext.<name>`` registered elsewhere.
    """
    if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
        raise RuleError(f"target name must be a non-empty identifier, got {name!r}")
    tgt = _TARGETS.get(name)
    if tgt is None:
        tgt = _TARGETS[name] = Target(name, can_lower)
    elif can_lower is not None:
        tgt.can_lower = can_lower
    if codegen is not None:
        _register_codegen(name, codegen)
    return tgt


def _register_codegen(name: str, codegen: str | Codegen) -> None:
    if isinstance(codegen, str):
        if codegen == name:
            raise RuleError(f"target {name!r} cannot reuse its own codegen")
        impl = tvm.get_global_func(f"relax.ext.{codegen}", allow_missing=True)
        if impl is None:
            raise RuleError(f"target {name!r}: no codegen relax.ext.{codegen} to reuse")
    elif callable(codegen):
        impl = codegen
    else:
        raise RuleError(f"target {name!r}: codegen must be a target name or a function")
    tvm.register_global_func(f"relax.ext.{name}", impl, override=True)


def get_target(name: str) -> Target:
    """The registered target ``name``; RuleError listing the known targets otherwise."""
    if name not in _TARGETS:
        raise RuleError(f"unknown offload target {name!r}; registered targets: {sorted(_TARGETS)}")
    return _TARGETS[name]


def targets() -> list[str]:
    """Names of the registered targets."""
    return sorted(_TARGETS)


# ----------------------------------------------------------------------------------------------
# Pattern rules
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PatternRule:
    """A dataflow-pattern rule: ``pattern`` becomes composite ``<target>.<name>`` if ``check`` agrees."""

    target: str
    name: str
    pattern: DFPattern = field(repr=False)
    annotations: Mapping[str, DFPattern] = field(repr=False)
    check: Check | None = field(repr=False)
    priority: int = 0
    order: int = 0

    @property
    def composite_name(self) -> str:
        return f"{self.target}.{self.name}"

    def fusion_pattern(self, log: DecisionLog = DECISIONS) -> FusionPattern:
        """The rule as a TVM FusionPattern whose check runs ours and logs rejections."""
        rule_name = self.composite_name
        check = self.check
        digest = ConstantsDigest()

        def tvm_check(ctx: PatternCheckContext) -> bool:
            match = match_from_context(ctx)
            if match.leaks:
                log.add(rule_name, match.call, "an intermediate value of the match is used outside it")
                return False
            reason = run_check(check, match, rule_name)
            if reason is not None:
                log.add(rule_name, match.call, reason)
                return False
            return digest.accept(ctx)

        return FusionPattern(rule_name, self.pattern, dict(self.annotations), tvm_check,
                             digest.attrs)


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


def match_from_context(ctx: PatternCheckContext) -> Match:
    exprs = {str(k): v for k, v in ctx.annotated_expr.items()}
    exprs.setdefault("root", ctx.matched_expr)
    return Match(call=ctx.matched_expr, exprs=exprs, leaks=_leaks(ctx),
                 bindings=dict(ctx.matched_bindings.items()))


def _leaks(ctx: PatternCheckContext) -> bool:
    """True if a value bound inside the match (other than its root) is used outside it."""
    bindings = dict(ctx.matched_bindings.items())
    inside = set(bindings)
    usages = ctx.var_usages
    for var, value in bindings.items():
        if value.same_as(ctx.matched_expr):
            continue  # the root: its users are the match's consumers
        users = usages.get(var)
        if users is not None and any(user not in inside for user in users):
            return True
    return False


def required_ops(pattern: DFPattern) -> frozenset[str]:
    """Op names every match of ``pattern`` must contain (the ops outside ``|`` alternatives).

    Used to skip rules that cannot match a module at all, which keeps MergeComposite fast when a
    target has many rules.
    """
    from tvm.relax import dpl

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
    for attr in ("pattern",):  # attribute/type/shape/dtype wrappers
        inner = getattr(pattern, attr, None)
        if isinstance(inner, DFPattern):
            return required_ops(inner)
    return frozenset()


def register_pattern(
    target: str,
    name: str,
    pattern: DFPattern,
    annotations: Mapping[str, DFPattern] | None = None,
    check: Check | None = None,
    priority: int = 0,
) -> PatternRule:
    """Register a pattern rule for ``target`` (declared on first use).

    Parameters
    ----------
    target: the offload target, e.g. ``"byoc_hetero"`` or your backend's name.
    name: the rule's name; the composite function is named ``<target>.<name>``.
    pattern: a ``tvm.relax.dpl`` pattern.
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
    if not isinstance(pattern, DFPattern):
        raise RuleError(
            f"rule {target}.{name}: pattern must be a tvm.relax.dpl.DFPattern, "
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
    tgt = register_target(target)
    if any(r.name == name for r in tgt.patterns):
        raise RuleError(f"rule {target}.{name} is already registered; unregister it first")
    rule = PatternRule(target, name, pattern, annotations, check, priority, next(_ORDER))
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


# ----------------------------------------------------------------------------------------------
# Op-attribute rules
# ----------------------------------------------------------------------------------------------
_OP_CHECKS: dict[tuple[str, str], Check] = {}


def _get_op(op_name: str) -> tvm.ir.Op:
    try:
        return tvm.ir.Op.get(op_name)
    except Exception as err:  # TVM raises AttributeError for an unknown op
        raise RuleError(f"op {op_name!r} is not a registered TVM op") from err


def op_attr_key(target: str) -> str:
    return f"target.{target}"


def op_rule(op_name: str, target: str = "byoc_hetero", level: int = 11) -> Callable[[Check], Check]:
    """Decorator: offload single calls of ``op_name`` to ``target`` when the check accepts.

    Equivalent to ``tvm.ir.register_op_attr(op_name, "target.<target>", fn)``, except that the
    check may also return a reason string, which reports show.

    Example
    -------
    >>> @op_rule("relax.nn.conv2d", target="byoc_hetero")
    ... def conv2d_ok(match):
    ...     return match.dtype("root") == "float32" or "only float32"
    """
    op = _get_op(op_name)

    def decorate(check: Check) -> Check:
        if not callable(check):
            raise RuleError(f"op rule for {op_name}: the check must be callable")
        register_target(target)
        key = op_attr_key(target)
        if _has_op_attr(op, key):
            op.reset_attr(key)

        def attr_fn(call: relax.Call) -> bool:
            return run_check(check, Match(call, {"root": call}), f"{target}.{op_name}") is None

        tvm.ir.register_op_attr(op_name, key, attr_fn, level=level)
        _OP_CHECKS[(target, op_name)] = check
        return check

    return decorate


def unregister_op_rule(op_name: str, target: str = "byoc_hetero") -> None:
    """Remove the op-attribute rule of ``op_name`` for ``target`` (also one set by register_op_attr)."""
    op = _get_op(op_name)
    key = op_attr_key(target)
    if not _has_op_attr(op, key):
        raise RuleError(f"op {op_name} has no rule for target {target!r}")
    op.reset_attr(key)
    _OP_CHECKS.pop((target, op_name), None)


def op_rule_ops(target: str) -> list[str]:
    """Names of the ops carrying the ``target.<target>`` attribute (however it was set)."""
    key = op_attr_key(target)
    return sorted(n for n in tvm.ir.Op.list_op_names() if _has_op_attr(tvm.ir.Op.get(n), key))


def _has_op_attr(op: tvm.ir.Op, key: str) -> bool:
    # Op.has_attr is True for every op once any op set the key (and after reset_attr): ask the value
    return bool(op.has_attr(key)) and op.get_attr(key) is not None


def check_op_rule(target: str, call: relax.Call) -> str | None:
    """Evaluate the op-attribute rule of ``call.op`` for ``target``: None to accept, else the reason."""
    op_name = call.op.name
    rule_name = f"{target}.{op_name}"
    check = _OP_CHECKS.get((target, op_name))
    if check is not None:
        return run_check(check, Match(call, {"root": call}), rule_name)
    fn = tvm.ir.Op.get(op_name).get_attr(op_attr_key(target))
    if fn is None:
        return f"no rule of target {target} for {op_name}"
    try:
        ok = bool(fn(call))
    except Exception as err:  # noqa: BLE001
        raise RuleError(f"op attribute {op_attr_key(target)} of {op_name} raised: {err}") from err
    return None if ok else f"op attribute {op_attr_key(target)} of {op_name} returned False"


def single_op_pattern(op_name: str) -> DFPattern:
    """A pattern matching any call of ``op_name`` (whatever its arguments)."""
    num = tvm.ir.Op.get(op_name).num_inputs
    args = [wildcard() for _ in range(max(num, 0))] if num is not None and num >= 0 else []
    return is_op(op_name)(*args, varg_default_wildcard=True)


def all_rules_summary(names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """For each target, its pattern rule names (in try order) and its op-rule ops."""
    out = {}
    for name in names or targets():
        out[name] = {
            "patterns": [r.name for r in pattern_rules(name)],
            "ops": op_rule_ops(name),
        }
    return out
