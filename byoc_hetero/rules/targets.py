"""Offload targets (backends): a name, an optional guard for op rules, pattern rules, a codegen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax

from ..errors import RuleError

if TYPE_CHECKING:  # only for annotations: patterns.py imports this module
    from .patterns import PatternRule


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


_TARGETS: dict[str, Target] = {}

Codegen = Callable[[Any, Any, Any], list]
"""``codegen(funcs, options, constant_names) -> list[tvm.runtime.Module]`` (what RunCodegen calls)."""


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


def declared_target(name: str, what: str) -> Target:
    """The target ``name`` that a rule (``what``) is registered for; RuleError unless it was declared.

    Rules for a target nobody declared used to be accepted silently, and the partition then failed
    inside TVM (``Codegen is not found: relax.ext.<name>``): declaring the target first is where its
    codegen is given, so a rule cannot name a target that has none."""
    if name not in _TARGETS:
        raise RuleError(f"{what}: target {name!r} is not declared; call bh.register_target({name!r}, "
                        f"codegen=...) first (registered targets: {sorted(_TARGETS)})")
    return _TARGETS[name]


def require_codegens(mod: tvm.IRModule) -> None:
    """RuleError unless every region of ``mod`` (a function with TVM's ``Codegen`` attribute) has its
    codegen ``relax.ext.<name>`` registered: called before RunCodegen, which would fail with TVM's
    own ``InternalError: Codegen is not found``."""
    names = {str(f.attrs["Codegen"]) for _, f in mod.functions_items()
             if isinstance(f, relax.Function) and f.attrs is not None and "Codegen" in f.attrs}
    for name in sorted(names):
        if tvm.get_global_func(f"relax.ext.{name}", allow_missing=True) is None:
            raise RuleError(f"target {name!r} has no codegen: give one with bh.register_target({name!r}, "
                            f"codegen=my_codegen), or codegen='byoc_hetero' to run its regions on the "
                            "oneDNN runtime")


def targets() -> list[str]:
    """Names of the registered targets."""
    return sorted(_TARGETS)
