"""Offload rules: which calls each target (backend) can run. Generic: no backend lives here.

Two kinds of rules, as in TVM's classic BYOC:

* **Pattern rules** (:func:`register_pattern`, :mod:`.patterns`): a dataflow pattern such as
  conv2d → add(bias) → relu, grouped by ``MergeComposite`` into one composite function named
  ``<target>.<rule name>``.
* **Op-attribute rules** (:func:`op_rule`, :mod:`.op_rules`, or
  ``tvm.ir.register_op_attr(op, "target.<target>", fn)`` directly): a single op whose attribute
  function returns True for a call becomes a single-op composite in ``AnnotateTarget``.

Every rule may carry a *check* (:mod:`.match`). A check receives a :class:`Match` and returns
``True``/``None`` to accept, or ``False`` or a string (the reason) to reject; a rejected call stays
with TVM (llvm) and the reason is recorded in the run's decision log (:mod:`.decisions`), which the
stages write onto the module they return (:func:`rejections` reads it back).

Priority: within one target, pattern rules are tried by descending ``priority``, then in
registration order; a larger pattern should therefore get a higher priority than its prefixes.
Across targets, the order given to :func:`byoc_hetero.stages` decides: earlier targets win, for
patterns and op rules alike (as ``AnnotateTarget([A, B])`` did in Relay).

The built-in rules of backend ``onednn`` (alias ``byoc_hetero``) live with their lowering in
:mod:`byoc_hetero.backends.onednn`; :class:`Backend` is what a backend is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .decisions import DECISIONS_ATTR, DecisionLog, Rejection, latest_rejection, rejections
from .match import Check, CheckResult, Match, run_check, single_call_match
from .op_rules import (
    check_op_rule,
    op_attr_key,
    op_rule,
    op_rule_ops,
    op_rule_pattern,
    single_op_pattern,
    unregister_op_rule,
)
from .patterns import (
    CONST_DIGEST_ATTR,
    ConstantsDigest,
    PatternRule,
    Variadic,
    checked_fusion_pattern,
    pattern_rules,
    register_pattern,
    required_ops,
    unregister_pattern,
)
from ..targets import (
    Backend,
    Codegen,
    Knob,
    Option,
    Target,
    Tunable,
    Variant,
    backend_for_runtime,
    canonical_name,
    declared_target,
    default_target,
    get_backend,
    get_target,
    register_target,
    require_codegens,
    set_default_target,
    targets,
)


def all_rules_summary(names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """For each target, its pattern rule names (in try order) and its op-rule ops."""
    return {name: {"patterns": [r.name for r in pattern_rules(name)], "ops": op_rule_ops(name)}
            for name in (names or targets())}


__all__ = [
    "Backend",
    "Knob",
    "Option",
    "Tunable",
    "Variant",
    "backend_for_runtime",
    "canonical_name",
    "default_target",
    "get_backend",
    "set_default_target",
    "CONST_DIGEST_ATTR",
    "DECISIONS_ATTR",
    "Check",
    "CheckResult",
    "Codegen",
    "ConstantsDigest",
    "DecisionLog",
    "Match",
    "PatternRule",
    "Rejection",
    "Target",
    "all_rules_summary",
    "check_op_rule",
    "checked_fusion_pattern",
    "get_target",
    "latest_rejection",
    "op_attr_key",
    "op_rule",
    "op_rule_ops",
    "op_rule_pattern",
    "pattern_rules",
    "register_pattern",
    "register_target",
    "require_codegens",
    "rejections",
    "required_ops",
    "Variadic",
    "run_check",
    "single_call_match",
    "single_op_pattern",
    "targets",
    "unregister_op_rule",
    "unregister_pattern",
]
