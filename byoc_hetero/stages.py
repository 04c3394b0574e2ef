"""The four classic BYOC partition stages, as Relax module passes.

=========================  ==================================================================
classic (Relay) stage      what the stage does here (Relax)
=========================  ==================================================================
``MergeComposite``         ``FuseOpsByPattern(annotate_codegen=False)`` over every pattern rule
                           of the chosen targets: each accepted match becomes a composite
                           function ``<target>.<rule>`` called from ``main``.
``AnnotateTarget``         op-attribute rules (``target.<name>`` on an op): each accepted single
                           call becomes a one-op composite; every composite function is then
                           marked with the target that will run it (attribute
                           ``byoc_hetero.target``).
``MergeCompilerRegions``   ``MergeCompositeFunctions``: merges neighbouring composites of one
                           target into regions without creating cycles, *and* outlines each region
                           as a function with a ``Codegen`` attribute — Relax does Relay's
                           MergeCompilerRegions and the outlining half of PartitionGraph in this
                           one pass.
``PartitionGraph``         ``RunCodegen``: hands each region to the target's codegen
                           (``relax.ext.<target>``) and replaces its call sites by
                           ``call_dps_packed`` of the external symbol; the compiled regions ride
                           along as external modules, so stock ``relax.build`` links them.
=========================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from . import codegen as _codegen  # noqa: F401  (registers relax.ext.byoc_hetero)
from .errors import RuleError
from .rules import DECISIONS, DEFAULT_TARGET, get_target, op_rule_ops, pattern_rules
from .rules.registry import Match, check_op_rule, run_check, single_op_pattern, static_shape

TARGET_ATTR = "byoc_hetero.target"

TargetSpec = str | Sequence[str]


def _targets(target: TargetSpec) -> list[str]:
    names = [target] if isinstance(target, str) else list(target)
    if not names:
        raise RuleError("at least one offload target is needed")
    for name in names:
        get_target(name)  # raises RuleError naming the known targets
    return names


def _entry_functions(mod: tvm.IRModule) -> list[str]:
    """Functions the stages work on: the module's Relax functions that are not composites/regions."""
    names = []
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        attrs = func.attrs
        if attrs is not None and ("Composite" in attrs or "Codegen" in attrs):
            continue
        names.append(gv.name_hint)
    return names


def merge_composite(target: TargetSpec = DEFAULT_TARGET) -> tvm.transform.Pass:
    """Stage 1 (MergeComposite): group pattern-rule matches into composite functions."""
    names = _targets(target)

    @tvm.transform.module_pass(opt_level=0, name="MergeComposite")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        DECISIONS.rejections.clear()
        patterns = [rule.fusion_pattern() for t in names for rule in pattern_rules(t)]
        if not patterns:
            return mod
        mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
        return relax.transform.FuseOpsByPattern(
            patterns, bind_constants=True, annotate_codegen=False,
            entry_functions=_entry_functions(mod),
        )(mod)

    return stage


def _op_rule_pattern(target: str, op_name: str) -> relax.transform.FusionPattern:
    tgt = get_target(target)
    rule_name = f"{target}.{op_name}"

    def check(ctx) -> bool:
        call = ctx.matched_expr
        reason = check_op_rule(target, call)
        if reason is None and tgt.can_lower is not None:
            reason = run_check(lambda _m: tgt.can_lower(call), Match(call, {"root": call}), rule_name)
        if reason is not None:
            DECISIONS.add(rule_name, call, reason)
            return False
        return True

    short = op_name.removeprefix("relax.")
    return relax.transform.FusionPattern(f"{target}.op.{short}", single_op_pattern(op_name), {}, check)


def annotate_target(target: TargetSpec = DEFAULT_TARGET) -> tvm.transform.Pass:
    """Stage 2 (AnnotateTarget): op-attribute rules → one-op composites; mark composites' targets."""
    names = _targets(target)

    @tvm.transform.module_pass(opt_level=0, name="AnnotateTarget")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        patterns = [_op_rule_pattern(t, op) for t in names for op in op_rule_ops(t)]
        if patterns:
            mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
            mod = relax.transform.FuseOpsByPattern(
                patterns, bind_constants=True, annotate_codegen=False,
                entry_functions=_entry_functions(mod),
            )(mod)
        return _mark_composite_targets(mod, names)

    return stage


def composite_target(func: relax.Function) -> str | None:
    """The target of a composite function (the prefix of its ``Composite`` name)."""
    attrs = func.attrs
    if attrs is None or "Composite" not in attrs:
        return None
    return str(attrs["Composite"]).split(".", 1)[0]


def _mark_composite_targets(mod: tvm.IRModule, names: list[str]) -> tvm.IRModule:
    updates = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            tgt = composite_target(func)
            if tgt in names and TARGET_ATTR not in func.attrs:
                updates[gv] = func.with_attr(TARGET_ATTR, tgt)
    for gv, func in updates.items():
        mod[gv] = func
    return mod


def merge_compiler_regions() -> tvm.transform.Pass:
    """Stage 3 (MergeCompilerRegions, with PartitionGraph's outlining): MergeCompositeFunctions."""

    @tvm.transform.module_pass(opt_level=0, name="MergeCompilerRegions")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return relax.transform.MergeCompositeFunctions()(mod)

    return stage


def partition_graph(options: Mapping[str, Mapping] | None = None) -> tvm.transform.Pass:
    """Stage 4 (PartitionGraph, with the codegen): RunCodegen, then drop the region functions."""

    @tvm.transform.module_pass(opt_level=0, name="PartitionGraph")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = relax.transform.RunCodegen(dict(options or {}), _entry_functions(mod))(mod)
        return relax.transform.DeadCodeElimination(_entry_functions(mod))(mod)

    return stage


def stages(target: TargetSpec = DEFAULT_TARGET) -> list[tvm.transform.Pass]:
    """The four partition stages for ``target`` (a name, or names in priority order).

    Each item is a ``tvm.transform.Pass``; ``stage.info.name`` is its classic name. Apply them in
    order (after :func:`bind_params` when weights should become constants)::

        m = bh.bind_params(mod, params)
        for stage in bh.stages():
            m = stage(m)
            print(stage.info.name, bh.op_profile(m))
    """
    names = _targets(target)
    return [merge_composite(names), annotate_target(names), merge_compiler_regions(), partition_graph()]


def bind_params(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None, func: str = "main") -> tvm.IRModule:
    """Bind weights as constants of ``func`` (its parameters named like the keys of ``params``).

    Raises ``ValueError`` naming the parameter when a name is unknown or a shape/dtype does not
    match the declared parameter.
    """
    if not params:
        return mod
    if func not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError(f"module has no function {func!r} to bind parameters into")
    declared = {p.name: p for p in mod[func].params}
    bound = {}
    for name, value in params.items():
        if name not in declared:
            raise ValueError(
                f"parameter {name!r} is not a parameter of {func}; its parameters are {sorted(declared)}"
            )
        arr = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        ty = declared[name].ty
        want_shape = static_shape(declared[name])
        if want_shape is not None and tuple(arr.shape) != want_shape:
            raise ValueError(f"parameter {name!r}: expected shape {list(want_shape)}, got {list(arr.shape)}")
        if isinstance(ty, relax.TensorType) and str(ty.dtype) != str(arr.dtype):
            raise ValueError(f"parameter {name!r}: expected dtype {ty.dtype}, got {arr.dtype}")
        bound[name] = tvm.runtime.tensor(np.ascontiguousarray(arr))
    return relax.transform.BindParams(func, bound)(mod)


def partition(
    mod: tvm.IRModule,
    params: Mapping[str, np.ndarray] | None = None,
    target: TargetSpec = DEFAULT_TARGET,
) -> tvm.IRModule:
    """Bind ``params`` (if given) and run all four stages: the module ``relax.build`` takes."""
    mod = bind_params(mod, params)
    for stage in stages(target):
        mod = stage(mod)
    return mod
