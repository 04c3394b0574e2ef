"""What a rule's check sees (:class:`Match`) and how a check's verdict is read (:func:`run_check`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Union

import numpy as np
from tvm import relax
from tvm.relax.transform import PatternCheckContext

from .._relax import op_name, shape_of, tensor_dtype
from ..errors import RuleError

CheckResult = Union[bool, str, None]
"""What a check returns: True/None accept; False or a reason string reject."""


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
    bindings:
        Variables bound inside the match and their values (see :meth:`value`).
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

    def shape(self, name: str) -> tuple[int | str, ...] | None:
        """The shape of part ``name``: ints for static dims, expressions (``"N"``) for symbolic
        ones (:func:`.._relax.shape_of`); None when unknown. A check that needs static dims asks
        ``tensor_reason`` first, which rejects symbolic shapes unless told otherwise."""
        return shape_of(self.expr(name))

    def dtype(self, name: str) -> str:
        """The dtype of part ``name`` (``""`` if it is not a tensor)."""
        return tensor_dtype(self.expr(name))


Check = Callable[[Match], CheckResult]


def single_call_match(call: relax.Call) -> Match:
    """The match of an op-attribute rule: the call alone, as ``root``."""
    return Match(call, {"root": call})


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
    if isinstance(verdict, np.bool_):  # a check computed with numpy: as good as a bool
        verdict = bool(verdict)
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


def match_from_context(ctx: PatternCheckContext) -> Match:
    """The :class:`Match` of a FusionPattern's check context."""
    exprs = {str(k): v for k, v in ctx.annotated_expr.items()}
    exprs.setdefault("root", ctx.matched_expr)
    bindings = dict(ctx.matched_bindings.items())
    return Match(call=ctx.matched_expr, exprs=exprs, leaks=_leaks(ctx, bindings), bindings=bindings)


def _leaks(ctx: PatternCheckContext, bindings: Mapping[relax.Var, relax.Expr]) -> bool:
    """True if a value bound inside the match (other than its root) is used outside it."""
    inside = set(bindings)
    usages = ctx.var_usages
    for var, value in bindings.items():
        if value.same_as(ctx.matched_expr):
            continue  # the root: its users are the match's consumers
        users = usages.get(var)
        if users is not None and any(user not in inside for user in users):
            return True
    return False
