"""``place``: decide the device of every call, parameter and constant of a Relax module.

Placement has two halves. This module *decides*: it walks each entry function's bindings in order,
asks the rules (:mod:`.rules`) for the device of each call, gives the fallback device to calls no
rule names, gives each parameter the device of its first consumer, and lets constants follow their
consumers. :mod:`.copies` then *materializes* the decision: typed values on virtual devices and one
``R.to_vdevice`` copy per (value, destination device).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping, Sequence

import tvm
from tvm import relax

from .. import _relax
from ..errors import PlacementError, PlacementWarning
from . import _ir
from .copies import rewrite_function
from .decision import CONST, DevTree, FunctionPlan, Pending, devices_in, fill
from .devices import Device, DeviceLike, device_of_vdevice, make_vdevice, module_vdevices, parse_device
from .regions import RegionInfo, region_of, region_table
from .rules import PlacementMap, PlacementPolicy, PlacementRules, Site


class _Analysis:
    """Decide devices for one function (no IR is changed here)."""

    def __init__(self, mod: tvm.IRModule, name: str, rules: PlacementRules, fallback: Device,
                 regions: dict[str, RegionInfo], declared: list[Device] | None):
        self.mod, self.name, self.rules, self.fallback = mod, name, rules, fallback
        self.declared = declared  # None: not known before the rules (a policy) have answered
        self.regions = regions
        self.func: relax.Function = mod[name]
        self.var2val = relax.analysis.get_var2val(self.func)
        self.param_dev: dict[int, Device] = {}
        self.param_index = {_ir.key(p): i for i, p in enumerate(self.func.params)}
        self.plan = FunctionPlan(name, [])
        self.counts: Counter = Counter()

    # -- device trees -------------------------------------------------------------------------
    def tree_of(self, expr) -> DevTree:
        if isinstance(expr, relax.Var):
            k = _ir.key(expr)
            if k in self.param_index:
                dev = self.param_dev.get(k)
                if dev is not None:
                    return dev if not isinstance(expr.ty, relax.TupleType) else fill(expr.ty, dev)
                return Pending(k) if _ir.has_tensor(expr.ty) else None
            if k in self.plan.const_vars:
                return CONST
            return self.resolve(self.plan.bindings.get(k))
        if isinstance(expr, relax.Tuple):
            return tuple(self.tree_of(f) for f in expr.fields)
        if isinstance(expr, tvm.ir.Constant) and isinstance(expr.ty, relax.TensorType):
            return CONST
        return None

    def resolve(self, tree: DevTree) -> DevTree:
        if isinstance(tree, Pending):
            return self.param_dev.get(tree.param, tree)
        if isinstance(tree, tuple):
            return tuple(self.resolve(t) for t in tree)
        return tree

    def consume(self, expr, device: Device) -> None:
        """``expr`` is an operand of a call on ``device``: undecided parameters in it go there."""
        self._settle(self.tree_of(expr), device)

    def _settle(self, tree: DevTree, device: Device) -> None:
        if isinstance(tree, Pending):
            self.param_dev.setdefault(tree.param, device)
        elif isinstance(tree, tuple):
            for t in tree:
                self._settle(t, device)

    def first_device(self, exprs, cpu_only: bool, gpu_only: bool = False) -> Device | None:
        """The device of the first operand that already has one (a CPU device when ``cpu_only``, a
        GPU device when ``gpu_only``)."""
        for e in exprs:
            for device in devices_in(self.tree_of(e)):
                if not (cpu_only and device.is_gpu) and not (gpu_only and not device.is_gpu):
                    return device
        return None

    def region_device(self, site: Site) -> Device:
        """A region no rule places stays with its inputs; a CPU runtime's region stays on a CPU, a
        GPU runtime's (the cuda_vendor backend's) goes to a GPU."""
        info = self.regions.get(site.op_name)
        cpu_only = info is not None and info.cpu_only
        gpu_only = info is not None and info.gpu_only
        device = self.first_device(site.call.args, cpu_only, gpu_only)
        if device is None:
            device = self.fallback
            if (cpu_only and device.is_gpu) or (gpu_only and not device.is_gpu):
                known = self.declared or [self.fallback, *self.rules.devices()]
                device = next((d for d in known if d.is_gpu == gpu_only), device)
        return device

    # -- the walk -----------------------------------------------------------------------------
    def run(self) -> FunctionPlan:
        for _block, binding in _ir.bindings(self.func):
            var, value = binding.var, binding.value
            k = _ir.key(var)
            if isinstance(binding, relax.MatchCast):
                self.plan.bindings[k] = self.tree_of(value)
                continue
            if isinstance(value, relax.Call):
                self.plan.bindings[k] = self.call(var, value)
            elif isinstance(value, tvm.ir.Constant) and isinstance(value.ty, relax.TensorType):
                self.plan.const_vars[k] = value
            elif isinstance(value, relax.Tuple | relax.Var):
                self.plan.bindings[k] = self.tree_of(value)
            elif isinstance(value, relax.TupleGetItem):
                tree = self.tree_of(value.tuple_value)
                self.plan.bindings[k] = tree[value.index] if isinstance(tree, tuple) else tree
            elif isinstance(value, relax.If | relax.SeqExpr | relax.Function):
                raise PlacementError(
                    f"{self.name}: binding {var.name!r} is a {type(value).__name__}; place() handles "
                    "straight-line functions (no control flow or local functions)"
                )
            else:
                self.plan.bindings[k] = None
        # parameters no call consumed stay on the fallback device
        params = []
        for p in self.func.params:
            pk = _ir.key(p)
            if _ir.has_tensor(p.ty):
                self.param_dev.setdefault(pk, self.fallback)
                params.append(self.param_dev[pk])
            else:
                params.append(None)
        self.plan.params = params
        self.plan.bindings = {k: self.resolve(t) for k, t in self.plan.bindings.items()}
        return self.plan

    def call(self, var: relax.Var, call: relax.Call) -> DevTree:
        op = _relax.op_name(call)
        if op in (_ir.COPY_OP, _ir.HINT_OP):
            device = self.copy_destination(call)
            self.consume(call.args[0], device)
            return fill(var.ty, device)
        if isinstance(call.op, relax.GlobalVar):
            callee = self.mod[call.op]
            kind = "a composite or offloaded region" if _relax.is_composite_or_region(callee) else "a Relax function"
            raise PlacementError(
                f"{self.name}: {var.name!r} calls {call.op.name_hint}, {kind}; place() works on a module "
                "before partitioning or after all four stages (bh.partition), not between them"
            )
        site = self.site(var, call)
        device = self.rules.lookup(site, self.var2val)
        if device is None:
            device = self.region_device(site) if site.region is not None else self.fallback
        for arg in call.args:
            self.consume(arg, device)
        self.plan.sites[_ir.key(var)] = site
        return fill(var.ty, device)

    def copy_destination(self, call: relax.Call) -> Device:
        attrs = call.attrs
        if _relax.op_name(call) == _ir.COPY_OP:
            return device_of_vdevice(attrs.dst_vdevice)
        kind = {1: "cpu", 2: "cuda"}.get(int(attrs.device_type))
        if kind is None:
            raise PlacementError(f"{self.name}: hint_on_device to device type {attrs.device_type} (CPU and CUDA only)")
        return Device(kind, int(attrs.index))

    def site(self, var: relax.Var, call: relax.Call) -> Site:
        name = _ir.site_name(call)
        index = self.counts[name]
        self.counts[name] += 1
        region = None
        if _relax.op_name(call) in _ir.CALL_OPS and isinstance(call.args[0], relax.ExternFunc):
            region = region_of(self.mod, name, self.regions)
        if region is None:
            return Site(call, name, index, var.name, self.name)
        return Site(call, name, index, var.name, self.name, region=region.codegen,
                    contained_ops=tuple(region.ops), aliases=(region.codegen, *region.composites))


def _given_devices(mod: tvm.IRModule, devices: Sequence[DeviceLike] | None) -> list[Device] | None:
    """The devices declared by ``devices=`` or by the module itself (VM order); None when neither does."""
    existing = module_vdevices(mod)
    if devices is not None:
        declared = [parse_device(d) for d in devices]
        dups = [d for d, n in Counter(declared).items() if n > 1]
        if dups:
            raise PlacementError(f"devices: {', '.join(map(str, dups))} declared twice")
        if existing and [device_of_vdevice(v) for v in existing] != declared:
            have = ", ".join(str(device_of_vdevice(v)) for v in existing)
            raise PlacementError(f"the module already declares devices [{have}]; devices= must match them")
        return declared
    return [device_of_vdevice(v) for v in existing] if existing else None


def _declared(given: list[Device] | None, rules: PlacementRules, fallback: Device) -> list[Device]:
    """The declared devices in VM order: ``given``, else the fallback and the devices the rules chose;
    an error when the fallback or a device a rule chose is not among them."""
    declared = given if given is not None else [fallback] + [d for d in rules.devices() if d != fallback]
    names = ", ".join(map(str, declared))
    if fallback not in declared:
        raise PlacementError(f"fallback device {fallback} is not declared (declared: {names})")
    for what, device in rules.named_by():
        if device not in declared:
            raise PlacementError(f"{what} → {device}: device not declared (declared: {names})")
    return declared


def place(
    mod: tvm.IRModule,
    rules: PlacementMap | PlacementPolicy | None = None,
    fallback: DeviceLike = "cpu",
    *,
    devices: Sequence[DeviceLike] | None = None,
    targets: Mapping[str, tvm.target.Target | str] | None = None,
    functions: Sequence[str] | None = None,
) -> tvm.IRModule:
    """Place every call of ``mod`` on a device; returns a new module (``mod`` is unchanged).

    Parameters
    ----------
    mod:
        A Relax module: as written or imported, after :func:`byoc_hetero.bind_params`, or after
        :func:`byoc_hetero.partition` (offloaded regions are placed as single calls).
    rules:
        A placement map ``{rule: device}`` (or a list of pairs), tried in order (see
        :mod:`byoc_hetero.placement.rules` for op names, patterns and callables as rules), or a
        placement policy: one function ``policy(site) -> device or None`` called for every call
        (a :class:`~byoc_hetero.placement.Site`), None meaning "no decision"::

            place(mod, lambda s: "cpu:1" if s.op_name == "relax.nn.conv2d" else None, fallback="cpu:0")

        Anything else raises :class:`PlacementError` saying what a map may be.
    fallback:
        The device of every call no rule places (or the policy leaves to None). It is VM device 0
        unless ``devices`` says otherwise, and holds the constants the VM loads.
    devices:
        The declared devices in VM order. Default: the module's own ``vdevice`` list if it has one,
        else the fallback followed by the devices the rules name (or the policy returned, in the
        order it first returned them). A device not declared is an error.
    targets:
        Target per device kind (``{"cuda": tvm.target.Target(...)}``); default llvm for ``cpu``
        and, for ``cuda``, the present GPU's target or ``sm_75``.
    functions:
        The functions to place (default: every Relax function that is not a composite or region).

    Returns
    -------
    An ordinary Relax module: ``global_infos["vdevice"]`` lists the devices; every parameter,
    binding and constant has a ``vdevice``; each value used on another device is copied there once
    (``R.to_vdevice``). Constants used off device 0 become trailing parameters of their function,
    filled once at load by a generated ``<function>__device_constants`` function
    (:func:`byoc_hetero.placement.vm` does that).

    Raises
    ------
    PlacementError
        an unknown or undeclared device, a bad rule, an offloaded CPU region placed on a GPU, or a
        construct placement does not handle. A rule that matches nothing only warns
        (:class:`PlacementWarning`).
    """
    parsed = PlacementRules(rules)
    fb = parse_device(fallback)
    given = _given_devices(mod, devices)
    if given is not None:
        _declared(given, parsed, fb)  # a map naming an undeclared device fails before any work
    names = list(functions) if functions is not None else _relax.entry_functions(mod, (_ir.ATTR_CONSTANTS_FOR,))
    regions = region_table(mod)
    plans = [_plan_function(mod, name, parsed, fb, regions, given) for name in names]
    # the devices are known now (a policy names them as it answers): declare them, then rewrite
    out = _rewrite_module(mod, plans, _declared(given, parsed, fb), targets)
    _warn_unused(parsed, regions, names)
    return out


def _plan_function(mod: tvm.IRModule, name: str, parsed: PlacementRules, fb, regions: dict[str, RegionInfo],
                   given) -> FunctionPlan:
    """Where each call of function ``name`` runs (PlacementError for a missing or non-Relax function)."""
    if name not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise PlacementError(f"module has no function {name!r} to place")
    if not isinstance(mod[name], relax.Function):
        raise PlacementError(f"{name} is not a Relax function")
    plan = _Analysis(mod, name, parsed, fb, regions, given).run()
    _check_regions(plan, regions)
    return plan


def _rewrite_module(mod: tvm.IRModule, plans: list[FunctionPlan], declared: list,
                    targets: Mapping[str, tvm.target.Target | str] | None) -> tvm.IRModule:
    """``mod`` with the declared devices as its ``vdevice`` list and each planned function rewritten."""
    vdevices = module_vdevices(mod) or [make_vdevice(d, targets) for d in declared]
    vd_of = dict(zip(declared, vdevices))
    infos = dict(mod.global_infos) if mod.global_infos is not None else {}
    infos["vdevice"] = vdevices
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=infos)
    for plan in plans:
        new_func, loader = rewrite_function(mod[plan.name], plan, vd_of, declared[0])
        out[plan.name] = new_func
        if loader is not None:
            out[loader[0]] = loader[1]
    return out


def _warn_unused(parsed: PlacementRules, regions: dict[str, RegionInfo], names: list[str]) -> None:
    """A PlacementWarning for each rule that matched no call (with a hint for an op inside regions)."""
    inside = {op for info in regions.values() for op in info.ops}
    for rule in parsed.unused():
        hint = ""
        if rule.name is not None and rule.name in inside:
            hint = (f"; {rule.name} is inside offloaded regions, which are placed as a whole: name the "
                    "region (its codegen or composite name) or use a callable on Site.contained_ops")
        warnings.warn(
            PlacementWarning(f"placement rule {rule.label} → {rule.device} matched no call in "
                             f"{', '.join(names) or 'the module'}{hint}"),
            stacklevel=3,
        )


def _check_regions(plan: FunctionPlan, regions: dict[str, RegionInfo]) -> None:
    for k, site in plan.sites.items():
        if site.region is None:
            continue
        info = regions.get(site.op_name)
        dev = plan.bindings.get(k)
        leaf = next(devices_in(dev), None)
        if info is not None and info.cpu_only and leaf is not None and leaf.is_gpu:
            raise PlacementError(
                f"{plan.name}: offloaded region {site.op_name} ({site.region}, a CPU runtime) bound to "
                f"{site.name!r} would run on {leaf}; place it (or the ops in it) on a CPU device"
            )
        if info is not None and info.gpu_only and leaf is not None and not leaf.is_gpu:
            raise PlacementError(
                f"{plan.name}: offloaded region {site.op_name} ({site.region}, a GPU runtime) bound to "
                f"{site.name!r} would run on {leaf}; place it on a GPU device ('cuda'), or partition "
                "for a CPU backend"
            )
