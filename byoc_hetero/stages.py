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

This module drives the stages: the rewrites each stage runs are the lists of
:mod:`byoc_hetero.passes` (``BEFORE_FUSION``, ``BEFORE_MERGE``, ``AFTER_MERGE``; ``BEFORE_STAGES``
in :func:`partition`), in the order listed there, and the backends are asked by name
(:func:`byoc_hetero.rules.get_target`): nothing here names a pass or a backend.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ._relax import (
    TARGET_ATTR,
    composite_target,
    entry_functions,
    is_composite,
    is_region,
    op_calls,
    ops_in,
    region_composites,
    static_shape,
    updated,
)
from .errors import CodegenError, FrontendError, PlacementWarning, RuleError
from .passes import (
    AFTER_MERGE,
    BEFORE_FUSION,
    BEFORE_MERGE,
    BEFORE_STAGES,
    MAX_REGION_NAME,
    inline_composites,
    merge_composite_functions,
    run_passes,
)
from .passes.host_code_anchor import host_code_anchor
from .passes.cost_gate import DEFAULT_MIN_REGION_OPS, HEAVY_OPS, HOST, gated_composites, region_key
from .passes.retarget_regions import region_as_main, retarget_regions
from .qdq_checks import check_relax as check_relax_qdq
from .ranges import codegen_options as range_codegen_options
from .ranges import insert_range_checks
from .rules import (
    DECISIONS_ATTR,
    DecisionLog,
    default_target,
    get_target,
    require_codegens,
    op_rule_ops,
    op_rule_pattern,
    pattern_rules,
)


TargetSpec = str | Sequence[str] | None
"""A backend name (or alias), names in priority order, or None for the default backend."""


def target_names(target: TargetSpec) -> list[str]:
    """The backends' names (aliases resolved); RuleError naming the known targets otherwise."""
    names = [default_target()] if target is None else [target] if isinstance(target, str) else list(target)
    if not names:
        raise RuleError("at least one offload target is needed")
    return [get_target(name).name for name in names]


def codegen_options(names: Sequence[str], precision: str | None = None,
                    options: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """What each backend's codegen is given: ``options`` (``{backend: {option: value}}``) checked by
    the backend (a :class:`RuleError` names an option the backend does not know), and
    ``precision`` for every chosen backend that has a ``precision`` option (a RuleError when none
    has). Options equal to the backend's default are left out."""
    out: dict[str, dict[str, Any]] = {}
    for name, opts in (options or {}).items():
        backend = get_target(name)
        out.setdefault(backend.name, {}).update(backend.check_options(opts))
    if precision is not None:
        takers = [get_target(n) for n in names if "precision" in get_target(n).options]
        if not takers:
            raise RuleError(f"precision={precision!r}: none of the backends {list(names)} has a precision option")
        for backend in takers:
            out.setdefault(backend.name, {}).update(backend.check_options({"precision": precision}))
    for name, opts in out.items():
        declared = get_target(name).options
        for key in [k for k, v in opts.items() if declared[k].default is not None and v == declared[k].default]:
            del opts[key]
    return {name: opts for name, opts in out.items() if opts}


def _fuse(mod: tvm.IRModule, patterns: list) -> tvm.IRModule:
    """FuseOpsByPattern into composites (no codegen annotation) over every entry function.

    FuseOpsByPattern lifts a reshape's target shape to a parameter of its composite; the
    composites of both fusing stages take such shapes inside once, before merging
    (:data:`byoc_hetero.passes.BEFORE_MERGE`)."""
    mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
    return relax.transform.FuseOpsByPattern(
        patterns, bind_constants=True, annotate_codegen=False, entry_functions=entry_functions(mod),
    )(mod)


def merge_composite(target: TargetSpec = None) -> tvm.transform.Pass:
    """Stage 1 (MergeComposite): group pattern-rule matches into composite functions."""
    names = target_names(target)

    @tvm.transform.module_pass(opt_level=0, name="MergeComposite")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        # the first stage: the run's decisions so far are what the passes before the stages recorded
        # (fold_int_constants' index bound); partition() clears what an earlier run left
        log = DecisionLog.from_module(mod)
        present = ops_in(mod)
        patterns = [fp for t in names for rule in pattern_rules(t) if rule.ops_needed <= present
                    for fp in rule.fusion_patterns(log, mod)]
        mod = run_passes(BEFORE_FUSION, mod)
        if patterns:
            mod = _fuse(mod, patterns)
        return log.attach(mod)

    return stage


def annotate_target(target: TargetSpec = None) -> tvm.transform.Pass:
    """Stage 2 (AnnotateTarget): op-attribute rules → one-op composites; mark composites' targets."""
    names = target_names(target)

    @tvm.transform.module_pass(opt_level=0, name="AnnotateTarget")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        log = DecisionLog.from_module(mod)
        patterns = [op_rule_pattern(t, op, log) for t in names for op in op_rule_ops(t)]
        if patterns:
            mod = _fuse(mod, patterns)
        return log.attach(_mark_composite_targets(mod, names))

    return stage


def _mark_composite_targets(mod: tvm.IRModule, names: list[str]) -> tvm.IRModule:
    updates = {}
    for gv, func in mod.functions_items():
        tgt = composite_target(func) if isinstance(func, relax.Function) else None
        if tgt in names and TARGET_ATTR not in func.attrs:
            updates[gv] = func.with_attr(TARGET_ATTR, tgt)
    return updated(mod, updates) if updates else mod


def merge_compiler_regions(min_region_ops: int = DEFAULT_MIN_REGION_OPS,
                           require_heavy_op: bool = True,
                           region_codegen: Mapping[str, str] | None = None) -> tvm.transform.Pass:
    """Stage 3 (MergeCompilerRegions, with PartitionGraph's outlining): MergeCompositeFunctions.

    Then the cost gate (as Torch-TensorRT's ``min_block_size``): a region with fewer than
    ``min_region_ops`` Relax ops, or (``require_heavy_op``) without a conv/dense/matmul, goes back
    to TVM; the reason is recorded for every op of it. ``region_codegen`` (region key, see
    :func:`byoc_hetero.passes.cost_gate.region_key` → ``"llvm"`` or the region's backend) decides
    instead of that rule for the regions it names; a key that names no region warns
    (:class:`~byoc_hetero.PlacementWarning`).
    """
    codegen = _codegen_map(region_codegen)

    @tvm.transform.module_pass(opt_level=0, name="MergeCompilerRegions")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        log = DecisionLog.from_module(mod)
        if not any(is_composite(f) for f in mod.functions.values()):
            return log.attach(mod)  # nothing to merge
        mod = run_passes(BEFORE_MERGE, mod)
        used: set[str] = set()
        while True:
            merged = _merge(mod)
            gated = gated_composites(mod, merged, min_region_ops, require_heavy_op, log, codegen, used)
            if not gated:
                _warn_unused_keys(codegen, used)
                merged = retarget_regions(merged, codegen, _region_keys(merged) if codegen else {}, retarget_region)
                return log.attach(run_passes(AFTER_MERGE, merged))
            mod = inline_composites(mod, gated)

    return stage


def _op_count(region: relax.Function) -> int:
    return sum(len(op_calls(f)) for f in region_composites(region))


def retarget_region(region: relax.Function, backend: str) -> relax.Function | str:
    """``region`` as a region of ``backend`` (a registered target's name), or why it cannot be."""
    mod = region_as_main(region)
    try:
        for stage in stages(backend, 1, False)[:3]:
            mod = stage(mod)
    except Exception as err:  # noqa: BLE001 - a backend's rules may fail on ops they never saw
        return f"its stages failed on the region's ops: {err}"
    found = [(gv, f) for gv, f in mod.functions_items() if is_region(f)]
    if len(found) != 1:
        return f"{backend} forms {len(found)} regions of its ops, not one"
    ((gv, new),) = found
    if _op_count(new) != _op_count(region):
        return f"{backend} takes {_op_count(new)} of its {_op_count(region)} ops"
    order = _param_order(mod["main"], gv)
    if order is None:
        return f"{backend}'s region does not take the region's parameters one to one"
    params = [new.params[j] for j in order]
    out = relax.Function(params, new.body, new.ret_ty, new.is_pure, new.attrs)
    return out.with_attr("global_symbol", region.attrs["global_symbol"])


def _param_order(main: relax.Function, gv: tvm.ir.GlobalVar) -> list[int] | None:
    """For each parameter of ``main`` in order, the index of the argument of the one call of
    ``gv`` that passes it; None unless ``main`` is only that call on its parameters, returned."""
    body = main.body
    bindings = [b for block in body.blocks for b in block.bindings]
    calls = [b for b in bindings if isinstance(b.value, relax.Call) and b.value.op.same_as(gv)]
    if len(calls) != 1 or len(bindings) > 2:
        return None
    call = calls[0]
    returned = body.body
    if not (returned.same_as(call.var) or (len(bindings) == 2 and bindings[1].value.same_as(call.var)
                                           and returned.same_as(bindings[1].var))):
        return None
    args = list(call.value.args)
    order = [next((j for j, a in enumerate(args) if a.same_as(p)), -1) for p in main.params]
    return order if sorted(order) == list(range(len(args))) else None


def _region_keys(mod: tvm.IRModule) -> dict[tvm.ir.GlobalVar, str]:
    """Each region of ``mod`` and its :func:`~byoc_hetero.passes.cost_gate.region_key`."""
    return {gv: region_key(f) for gv, f in mod.functions_items() if is_region(f)}


def _codegen_map(region_codegen: Mapping[str, str] | None) -> dict[str, str]:
    """``region_codegen`` with backend aliases resolved (a RuleError names an unknown codegen)."""
    out = {}
    for key, codegen in (region_codegen or {}).items():
        out[str(key)] = HOST if codegen == HOST else get_target(codegen).name
    return out


def _warn_unused_keys(codegen: Mapping[str, str], used: set[str]) -> None:
    unused = sorted(set(codegen) - used)
    if unused:
        warnings.warn(f"region_codegen: no region has the key(s) {', '.join(unused)}; they changed nothing "
                      "(the keys are those bh.tune's report or byoc_hetero.tune.codegen.candidate_regions give)",
                      PlacementWarning, stacklevel=2)


def _merge(mod: tvm.IRModule) -> tvm.IRModule:
    """MergeCompositeFunctions (:mod:`byoc_hetero.passes.merge_composite_functions`), after making
    sure each entry function defines every variable it reads: TVM's pass fails on one that does
    not with only "memo_.count(...)" (no name), so the error here names the function and the
    variables. The stages never make such a function (a composite's symbolic shape parameter
    left in a type by inlining was the cause; :mod:`byoc_hetero.passes.close_shape_arguments` and
    :mod:`byoc_hetero.passes.inline_composites` keep them defined); a module given to the stage
    with one is malformed input."""
    stray = [f"{name} reads {', '.join(sorted({str(v.name) for v in free}))}, which nothing in it defines"
             for name in entry_functions(mod) for free in [relax.analysis.free_vars(mod[name])] if free]
    if stray:
        raise CodegenError(f"MergeCompilerRegions cannot group the composites: {'; '.join(stray)}")
    return merge_composite_functions(mod)


def partition_graph(options: Mapping[str, Mapping] | None = None) -> tvm.transform.Pass:
    """Stage 4 (PartitionGraph, with the codegen): RunCodegen, then drop the region functions."""

    @tvm.transform.module_pass(opt_level=0, name="PartitionGraph")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        log = DecisionLog.from_module(mod)
        # declared dim ranges: written into the regions' documents by the codegen, and checked at
        # the start of each function, so that the built module enforces them however it is run
        given = {target: dict(opts) for target, opts in (options or {}).items()}
        ranges = range_codegen_options(mod, entry_functions(mod))
        for name in _region_backends(mod) if ranges else ():
            backend = get_target(name)
            if "dim_ranges" in backend.options:
                given.setdefault(backend.name, {}).update(backend.check_options(ranges))
        # RunCodegen looks options up by a region's Codegen name: an alias gets its backend's
        for name in list(given):
            for alias in get_target(name).aliases:
                given.setdefault(alias, given[name])
        require_codegens(mod)  # a bh.RuleError naming the target, not TVM's "Codegen is not found"
        mod = relax.transform.RunCodegen(given, entry_functions(mod))(mod)
        mod = relax.transform.DeadCodeElimination(entry_functions(mod))(mod)
        return log.attach(host_code_anchor(insert_range_checks(mod, entry_functions(mod))))

    return stage


def stages(target: TargetSpec = None, min_region_ops: int = DEFAULT_MIN_REGION_OPS,
           require_heavy_op: bool = True, precision: str | None = None,
           options: Mapping[str, Mapping[str, Any]] | None = None,
           region_codegen: Mapping[str, str] | None = None) -> list[tvm.transform.Pass]:
    """The four partition stages for ``target`` (a name, or names in priority order; None: the
    default backend, ``onednn``).

    ``min_region_ops`` and ``require_heavy_op`` set the cost gate of MergeCompilerRegions;
    ``region_codegen`` (region key → ``"llvm"`` or the backend, as ``bh.tune`` decides it) overrides
    the gate for the regions it names.
    ``precision`` goes to every chosen backend with a ``precision`` option: ``"bf16"`` makes the
    oneDNN regions compute conv2d / dense / matmul in bf16 (f32 accumulation; inputs and outputs
    stay float32); where the CPU has no native bf16 it warns once and the regions run float32
    (``bh.report`` says so per region). ``options`` gives backends their options by name
    (``{"onednn": {"precision": "bf16"}}``); an option a backend does not know is a
    :class:`RuleError` naming it and the backend.

    Each item is a ``tvm.transform.Pass``; ``stage.info.name`` is its classic name. Apply them in
    order (after :func:`bind_params` when weights should become constants)::

        m = bh.bind_params(mod, params)
        for stage in bh.stages():
            m = stage(m)
            print(stage.info.name, bh.op_profile(m))
    """
    names = target_names(target)
    given = codegen_options(names, precision, options)
    return [merge_composite(names), annotate_target(names),
            merge_compiler_regions(min_region_ops, require_heavy_op, region_codegen), partition_graph(given)]


def _region_backends(mod: tvm.IRModule) -> set[str]:
    """The backends (Codegen names) of the regions of ``mod``."""
    return {str(f.attrs["Codegen"]) for f in mod.functions.values() if is_region(f)}


_CPU = tvm.cpu().dlpack_device_type()


def shared_params(params: Mapping[str, Any], alignment: int = 64) -> dict[str, Any]:
    """``params`` with each array that can be shared as a TVM tensor over its own memory:
    :func:`bind_params` then binds it without a copy (the constant and the array are one copy of
    the weight). An array can be shared when it is C-contiguous, writable and its data aligned to
    ``alignment`` bytes: 64 by default, what TVM's generated code assumes of a tensor's data
    (``tvm.runtime.from_dlpack``), as torch allocates; a caller whose constants only region modules
    read (they need their element's alignment) may pass less and must check that no host function
    reads a less aligned one (``bh.llm``: a model's weights mapped from a safetensors file lie at
    8-byte offsets). Any other value is left as it is (``bind_params`` copies it). The module's constant
    then *is* the array: a change to the array after the build changes the constant under the built
    module (whose regions prepared their layouts from the old values), so share only weights that
    stay as they are (``bh.llm.from_hf``'s generator refuses to run after an in-place change of a
    torch parameter it shares: ``Generator.check_sources``)."""
    out = {}
    for name, value in params.items():
        if isinstance(value, np.ndarray) and value.flags.c_contiguous and value.flags.writeable and value.size:
            try:
                value = tvm_ffi.from_dlpack(value, require_alignment=alignment, require_contiguous=True)
            except (ValueError, TypeError, BufferError, RuntimeError):
                pass  # misaligned (tvm_ffi raises RuntimeError), or a dtype DLPack does not carry: copied
        out[name] = value
    return out


def bind_params(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None, func: str = "main") -> tvm.IRModule:
    """Bind weights as constants of ``func`` (its parameters named like the keys of ``params``).

    A value is copied into a TVM tensor of its own, except a CPU ``tvm.runtime.Tensor``, which is
    bound as it is (shared, no copy: ``bh.llm`` binds a model's weights so, issue 36's build peak).
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
        shared = isinstance(value, tvm.runtime.Tensor) and value.device.dlpack_device_type() == _CPU
        arr = value if shared else value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        ty = declared[name].ty
        want_shape = static_shape(declared[name])
        if want_shape is not None and tuple(arr.shape) != want_shape:
            raise ValueError(f"parameter {name!r}: expected shape {list(want_shape)}, got {list(arr.shape)}")
        if isinstance(ty, relax.TensorType) and str(ty.dtype) != str(arr.dtype):
            raise ValueError(f"parameter {name!r}: expected dtype {ty.dtype}, got {arr.dtype}")
        # np.ascontiguousarray would make a 0-d array 1-d (a scalar index of shape (1,))
        bound[name] = arr if shared else tvm.runtime.tensor(np.require(arr, requirements="C"))
    return relax.transform.BindParams(func, bound)(mod)


def partition(
    mod: tvm.IRModule,
    params: Mapping[str, np.ndarray] | None = None,
    target: TargetSpec = None,
    min_region_ops: int = DEFAULT_MIN_REGION_OPS,
    require_heavy_op: bool = True,
    precision: str | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    region_codegen: Mapping[str, str] | None = None,
) -> tvm.IRModule:
    """Bind ``params`` (if given) and run all four stages: the module ``relax.build`` takes.

    ``precision``: ``"f32"`` (the oneDNN backend's default) or ``"bf16"``; ``options``: per backend;
    ``region_codegen``: which regions run where, over the cost gate's rule (see :func:`stages`). A
    quantized module's constant scales and zero points are checked first
    (:class:`~byoc_hetero.errors.QuantizationError` naming the op and value for a malformed one).
    """
    if not isinstance(mod, tvm.IRModule):
        raise FrontendError(f"partition expects a tvm.IRModule (as bh.from_onnx / bh.from_torch return it), "
                            f"got {type(mod).__name__}")
    check_relax_qdq(mod, params)
    if mod.attrs is not None and DECISIONS_ATTR in mod.attrs:
        mod = mod.without_attr(DECISIONS_ATTR)  # this run's decisions start afresh
    mod = run_passes(BEFORE_STAGES, bind_params(mod, params))
    for stage in stages(target, min_region_ops, require_heavy_op, precision, options, region_codegen):
        mod = stage(mod)
    return mod


__all__ = [
    "DEFAULT_MIN_REGION_OPS", "HEAVY_OPS", "MAX_REGION_NAME", "TARGET_ATTR", "TargetSpec", "annotate_target",
    "bind_params", "codegen_options", "merge_compiler_regions", "merge_composite", "partition", "partition_graph",
    "shared_params", "stages",
]
