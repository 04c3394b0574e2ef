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

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ._relax import (
    bound_values,
    called_function,
    composite_target,
    entry_functions,
    function_outputs,
    is_composite,
    is_region,
    op_calls,
    op_name,
    opaque_dims,
    ops_in,
    region_composites,
    shape_of,
    static_shape,
    updated,
)
from .backends.onednn import TARGET as DEFAULT_TARGET
from .backends.onednn.precision import DEFAULT_PRECISION, check_precision, warn_if_fallback
from .errors import CodegenError, RuleError, first_line
from .fold import fold_int_constants
from .passes.drop_zero_pads import drop_zero_pads
from .passes.fold_weight_subgraphs import fold_weight_subgraphs
from .ranges import codegen_options as range_codegen_options
from .ranges import insert_range_checks
from .rules import (
    CONST_DIGEST_ATTR,
    DecisionLog,
    get_target,
    op_rule_ops,
    op_rule_pattern,
    pattern_rules,
    required_ops,
)

TARGET_ATTR = "byoc_hetero.target"
"""Attribute of a composite function: the target that will run it (set by AnnotateTarget)."""

TargetSpec = str | Sequence[str]


def _targets(target: TargetSpec) -> list[str]:
    names = [target] if isinstance(target, str) else list(target)
    if not names:
        raise RuleError("at least one offload target is needed")
    for name in names:
        get_target(name)  # raises RuleError naming the known targets
    return names


def _fuse(mod: tvm.IRModule, patterns: list) -> tvm.IRModule:
    """FuseOpsByPattern into composites (no codegen annotation) over every entry function."""
    mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
    mod = relax.transform.FuseOpsByPattern(
        patterns, bind_constants=True, annotate_codegen=False, entry_functions=entry_functions(mod),
    )(mod)
    return _close_shape_arguments(mod)


def _drop_needless_broadcasts(mod: tvm.IRModule) -> tvm.IRModule:
    """Broadcasts that copy for nothing go: ``broadcast_to(x, s)`` where ``s`` is ``x``'s own shape
    becomes ``x``.

    torch.export writes one before each batched matmul operand (``expand``). With symbolic dims it
    harms: as a composite of its own, FuseOpsByPattern passes ``s`` in as a parameter, and
    broadcast_to's type inference gives the composite a result of unknown shape
    (``R.Tensor(param_0)``, rank only); that result type refers to the composite's parameter,
    which inlining the composite back into ``main`` (the cost gate) leaves undefined, and then
    MergeCompositeFunctions fails ("memo_.count", torch.export's BERT-like model with a
    dynamic batch and sequence length). The op copies nothing, so it is dropped before fusing.

    Also ``matmul(a, broadcast_to(w, [B, K, N]))`` with a 2-D ``w`` and ``a`` of shape ``[B, M, K]``
    becomes ``matmul(a, w)``: the same result (relax.matmul broadcasts), without repeating the weight
    per batch (torch.export's Linear on the attention output of a transformers BertModel with a
    dynamic batch: the broadcast stayed on llvm and split the model into regions).
    """
    def drop(_var, call):
        if op_name(call) != "relax.broadcast_to":
            return None
        data, shape = call.args
        before = getattr(data.ty, "shape", None)
        if (isinstance(shape, relax.ShapeExpr) and isinstance(before, relax.ShapeExpr)
                and isinstance(call.ty, relax.TensorType) and call.ty.dtype == data.ty.dtype
                and tvm_ffi.structural_equal(before, shape)):
            return data
        return None

    def unbroadcast_weight(values, call):
        # matmul(a, broadcast_to(w, [*lead, K, N])) with a 2-D w and a of shape [*lead, M, K]:
        # relax.matmul broadcasts w itself, so the result is the same without the copy (torch.export
        # writes it for a Linear on a 3-D non-contiguous input, as bmm with an expanded weight)
        if op_name(call) != "relax.matmul":
            return None
        lhs, rhs = call.args
        bcast = values.get(rhs) if isinstance(rhs, relax.Var) else None
        if not (isinstance(bcast, relax.Call) and op_name(bcast) == "relax.broadcast_to"):
            return None
        weight, target = bcast.args
        w_shape, a_shape = getattr(weight.ty, "shape", None), getattr(lhs.ty, "shape", None)
        if not (isinstance(target, relax.ShapeExpr) and isinstance(w_shape, relax.ShapeExpr)
                and isinstance(a_shape, relax.ShapeExpr) and len(w_shape.values) == 2
                and len(a_shape.values) == len(target.values) >= 3):
            return None
        same = tvm_ffi.structural_equal
        if not (all(same(x, y) for x, y in zip(target.values[-2:], w_shape.values))
                and all(same(x, y) for x, y in zip(target.values[:-2], a_shape.values[:-2]))):
            return None
        return relax.Call(call.op, [lhs, weight], call.attrs, call.ty_args, ret_ty=call.ty)

    changes = {}
    for name in entry_functions(mod):
        values = bound_values(mod[name])

        def change(var, call, values=values):
            new = drop(var, call)
            return new if new is not None else unbroadcast_weight(values, call)

        func = _map_calls(mod[name], change)
        if not func.same_as(mod[name]):
            changes[mod.get_global_var(name)] = func
    return updated(mod, changes) if changes else mod


def _close_shape_arguments(mod: tvm.IRModule, regions: bool = False) -> tvm.IRModule:
    """Composites that FuseOpsByPattern gave a shape argument (``R.shape([s77, s27, 4, 16])`` of a
    reshape) take it inside where their tensor parameters define its symbols.

    FuseOpsByPattern lifts every non-constant argument to a parameter, a reshape's target shape
    too. A composite with a shape parameter makes a region that the VM calls with the shape as an
    argument (region format ``shape_args``), and inlining such a composite back into ``main``
    (the cost gate) can leave its parameter in types (``R.Tensor(param_0)``). Where each symbol
    of the shape is a bare dim of a tensor parameter (``[B, S, 64] -> [B, S, 4, 16]``), the shape
    is bound into the composite instead (``Function.bind_params``; a copy per distinct shape); a
    shape whose symbols only products give (``[B * S, 64] -> [B, S, 64]``) stays an argument.

    ``regions=True`` does the same for the regions MergeCompositeFunctions made: such a shape
    becomes a region parameter, and where the region's tensor parameters define its symbols (the
    input ``[B, S, 64]`` of a region whose inner composites reshape ``[B * S, 64] -> [B, S, 64]``)
    it is bound inside the region, so the VM does not build and pass it at every call (the
    torch.export'ed BERT-like model passed 16 shapes per call). A region keeps its name (its
    external symbol); one called with two different shapes is left as it is.
    """
    which = is_region if regions else is_composite
    entries = entry_functions(mod)
    plans: dict[str, dict[Any, tuple[relax.Function, list[relax.Expr], tvm.ir.GlobalVar]]] = {}
    open_calls: set[str] = set()  # composites still called with a shape argument somewhere
    for name in entries:
        plan = plans.setdefault(name, {})

        def visit(var, call, plan=plan):
            func = called_function(mod, call)
            if func is None or not which(func) or not any(isinstance(a, relax.ShapeExpr) for a in call.args):
                return None
            bound = _bind_shape_arguments(func, call)
            if bound is None:
                open_calls.add(call.op.name_hint)
                return None
            plan[var] = (bound[0], bound[1], call.op)
            return None

        _map_calls(mod[name], visit)
    if not any(plans.values()):
        return mod

    # distinct bound functions per composite, in call order
    variants: dict[str, list[relax.Function]] = {}
    for plan in plans.values():
        for func, _args, old in plan.values():
            known = variants.setdefault(old.name_hint, [])
            if not any(tvm_ffi.structural_equal(func, f) for f in known):
                known.append(func)
    # a composite every call of which binds one shape keeps its name (a new GlobalVar: the old
    # one carries the old signature as its type); others get numbered copies
    keep = {name for name, funcs in variants.items() if len(funcs) == 1 and name not in open_calls}
    if regions:
        variants = {name: funcs for name, funcs in variants.items() if name in keep}
        plans = {entry: {v: p for v, p in plan.items() if p[2].name_hint in keep} for entry, plan in plans.items()}
        if not keep:
            return mod
    builder = relax.BlockBuilder(updated(mod, remove=[mod.get_global_var(n) for n in keep]))
    taken = {gv.name_hint for gv in mod.get_global_vars()}
    gvs: dict[str, list[tvm.ir.GlobalVar]] = {}
    for name, funcs in variants.items():
        for func in funcs:
            new_name, k = name, 0
            while name not in keep and new_name in taken:
                k += 1
                new_name = f"{name}_{k}"
            taken.add(new_name)
            gvs.setdefault(name, []).append(builder.add_func(func, new_name))

    for name in entries:
        plan = plans[name]

        def rewrite(var, call, plan=plan):
            if var not in plan:
                return None
            func, args, old = plan[var]
            index = next(i for i, f in enumerate(variants[old.name_hint]) if tvm_ffi.structural_equal(func, f))
            return relax.Call(gvs[old.name_hint][index], args)

        func = _map_calls(mod[name], rewrite)
        if not func.same_as(mod[name]):
            builder.update_func(builder.get().get_global_var(name), func)
    # a composite no call takes any more (every call got a bound copy of another name)
    return relax.transform.DeadCodeElimination(entries)(builder.get())


def _bind_shape_arguments(func: relax.Function, call: relax.Call
                          ) -> tuple[relax.Function, list[relax.Expr]] | None:
    """``func`` with the shape arguments of ``call`` bound inside, and the arguments left; None
    when a symbol of a shape argument is no bare dim of a tensor argument."""
    # the composite has symbolic variables of its own: rename them to the caller's, read off
    # the tensor parameters' dims, so that the caller's shape is valid inside
    rename: dict[tvm.tirx.Var, tvm.tirx.Var] = {}
    defined: list[tvm.tirx.Var] = []
    shape_positions = []
    for i, (param, arg) in enumerate(zip(func.params, call.args)):
        if isinstance(arg, relax.ShapeExpr) and isinstance(param.ty, relax.ShapeType):
            shape_positions.append(i)
            continue
        ours, theirs = getattr(param.ty, "shape", None), getattr(arg.ty, "shape", None)
        if not isinstance(ours, relax.ShapeExpr) or not isinstance(theirs, relax.ShapeExpr):
            continue
        for mine, caller in zip(ours.values, theirs.values):
            if isinstance(mine, tvm.tirx.Var):
                if not isinstance(caller, tvm.tirx.Var):
                    return None  # the composite is more general than this call: leave it
                if mine in rename and not rename[mine].same_as(caller):
                    return None
                rename[mine] = caller
                defined.append(caller)
    if not shape_positions:
        return None
    for i in shape_positions:
        for dim in call.args[i].values:
            if tvm.tirx.analysis.undefined_vars(dim, defined):
                return None
    renamed = {m: c for m, c in rename.items() if not m.same_as(c)}
    bound = func.bind_symbolic_vars(renamed) if renamed else func
    bound = bound.bind_params({bound.params[i]: call.args[i] for i in shape_positions})
    # ... and back to variables of its own, as every composite has: _splice_calls (the cost
    # gate's inlining) maps a composite's variables to the caller's dims, which it cannot do
    # for variables that already are the caller's
    own = {v: tvm.tirx.Var(str(v.name), v.ty) for v in relax.analysis.defined_symbolic_vars(bound)}
    bound = bound.bind_symbolic_vars(own) if own else bound
    return bound, [a for i, a in enumerate(call.args) if i not in shape_positions]


def merge_composite(target: TargetSpec = DEFAULT_TARGET) -> tvm.transform.Pass:
    """Stage 1 (MergeComposite): group pattern-rule matches into composite functions."""
    names = _targets(target)

    @tvm.transform.module_pass(opt_level=0, name="MergeComposite")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        log = DecisionLog()  # the first stage starts the run's decisions afresh
        present = ops_in(mod)
        patterns = [fp for t in names for rule in pattern_rules(t) if required_ops(rule.pattern) <= present
                    for fp in rule.fusion_patterns(log, mod)]
        # (a, b)[0] → a, then dead bindings go: values read only through a tuple nobody else reads
        # (the unused indices of PyTorch's max-pools) would become outputs of regions, and dead
        # bindings regions nobody calls (which RunCodegen never compiles)
        mod = relax.transform.CanonicalizeBindings()(_drop_needless_broadcasts(mod))
        mod = relax.transform.DeadCodeElimination(entry_functions(mod))(mod)
        if patterns:
            mod = _fuse(mod, patterns)
        return log.attach(mod)

    return stage


def annotate_target(target: TargetSpec = DEFAULT_TARGET) -> tvm.transform.Pass:
    """Stage 2 (AnnotateTarget): op-attribute rules → one-op composites; mark composites' targets."""
    names = _targets(target)

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


HEAVY_OPS = frozenset({"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.matmul",
                       "relax.nn.conv2d_transpose", "relax.linear"})
"""Ops that make a region worth offloading (the cost gate's "compute-heavy" ops)."""

DEFAULT_MIN_REGION_OPS = 1
"""Default of the cost gate's minimum region size, in Relax ops (see README, "Cost gate")."""


def _gate_reason(ops: list[relax.Call], min_ops: int, require_heavy: bool) -> str | None:
    if len(ops) < min_ops:
        return f"region of {len(ops)} ops is below the cost gate (min_region_ops={min_ops})"
    if require_heavy and not any(c.op.name in HEAVY_OPS for c in ops):
        return "region has no compute-heavy op (conv, dense, matmul): cheaper left to llvm"
    return None


def _gated_composites(before: tvm.IRModule, merged: tvm.IRModule, min_ops: int,
                      require_heavy: bool, log: DecisionLog) -> set[tvm.ir.GlobalVar]:
    """Composite functions of ``before`` that form regions of ``merged`` failing the cost gate."""
    # a region holds copies of the composites it calls: find each one's original among those of
    # the same rule and constants digest (so not every composite is compared with every other)
    composites: dict[tuple[str, str], list[tvm.ir.GlobalVar]] = {}
    for gv, f in before.functions.items():
        if is_composite(f):
            composites.setdefault(_composite_key(f), []).append(gv)
    gated = set()
    for func in merged.functions.values():
        if not is_region(func):
            continue
        inner = region_composites(func)
        ops = [c for f in inner for c in op_calls(f)]
        reason = _gate_reason(ops, min_ops, require_heavy) or _symbol_reason(func, inner)
        if reason is None:
            continue
        for local in inner:
            name = str(local.attrs["Composite"])
            for gv in composites.get(_composite_key(local), []):
                comp = before[gv]
                if tvm_ffi.structural_equal(comp.body, local.body, map_free_vars=True):
                    gated.add(gv)
                    for call in op_calls(comp):
                        log.add(name, call, reason)
    return gated


def _symbol_reason(region: relax.Function, inner: list[relax.Function]) -> str | None:
    """Why the runtime could not bind the symbols of ``region`` from its arguments' shapes (a
    symbol seen only inside expressions such as ``s77 * s27`` that are not all the same), else None."""
    def shapes(values):
        return [s for s in (shape_of(v) for v in values) if s is not None]

    boundary = shapes([p for p in region.params if isinstance(p.ty, relax.TensorType)] + function_outputs(region))
    inside = shapes([b.var for f in inner for block in f.body.blocks for b in block.bindings])
    return opaque_dims(boundary, inside)[1]


def _composite_key(func: relax.Function) -> tuple[str, str]:
    return str(func.attrs["Composite"]), str(func.attrs.get(CONST_DIGEST_ATTR, ""))


def _inline_composites(mod: tvm.IRModule, gated: set[tvm.ir.GlobalVar]) -> tvm.IRModule:
    """Turn calls of the ``gated`` composite functions back into plain ops (for TVM to compile)."""
    plain = {gv: mod[gv].without_attr("Composite").without_attr("Primitive").without_attr(TARGET_ATTR)
             for gv in gated}
    inlined = {}
    for name in entry_functions(mod):
        func = _splice_calls(mod[name], plain)
        inlined[mod.get_global_var(name)] = func.inline_functions(plain)
    return updated(mod, inlined, remove=gated)


def _splice_calls(func: relax.Function, plain: Mapping[tvm.ir.GlobalVar, relax.Function]) -> relax.Function:
    """``func`` with each call of a ``plain`` function whose body has dim expressions of its own
    (a target shape bound in by :func:`_close_shape_arguments`) replaced by that body.

    ``Function.inline_functions`` copies a body with fresh symbolic variables and does not map
    them to the caller's dims, which only the types re-derived from the arguments hid: a
    ``reshape(x, R.shape([n * m, 16]))`` kept variables nothing in ``func`` defines, and
    ``relax.build`` failed ("has not been computed"). Here each call site gets a copy of the body
    with its symbols replaced by the caller's dims and its parameters by the arguments, spliced
    in before the call's binding. Only in dataflow blocks (a composite's body is one); other
    calls are left to ``inline_functions``.
    """
    if not isinstance(func.body, relax.SeqExpr):
        return func
    blocks, changed = [], False
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        bindings = []
        for b in block.bindings:
            call = b.value if isinstance(b, relax.VarBinding) else None
            callee = (plain.get(call.op) if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.GlobalVar)
                      else None)
            body = _spliced_body(callee, call) if callee is not None else None
            if body is None:
                bindings.append(b)
                continue
            for inner in body.blocks:
                bindings.extend(inner.bindings)
            bindings.append(relax.VarBinding(b.var, body.body))
            changed = True
        blocks.append(relax.DataflowBlock(bindings))
    if not changed:
        return func
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def _spliced_body(callee: relax.Function, call: relax.Call) -> relax.SeqExpr | None:
    """The body of ``callee`` for ``call`` (fresh variables, the caller's symbols, the arguments),
    or None when no op in it takes a symbolic shape (inline_functions then does)."""
    if not any(isinstance(a, relax.ShapeExpr) and any(not isinstance(d, tvm.tirx.IntImm) for d in a.values)
               for c in op_calls(callee) for a in c.args):
        return None
    copy = relax.utils.copy_with_new_vars(callee)
    symbols = _caller_symbols(copy, call)
    if len(symbols) != len(relax.analysis.defined_symbolic_vars(copy)):
        return None
    copy = copy.bind_symbolic_vars(symbols)
    body = copy.bind_params(dict(zip(copy.params, call.args))).body
    if not isinstance(body, relax.SeqExpr) or not all(isinstance(k, relax.DataflowBlock) for k in body.blocks):
        return None
    return body


def _caller_symbols(func: relax.Function, call: relax.Call) -> dict[tvm.tirx.Var, tvm.ir.PrimExpr]:
    """The caller's dim for each symbolic variable of ``func`` that a parameter's shape has as a
    bare dim (``x: [n, m, 16]`` called with ``[s77, s27, 16]``: ``n -> s77``, ``m -> s27``)."""
    symbols: dict[tvm.tirx.Var, tvm.ir.PrimExpr] = {}
    for param, arg in zip(func.params, call.args):
        ours = getattr(param.ty, "shape", None) if isinstance(param.ty, relax.TensorType) else None
        theirs = getattr(arg.ty, "shape", None) if isinstance(arg.ty, relax.TensorType) else None
        if isinstance(param.ty, relax.ShapeType):
            ours = param.ty.values
            theirs = arg.values if isinstance(arg, relax.ShapeExpr) else getattr(arg.ty, "values", None)
        else:
            ours = ours.values if isinstance(ours, relax.ShapeExpr) else None
            theirs = theirs.values if isinstance(theirs, relax.ShapeExpr) else None
        if ours is None or theirs is None:
            continue
        for mine, caller in zip(ours, theirs):
            if isinstance(mine, tvm.tirx.Var) and not mine.same_as(caller):
                symbols.setdefault(mine, caller)
    return symbols


def _map_calls(func: relax.Function, change) -> relax.Function:
    """``func`` with the value of each binding ``v = call`` replaced by ``change(v, call)`` where
    that is not None (an expression the binding's variable can hold); the bindings keep their
    variables, so nothing else in the function changes. ``func`` itself when nothing did."""
    if not isinstance(func.body, relax.SeqExpr):
        return func
    blocks, changed = [], False
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call):
                new = change(b.var, b.value)
                if new is not None:
                    b = relax.VarBinding(b.var, new)
                    changed = True
            bindings.append(b)
        blocks.append((relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock)(bindings))
    if not changed:
        return func
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def _map_call_args(func: relax.Function, change) -> relax.Function:
    """``func`` with each argument ``a`` of each bound call (and each field of a tuple argument)
    replaced by ``change(a)`` where that is not None; the calls keep their types (:func:`_map_calls`)."""
    def arg(a):
        new = change(a)
        if new is not None:
            return new
        if isinstance(a, relax.Tuple):
            fields = [arg(f) for f in a.fields]
            if any(not n.same_as(f) for n, f in zip(fields, a.fields)):
                return relax.Tuple(fields)
        return a

    def call(_var, value):
        args = [arg(a) for a in value.args]
        if all(n.same_as(a) for n, a in zip(args, value.args)):
            return None
        return relax.Call(value.op, args, value.attrs, value.ty_args, ret_ty=value.ty)

    return _map_calls(func, call)


def _merge_main(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's MergeCompositeFunctions on ``mod["main"]``, around a defect of TVM 0.27's pass.

    The pass gives every argument of every call a group; it pre-assigns groups to constants, shapes
    and PrimExprs *except variables*, so a symbolic TIR variable passed bare to an op fails with
    "Could not find memo-ized group for expression of type ir.Var" (torch.export's BERT:
    ``R.arange(0, s27, 1)``, ``R.strided_slice(..., (s27,), ...)``; in this TVM, Relax and TIR
    share one Var class). Such an argument is given to the pass as ``s27 + 0`` (an expression,
    so it gets its group; the call's type is kept) and put back afterwards: the result is
    what the pass would give if it grouped it.
    """
    wrapped: list[tuple[tvm.ir.PrimExpr, tvm.tirx.Var]] = []

    def wrap(a):
        if isinstance(a, tvm.tirx.Var) and isinstance(a.ty, tvm.ir.PrimType):
            e = tvm.tirx.Add(a, tvm.tirx.IntImm(str(a.ty.dtype), 0))
            wrapped.append((e, a))
            return e
        return None

    def unwrap(a):
        return next((v for e, v in wrapped if a.same_as(e)), None)

    main = mod.get_global_var("main")
    fixed = _map_call_args(mod[main], wrap)
    if not wrapped:
        return relax.transform.MergeCompositeFunctions()(mod)
    merged = relax.transform.MergeCompositeFunctions()(updated(mod, {main: fixed}))
    main = merged.get_global_var("main")
    return updated(merged, {main: _map_call_args(merged[main], unwrap)})


def merge_composite_functions(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's MergeCompositeFunctions, applied to every entry function of ``mod`` on its own.

    TVM's pass groups the composite calls of ``main`` only (but rewrites every function), so a
    second function with composites failed with "Variable ... could not be found in any group".
    Each entry function is therefore merged in a module of its own where it is ``main``, next to the
    module's other (non-entry) functions; its regions are prefixed with its name, so two functions
    never make regions of one name, and the results are put back together.
    """
    entries = entry_functions(mod)
    if entries == ["main"] or not entries:
        return _merge_main(mod)
    shared = {gv: f for gv, f in mod.functions_items() if gv.name_hint not in entries}
    results: dict[str, tuple[tvm.ir.GlobalVar, relax.BaseFunc]] = {}
    for name in entries:
        func = mod[name]
        private = func.attrs is None or "global_symbol" not in func.attrs
        sub = tvm.IRModule({**shared, tvm.ir.GlobalVar("main"): func.with_attr("global_symbol", name)})
        sub = _merge_main(sub)
        if name != "main":
            sub = updated(sub, {gv: f.with_attr("global_symbol", f"{name}_{gv.name_hint}")
                                for gv, f in sub.functions_items() if is_region(f)})
        # renames each GlobalVar after its global_symbol: main → name, regions → prefixed
        sub = relax.transform.NormalizeGlobalVar()(sub)
        for gv, f in sub.functions_items():
            if gv.name_hint == name and private:
                f = f.without_attr("global_symbol")
            results.setdefault(gv.name_hint, (gv, f))  # call sites hold these GlobalVars
    merged = mod.clone()
    for gv in list(merged.get_global_vars()):
        del merged[gv]
    for gv, func in results.values():
        merged[gv] = func
    # composites absorbed into regions of one function are still in the others' modules
    return relax.transform.DeadCodeElimination(entries)(merged)


MAX_REGION_NAME = 256
"""Longest region (external symbol) name kept as MergeCompositeFunctions made it, in characters."""


def _shorten_region_names(mod: tvm.IRModule) -> tvm.IRModule:
    """Give regions whose name is longer than ``MAX_REGION_NAME`` a shorter one.

    MergeCompositeFunctions names a region after all its composites (``fused_<c1>_<c2>_..._<target>``),
    so a region of n composites has a name O(n) long. RunCodegen names each constant of the region
    ``<symbol>_<target>_const_<i>``, which made the constant names, the region graph's JSON and the
    runtime's constant table O(n^2) in size. A long name keeps its first part and gets a checksum of
    the full name: ``fused_<c1>_<c2>_..._<crc32>_<target>``; short names are left as they are.
    """
    taken = {gv.name_hint for gv in mod.get_global_vars()}
    renamed = {}
    for gv, func in mod.functions.items():
        name = gv.name_hint
        if len(name) <= MAX_REGION_NAME or not is_region(func):
            continue
        tail = f"_{zlib.crc32(name.encode()):08x}_{func.attrs['Codegen']}"
        head = name[:MAX_REGION_NAME - len(tail) - 4]
        head = head[:head.rindex("_")] if "_" in head else head
        new, k = head + tail, 0
        while new in taken:
            k += 1
            new = f"{head}{k}{tail}"
        taken.add(new)
        renamed[gv] = func.with_attr("global_symbol", new)
    if not renamed:
        return mod
    return relax.transform.NormalizeGlobalVar()(updated(mod, renamed))


def _unmergeable(mod: tvm.IRModule, log: DecisionLog, err: Exception) -> tvm.IRModule:
    """``mod`` with every composite back to plain ops, the reason recorded for each of its ops.

    TVM 0.27's MergeCompositeFunctions fails with "Could not find memo-ized group for expression
    of type ir.Var" on some modules with symbolic shapes (seen: a transformers BertModel exported
    by torch.export with a dynamic batch and sequence length, where composites take shape
    arguments such as ``R.shape([s27, s77])``; taking back only those composites does not avoid
    it: the pass fails even with no composite left, so the ``ir.Var`` it cannot place is a
    symbolic TIR var in a PrimValue argument, as of ``R.arange(0, s27)``, which this TVM's Relax and
    TIR share one Var class with). Rather than a crash, the functions stay on llvm, each op with
    this reason (bh.report shows it).
    """
    gated = {gv for gv, f in mod.functions_items() if is_composite(f)}
    names = ", ".join(entry_functions(mod))
    # the check that fails ("memo_.count(vn)") does not say which value: name the variables a
    # function reads that none of its bindings or parameters defines, the usual cause
    stray = [f"{name} reads {', '.join(sorted({str(v.name) for v in free}))}, which nothing in it defines"
             for name in entry_functions(mod) for free in [relax.analysis.free_vars(mod[name])] if free]
    what = first_line(err) + ("; " + "; ".join(stray) if stray else "")
    if not gated:
        raise CodegenError(f"TVM's MergeCompositeFunctions failed on {names}: {what}") from err
    reason = (f"TVM's MergeCompositeFunctions cannot group the composites of {names} "
              f"({what}); the function stays on llvm")
    for gv in gated:
        for call in op_calls(mod[gv]):
            log.add(str(mod[gv].attrs["Composite"]), call, reason)
    return _inline_composites(mod, gated)


def merge_compiler_regions(min_region_ops: int = DEFAULT_MIN_REGION_OPS,
                           require_heavy_op: bool = True) -> tvm.transform.Pass:
    """Stage 3 (MergeCompilerRegions, with PartitionGraph's outlining): MergeCompositeFunctions.

    Then the cost gate (as Torch-TensorRT's ``min_block_size``): a region with fewer than
    ``min_region_ops`` Relax ops, or (``require_heavy_op``) without a conv/dense/matmul, goes back
    to TVM; the reason is recorded for every op of it.
    """

    @tvm.transform.module_pass(opt_level=0, name="MergeCompilerRegions")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        log = DecisionLog.from_module(mod)
        while True:
            if not any(is_composite(f) for f in mod.functions.values()):
                return log.attach(mod)  # nothing to merge (MergeCompositeFunctions may fail on it)
            try:
                merged = merge_composite_functions(mod)
            except tvm.error.InternalError as err:
                if "memo" not in str(err):  # "memo-ized group", "memo_.count(...)"
                    raise
                mod = _unmergeable(mod, log, err)
                continue
            gated = _gated_composites(mod, merged, min_region_ops, require_heavy_op, log)
            if not gated:
                return log.attach(_shorten_region_names(_close_shape_arguments(merged, regions=True)))
            mod = _inline_composites(mod, gated)

    return stage


def partition_graph(options: Mapping[str, Mapping] | None = None) -> tvm.transform.Pass:
    """Stage 4 (PartitionGraph, with the codegen): RunCodegen, then drop the region functions."""

    @tvm.transform.module_pass(opt_level=0, name="PartitionGraph")
    def stage(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        log = DecisionLog.from_module(mod)
        # declared dim ranges: written into the regions' documents by the codegen, and checked at
        # the start of each function, so that the built module enforces them however it is run
        codegen_options = {target: dict(opts) for target, opts in (options or {}).items()}
        ranges = range_codegen_options(mod, entry_functions(mod))
        if ranges:
            codegen_options.setdefault(DEFAULT_TARGET, {}).update(ranges)
        mod = relax.transform.RunCodegen(codegen_options, entry_functions(mod))(mod)
        mod = relax.transform.DeadCodeElimination(entry_functions(mod))(mod)
        return log.attach(insert_range_checks(mod, entry_functions(mod)))

    return stage


def stages(target: TargetSpec = DEFAULT_TARGET, min_region_ops: int = DEFAULT_MIN_REGION_OPS,
           require_heavy_op: bool = True, precision: str = DEFAULT_PRECISION) -> list[tvm.transform.Pass]:
    """The four partition stages for ``target`` (a name, or names in priority order).

    ``min_region_ops`` and ``require_heavy_op`` set the cost gate of MergeCompilerRegions.
    ``precision="bf16"`` makes the oneDNN regions compute conv2d / dense / matmul in bf16 (f32
    accumulation; inputs and outputs stay float32); where the CPU has no native bf16 it warns
    once and the regions run float32 (``bh.report`` says so per region).

    Each item is a ``tvm.transform.Pass``; ``stage.info.name`` is its classic name. Apply them in
    order (after :func:`bind_params` when weights should become constants)::

        m = bh.bind_params(mod, params)
        for stage in bh.stages():
            m = stage(m)
            print(stage.info.name, bh.op_profile(m))
    """
    names = _targets(target)
    options = {}
    if check_precision(precision) != DEFAULT_PRECISION:
        warn_if_fallback(precision)
        options = {DEFAULT_TARGET: {"precision": precision}}  # only the oneDNN codegen reads it
    return [merge_composite(names), annotate_target(names),
            merge_compiler_regions(min_region_ops, require_heavy_op), partition_graph(options)]


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
        # np.ascontiguousarray would make a 0-d array 1-d (a scalar index of shape (1,))
        bound[name] = tvm.runtime.tensor(np.require(arr, requirements="C"))
    return relax.transform.BindParams(func, bound)(mod)


def partition(
    mod: tvm.IRModule,
    params: Mapping[str, np.ndarray] | None = None,
    target: TargetSpec = DEFAULT_TARGET,
    min_region_ops: int = DEFAULT_MIN_REGION_OPS,
    require_heavy_op: bool = True,
    precision: str = DEFAULT_PRECISION,
) -> tvm.IRModule:
    """Bind ``params`` (if given) and run all four stages: the module ``relax.build`` takes.

    ``precision``: ``"f32"`` (default) or ``"bf16"`` (see :func:`stages`).
    """
    mod = bind_params(mod, params)
    # index / mask bookkeeping on constants and static shapes (int64, bool) becomes constants: it has
    # no runtime kernel and, reading a region's output shape, split ViT in two (byoc_hetero/fold.py)
    mod = fold_int_constants(mod)
    mod = drop_zero_pads(fold_weight_subgraphs(mod))  # byoc_hetero/passes/: one pass per module
    for stage in stages(target, min_region_ops, require_heavy_op, precision):
        mod = stage(mod)
    return mod
