"""Op-attribute rules: single calls of an op offloaded when ``target.<name>`` on the op accepts them."""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard
from tvm.relax.transform import FusionPattern

from .._relax import op_name, short_op_name
from ..errors import RuleError
from .decisions import DecisionLog
from .match import Check, Match, run_check, single_call_match
from .patterns import checked_fusion_pattern
from ..targets import declared_target, default_target, get_target

_OP_CHECKS: dict[tuple[str, str], Check] = {}


def _get_op(name: str) -> tvm.ir.Op:
    try:
        return tvm.ir.Op.get(name)
    except Exception as err:  # TVM raises AttributeError for an unknown op
        raise RuleError(f"op {name!r} is not a registered TVM op") from err


def op_attr_key(target: str) -> str:
    """The op attribute that marks an op for ``target`` (``target.<name>``, as in Relay)."""
    return f"target.{target}"


def _attr_keys(target: str) -> list[str]:
    """The op attributes that mark an op for ``target``: its name's and each alias's."""
    return [op_attr_key(n) for n in get_target(target).names]


def op_rule(op: str, target: str | None = None, level: int = 11) -> Callable[[Check], Check]:
    """Decorator: offload single calls of ``op`` to ``target`` when the check accepts.

    Equivalent to ``tvm.ir.register_op_attr(op, "target.<target>", fn)``, except that the
    check may also return a reason string, which reports show.

    Example
    -------
    >>> @op_rule("relax.nn.conv2d", target="onednn")
    ... def conv2d_ok(match):
    ...     return match.dtype("root") == "float32" or "only float32"
    """
    tvm_op = _get_op(op)

    def decorate(check: Check) -> Check:
        if not callable(check):
            raise RuleError(f"op rule for {op}: the check must be callable")
        target_name = declared_target(target or default_target(), f"op rule {target or default_target()}.{op}").name
        for key in _attr_keys(target_name):
            if _has_op_attr(tvm_op, key):
                tvm_op.reset_attr(key)
        key = op_attr_key(target_name)

        def attr_fn(call: relax.Call) -> bool:
            return run_check(check, single_call_match(call), f"{target_name}.{op}") is None

        tvm.ir.register_op_attr(op, key, attr_fn, level=level)
        _OP_CHECKS[(target_name, op)] = check
        return check

    return decorate


def unregister_op_rule(op: str, target: str | None = None) -> None:
    """Remove the op-attribute rule of ``op`` for ``target`` (also one set by register_op_attr)."""
    tvm_op = _get_op(op)
    name = get_target(target or default_target()).name
    keys = [k for k in _attr_keys(name) if _has_op_attr(tvm_op, k)]
    if not keys:
        raise RuleError(f"op {op} has no rule for target {target!r}")
    for key in keys:
        tvm_op.reset_attr(key)
    _OP_CHECKS.pop((name, op), None)


def op_rule_ops(target: str) -> list[str]:
    """Names of the ops carrying the ``target.<target>`` attribute, or that of an alias of the
    target (however it was set)."""
    keys = _attr_keys(target)
    return sorted(n for n in tvm.ir.Op.list_op_names()
                  if any(_has_op_attr(tvm.ir.Op.get(n), k) for k in keys))


def _has_op_attr(op: tvm.ir.Op, key: str) -> bool:
    # Op.has_attr is True for every op once any op set the key (and after reset_attr): ask the value
    return bool(op.has_attr(key)) and op.get_attr(key) is not None


def check_op_rule(target: str, call: relax.Call) -> str | None:
    """Evaluate the op-attribute rule of ``call``'s op for ``target``: None to accept, else the reason.

    The target's ``can_lower`` guard, if any, is asked after the rule accepted.
    """
    name = op_name(call)
    target = get_target(target).name
    rule_name = f"{target}.{name}"
    check = _OP_CHECKS.get((target, name))
    if check is not None:
        reason = run_check(check, single_call_match(call), rule_name)
    else:
        reason = _attr_reason(target, call, name)
    can_lower = get_target(target).can_lower
    if reason is None and can_lower is not None:
        reason = run_check(lambda _m: can_lower(call), single_call_match(call), rule_name)
    return reason


def _attr_reason(target: str, call: relax.Call, name: str) -> str | None:
    """The verdict of an attribute set with ``tvm.ir.register_op_attr`` (a plain bool function)."""
    op = tvm.ir.Op.get(name)
    key = next((k for k in _attr_keys(target) if _has_op_attr(op, k)), op_attr_key(target))
    fn = op.get_attr(key) if _has_op_attr(op, key) else None
    if fn is None:
        return f"no rule of target {target} for {name}"
    try:
        ok = bool(fn(call))
    except Exception as err:  # noqa: BLE001
        raise RuleError(f"op attribute {key} of {name} raised: {err}") from err
    return None if ok else f"op attribute {key} of {name} returned False"


def single_op_pattern(op: str) -> DFPattern:
    """A pattern matching any call of ``op`` (whatever its arguments)."""
    num = tvm.ir.Op.get(op).num_inputs
    args = [wildcard() for _ in range(max(num, 0))] if num is not None and num >= 0 else []
    return is_op(op)(*args, varg_default_wildcard=True)


def op_rule_pattern(target: str, op: str, log: DecisionLog) -> FusionPattern:
    """The op rule of ``op`` for ``target`` as a FusionPattern making composite
    ``<target>.op.<short op name>``; rejections go to ``log``."""
    target = get_target(target).name
    rule_name = f"{target}.{op}"

    def decide(match: Match) -> str | None:
        return check_op_rule(target, match.call)

    return checked_fusion_pattern(f"{target}.op.{short_op_name(op)}", single_op_pattern(op), {},
                                  decide, log, rule_name)
