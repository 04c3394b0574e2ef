"""Offload rules: which calls each target can run (see :mod:`.registry`), and the built-in set."""

from .builtin import TARGET as DEFAULT_TARGET
from .builtin import register_builtin_rules
from .registry import (
    DECISIONS,
    Match,
    PatternRule,
    Rejection,
    get_target,
    op_rule,
    op_rule_ops,
    pattern_rules,
    register_pattern,
    register_target,
    targets,
    unregister_op_rule,
    unregister_pattern,
)

register_builtin_rules()

__all__ = [
    "DECISIONS",
    "DEFAULT_TARGET",
    "Match",
    "PatternRule",
    "Rejection",
    "get_target",
    "op_rule",
    "op_rule_ops",
    "pattern_rules",
    "register_pattern",
    "register_target",
    "targets",
    "unregister_op_rule",
    "unregister_pattern",
]
