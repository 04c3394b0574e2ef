"""Materialize a placement: typed values on virtual devices and one copy per (value, device).

Given the decision of :mod:`.place` for a function, rebuild it binding by binding:

* each parameter's type carries its device;
* each call's operands are brought to the call's device — a value produced elsewhere is copied
  with ``R.to_vdevice`` the first time a call on that device needs it, and that copy is reused by
  every later use on the same device (exactly one copy per value and destination);
* each call's result type carries the call's device (forced where TVM's type inference drops it,
  e.g. ``R.zeros``, or ``call_tir``/``call_dps_packed`` output types);
* constants used on VM device 0 are typed on it (the VM loads constants there); constants used on
  another device become trailing parameters of the function; a generated
  ``<function>__device_constants`` function returns them (loaded on device 0) and the VM wrapper
  copies each to its device once, at load (never a copy per call).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from .._relax import op_name
from . import _ir
from .decision import FunctionPlan, devices_in
from .devices import Device, device_of_vdevice

LOADER_SUFFIX = "__device_constants"


def make_constant(value: tvm.ir.Constant, vdevice: relax.VDevice) -> tvm.ir.Constant:
    """The same constant data, typed on ``vdevice``."""
    return relax._ffi_api.MakeTensorConst(value.value, _ir.with_vdevice(value.ty, vdevice), None)


class _Builder:
    def __init__(self, func: relax.Function, plan: FunctionPlan, vd_of: dict[Device, relax.VDevice],
                 home: Device):
        self.func, self.plan, self.vd_of, self.home = func, plan, vd_of, home
        self.bb = relax.BlockBuilder()
        self.remap: dict[int, relax.Expr] = {}
        self.copies: dict[tuple[int, Device], relax.Var] = {}
        self.block_copies: list[tuple[int, Device]] = []  # copies bound to dataflow vars of this block
        self.in_dataflow = False
        self.consts: dict[tuple[int, Device], relax.Expr] = {}
        self.lifted: list[tuple[relax.Var, tvm.ir.Constant, Device]] = []

    # -- devices of new values -----------------------------------------------------------------
    def vdevice(self, device: Device) -> relax.VDevice:
        return self.vd_of[device]

    @staticmethod
    def device_tree(ty):
        """Per-leaf devices of a (new, fully placed) value's type."""
        if isinstance(ty, relax.TupleType):
            return tuple(_Builder.device_tree(f) for f in ty.fields)
        if isinstance(ty, relax.TensorType) and ty.vdevice is not None:
            return device_of_vdevice(ty.vdevice)
        return None

    # -- operands --------------------------------------------------------------------------------
    def subst(self, expr):
        """``expr`` with old variables replaced by their new values (no device change)."""
        if isinstance(expr, relax.Var):
            return self.remap.get(_ir.key(expr), expr)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.subst(f) for f in expr.fields])
        if isinstance(expr, relax.TupleGetItem):
            return relax.TupleGetItem(self.subst(expr.tuple_value), expr.index)
        return expr

    def on(self, expr, device: Device):
        """``expr`` as an operand of a call on ``device``: copied there if it lives elsewhere."""
        if isinstance(expr, relax.Var):
            k = _ir.key(expr)
            if k in self.plan.const_vars:
                return self.constant(self.plan.const_vars[k], device)
            return self.copy(self.remap.get(k, expr), device)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.on(f, device) for f in expr.fields])
        if isinstance(expr, tvm.ir.Constant) and isinstance(expr.ty, relax.TensorType):
            return self.constant(expr, device)
        return self.subst(expr)

    def copy(self, value, device: Device):
        """``value`` (a new variable) on ``device``: itself, or its one copy there."""
        if not isinstance(value, relax.Var) or not _ir.has_tensor(value.ty):
            return value
        tree = self.device_tree(value.ty)
        if all(d == device for d in devices_in(tree)):
            return value
        ck = (_ir.key(value), device)
        if ck in self.copies:
            return self.copies[ck]
        suffix = f"_{device.kind}{device.index}"
        if isinstance(value.ty, relax.TensorType):
            new = self.bb.emit(relax.op.to_vdevice(value, self.vdevice(device)), name_hint=value.name + suffix)
        else:  # a tuple: copy the fields that live elsewhere, rebuild the tuple
            fields = []
            for i, _field in enumerate(value.ty.fields):
                item = self.bb.emit(relax.TupleGetItem(value, i), name_hint=f"{value.name}_{i}")
                fields.append(self.copy(item, device))
            new = self.bb.emit(relax.Tuple(fields), name_hint=value.name + suffix)
        self.copies[ck] = new
        if self.in_dataflow:
            self.block_copies.append(ck)
        return new

    def constant(self, value: tvm.ir.Constant, device: Device):
        """A constant on ``device``: typed there when that is VM device 0 (where the VM loads
        constants), else a lifted parameter filled once at load."""
        ck = (_ir.key(value), device)
        if ck not in self.consts:
            if device == self.home:
                self.consts[ck] = make_constant(value, self.vdevice(device))
            else:
                param = relax.Var(f"const{len(self.lifted)}_{device.kind}{device.index}",
                                  _ir.with_vdevice(value.ty, self.vdevice(device)))
                self.lifted.append((param, value, device))
                self.consts[ck] = param
        return self.consts[ck]

    # -- bindings ----------------------------------------------------------------------------------
    def emit(self, var: relax.Var, value) -> relax.Var:
        name = var.name
        if self.in_dataflow and not isinstance(var, relax.DataflowVar):
            return self.bb.emit_output(value, name_hint=name)
        return self.bb.emit(value, name_hint=name)

    def binding(self, binding) -> None:
        var, value = binding.var, binding.value
        k = _ir.key(var)
        if isinstance(binding, relax.MatchCast):
            tree = self.plan.bindings.get(k)
            ty = _ir.with_vdevice_tree(binding.ty, tree, self.vdevice_or_none)
            new = self.bb.match_cast(self.subst(value), ty, name_hint=var.name)
            if self.in_dataflow and not isinstance(var, relax.DataflowVar):
                new = self.bb.emit_output(new, name_hint=var.name)
            self.remap[k] = new
            return
        if k in self.plan.const_vars:
            return  # each consumer gets the constant on its own device
        if isinstance(value, relax.Call):
            self.remap[k] = self.call(var, value)
            return
        self.remap[k] = self.emit(var, self.subst(value))

    def vdevice_or_none(self, device):
        return self.vd_of[device] if isinstance(device, Device) else None

    def call(self, var: relax.Var, call: relax.Call):
        tree = self.plan.bindings[_ir.key(var)]
        op = op_name(call)
        if op in (_ir.COPY_OP, _ir.HINT_OP):
            moved = self.on(call.args[0], tree if isinstance(tree, Device) else self.home)
            if self.in_dataflow and not isinstance(var, relax.DataflowVar) and isinstance(moved, relax.DataflowVar):
                return self.bb.emit_output(moved, name_hint=var.name)
            return moved
        device = next(devices_in(tree), self.home)
        vdev = self.vdevice(device)
        args = [self.on(a, device) for a in call.args]
        ty_args = [_ir.with_vdevice(t, vdev) for t in call.ty_args] if op in _ir.CALL_OPS else list(call.ty_args)
        new_call = self.bb.normalize(relax.Call(call.op, args, call.attrs, ty_args))
        want = _ir.with_vdevice(new_call.ty, vdev)
        if not tvm_ffi.structural_equal(want, new_call.ty):
            # TVM's type inference dropped (or never had) the device: state it on the call
            forced = relax.Call(new_call.op, new_call.args, new_call.attrs, new_call.ty_args)
            relax.expr._update_type(forced, want)
            new_call = forced
        return self.emit(var, new_call)

    # -- the function --------------------------------------------------------------------------------
    def build(self, name: str) -> relax.Function:
        func, plan = self.func, self.plan
        params = []
        for p, tree in zip(func.params, plan.params):
            ty = _ir.with_vdevice_tree(p.ty, tree, self.vdevice_or_none)
            new = relax.Var(p.name, ty)
            self.remap[_ir.key(p)] = new
            params.append(new)
        attrs = dict(func.attrs) if func.attrs is not None else {}
        private = "global_symbol" not in attrs
        attrs.pop("global_symbol", None)
        body = func.body
        with self.bb.function(name, attrs=attrs or None, pure=bool(getattr(func, "is_pure", True)),
                              private=private):
            for block in body.blocks:
                if isinstance(block, relax.DataflowBlock):
                    self.in_dataflow = True
                    with self.bb.dataflow():
                        for binding in block.bindings:
                            self.binding(binding)
                        # dataflow values are not visible after their block: forget its copies
                        for ck in self.block_copies:
                            self.copies.pop(ck, None)
                        self.block_copies = []
                    self.in_dataflow = False
                else:
                    for binding in block.bindings:
                        self.binding(binding)
            out = self.subst(body.body)
            if isinstance(out, tvm.ir.Constant) and isinstance(out.ty, relax.TensorType):
                out = self.constant(out, self.home)
            self.bb.emit_func_output(out, params=params + [p for p, _, _ in self.lifted])
        return self.bb.get()[name]


def rewrite_function(func: relax.Function, plan: FunctionPlan,
                     vd_of: dict[Device, relax.VDevice], home: Device):
    """The placed function and, when constants were lifted, ``(loader name, loader function)``."""
    name = plan.name
    builder = _Builder(func, plan, vd_of, home)
    new_func = builder.build(name)
    if not builder.lifted:
        return new_func, None
    loader_name = name + LOADER_SUFFIX
    bb = relax.BlockBuilder()
    with bb.function(loader_name, params=[], attrs={_ir.ATTR_CONSTANTS_FOR: name}):
        # the loader only returns the constants (on device 0, where the VM loads them); the VM
        # wrapper copies each to its device once. (A to_vdevice of a constant inside a dataflow
        # block breaks MergeCompositeFunctions when the placed module is partitioned afterwards.)
        values = [make_constant(value, vd_of[home]) for _param, value, _device in builder.lifted]
        bb.emit_func_output(relax.Tuple(values))
    loader = bb.get()[loader_name]
    new_func = new_func.with_attr(_ir.ATTR_CONSTANTS, loader_name).with_attr(
        _ir.ATTR_NUM_CONSTANTS, len(builder.lifted))
    return new_func, (loader_name, loader)
