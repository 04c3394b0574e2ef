"""Heterogeneous placement on two CPU virtual devices (cpu:0, cpu:1): every placement rule, copy,
validation and BYOC composition, checked against a single-device llvm build and numpy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import byoc_hetero as bh
from byoc_hetero.placement import (
    Device,
    PlacementError,
    PlacementWarning,
    compile,
    lower,
    parse_device,
    place,
    placement_report,
    validate,
    validate_lowered,
    vm,
)
from byoc_hetero.timing import build, random_inputs, relative_error, run

TOL = 1e-5


# -- helpers ------------------------------------------------------------------------------------------

def reference(mod, inputs):
    """The single-device llvm build of the same (unplaced) module."""
    return run(build(mod), inputs)


def run_placed(placed, inputs, entry="main"):
    out = vm(compile(placed))[entry](*inputs)
    return out.numpy()


def main_bindings(mod, entry="main"):
    return [b for block in mod[entry].body.blocks for b in block.bindings]


def dev_of(ty) -> str:
    return str(Device("cpu" if ty.vdevice.target.kind.name == "llvm" else "cuda", int(ty.vdevice.vdevice_id)))


def copies(mod, entry="main"):
    """(copied value name, destination) of every R.to_vdevice in ``entry``."""
    out = []
    for b in main_bindings(mod, entry):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.to_vdevice":
            out.append((v.args[0].name, dev_of(b.var.ty)))
    return out


def op_devices(mod, entry="main"):
    """op name → sorted list of the devices its calls are placed on."""
    out: dict[str, list[str]] = {}
    for b in main_bindings(mod, entry):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name != "relax.to_vdevice":
            out.setdefault(v.op.name, []).append(dev_of(b.var.ty))
    return {k: sorted(v) for k, v in out.items()}


def kernel_calls(lowered, entry="main"):
    """(kernel name, output device, operand devices) of every call_tir after lowering."""
    out = []
    for b in main_bindings(lowered, entry):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.call_tir":
            args = [dev_of(a.ty) for a in v.args[1].fields if isinstance(a.ty, relax.TensorType)]
            out.append((v.args[0].name_hint, dev_of(v.ty_args[0]), args))
    return out


@I.ir_module
class SharedInput:
    """The seed bug: ``b`` feeds an add on each device."""

    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32"),
             c: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            x = R.add(a, b)
            y = R.add(b, c)
            z = R.subtract(x, y)
            R.output(z)
        return z


def second_add(site):
    return site.op_name == "relax.add" and site.index == 1


@pytest.fixture(scope="module")
def convnet():
    mod, params = bh.models.small_convnet(image_size=16)
    inputs = random_inputs(mod, params)
    bound = bh.bind_params(mod, params)
    return mod, params, bound, inputs, reference(bound, inputs)


# -- devices --------------------------------------------------------------------------------------------

def test_device_strings():
    assert parse_device("cpu") == Device("cpu", 0)
    assert parse_device("cpu:1") == Device("cpu", 1)
    assert parse_device("cuda") == Device("cuda", 0)
    assert parse_device(" cuda:2 ") == Device("cuda", 2)
    assert parse_device(tvm.cpu(3)) == Device("cpu", 3)
    assert parse_device(tvm.cuda(1)) == Device("cuda", 1)
    for bad in ("gpu", "cpu:x", "cuda:-1", "", "llvm"):
        with pytest.raises(PlacementError, match="unknown device"):
            parse_device(bad)


# -- item 2: copies; the seed bug -------------------------------------------------------------------------

def test_shared_input_is_copied_once_and_matches_single_device_build():
    placed = place(SharedInput, {second_add: "cpu:1"}, fallback="cpu:0")
    # b is used on both devices: one copy of b to cpu:1, and y comes back once for the subtract
    assert sorted(copies(placed)) == [("b", "cpu:1"), ("y", "cpu:0")]
    assert op_devices(placed) == {"relax.add": ["cpu:0", "cpu:1"], "relax.subtract": ["cpu:0"]}
    params = {p.name: dev_of(p.ty) for p in placed["main"].params}
    assert params == {"a": "cpu:0", "b": "cpu:0", "c": "cpu:1"}  # each at its first consumer
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((2, 3)).astype("float32") for _ in range(3))
    got = run_placed(placed, [a, b, c])
    np.testing.assert_allclose(got, reference(SharedInput, [a, b, c]), rtol=TOL)
    np.testing.assert_allclose(got, (a + b) - (b + c), rtol=TOL, atol=1e-6)


def test_value_used_by_several_ops_on_both_devices_is_copied_once():
    @I.ir_module
    class Fanout:
        @R.function
        def main(a: R.Tensor((4, 4), "float32"), c: R.Tensor((4, 4), "float32")) -> R.Tensor((4, 4), "float32"):
            with R.dataflow():
                x = R.multiply(a, c)          # cpu:0
                p = R.add(x, c)               # cpu:1
                q = R.subtract(x, c)          # cpu:1
                r = R.maximum(x, p)           # cpu:1
                s = R.negative(x)             # cpu:0
                t = R.add(R.add(p, q), r)     # cpu:1, cpu:1
                u = R.subtract(t, s)          # cpu:0
                R.output(u)
            return u

    rules = {"relax.subtract": "cpu:1", "relax.maximum": "cpu:1", lambda s: s.op_name == "relax.add": "cpu:1"}
    placed = place(Fanout, rules, fallback="cpu:0")
    # x (cpu:0) feeds four ops on cpu:1, c (cpu:0, its first consumer) two: one copy each;
    # s (cpu:0) goes over once for u
    assert copies(placed) == [("x", "cpu:1"), ("c", "cpu:1"), ("s", "cpu:1")]
    rng = np.random.default_rng(1)
    a, c = (rng.standard_normal((4, 4)).astype("float32") for _ in range(2))
    got = run_placed(placed, [a, c])
    x = a * c
    p, q, r, s = x + c, x - c, np.maximum(x, x + c), -x
    np.testing.assert_allclose(got, (p + q + r) - s, rtol=TOL, atol=1e-6)
    np.testing.assert_allclose(got, reference(Fanout, [a, c]), rtol=TOL)


def test_callable_rule_places_only_the_first_conv(convnet):
    _mod, _params, bound, inputs, want = convnet
    first_conv = lambda s: s.op_name == "relax.nn.conv2d" and s.index == 0  # noqa: E731
    placed = place(bound, {first_conv: "cpu:1"}, fallback="cpu:0")
    assert op_devices(placed)["relax.nn.conv2d"] == ["cpu:0", "cpu:0", "cpu:1"]
    assert relative_error(run_placed(placed, inputs), want) <= TOL


def test_pattern_rule(convnet):
    _mod, _params, bound, inputs, want = convnet
    relu_of_add = is_op("relax.nn.relu")(is_op("relax.add")(wildcard(), wildcard()))
    placed = place(bound, {relu_of_add: "cpu:1"}, fallback="cpu:0")
    # conv1 (+bias) and fc1 (+bias) end in relu(add(...)); conv2 has no bias: relu(conv)
    assert op_devices(placed)["relax.nn.relu"] == ["cpu:0", "cpu:1", "cpu:1"]
    assert relative_error(run_placed(placed, inputs), want) <= TOL


# -- item 7: conv2d on device 1, the rest on device 0 --------------------------------------------------

def test_conv2d_on_device_1_rest_on_device_0(convnet):
    _mod, _params, bound, inputs, want = convnet
    placed = place(bound, {"relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")
    devs = op_devices(placed)
    assert devs.pop("relax.nn.conv2d") == ["cpu:1"] * 3
    assert all(set(d) == {"cpu:0"} for d in devs.values()), devs
    validate(placed)
    lowered = lower(placed)
    convs = [k for k in kernel_calls(lowered) if k[0].startswith("conv2d")]
    assert len(convs) == 3
    for name, out, args in kernel_calls(lowered):
        want_dev = "cpu:1" if name.startswith("conv2d") else "cpu:0"
        assert out == want_dev and set(args) <= {want_dev}, (name, out, args)
    got = run_placed(placed, inputs)
    assert got.shape == want.shape
    assert relative_error(got, want) <= TOL


@pytest.mark.parametrize("others", ["cpu:0", None])
def test_policy_function_places_conv2d_on_device_1_rest_on_device_0(convnet, others):
    """A policy (one function site -> device or None) instead of a map; None means the fallback."""
    _mod, _params, bound, inputs, want = convnet
    asked = []

    def policy(site):
        asked.append(site.op_name)
        return "cpu:1" if site.op_name == "relax.nn.conv2d" else others

    placed = place(bound, policy, fallback="cpu:0")
    ops = [b.value.op.name for b in main_bindings(bound) if isinstance(b.value, relax.Call)]
    assert sorted(asked) == sorted(ops)  # asked once per call
    rep = placement_report(placed)
    assert rep.devices == ["cpu:0", "cpu:1"]
    n_conv = ops.count("relax.nn.conv2d")
    assert n_conv == 3 and dict(rep.ops["cpu:1"]) == {"relax.nn.conv2d": n_conv}
    rest = {op: ops.count(op) for op in set(ops) - {"relax.nn.conv2d"}}
    assert dict(rep.ops["cpu:0"]) == rest
    # each conv's output comes back; its input goes over, except the model input (a parameter
    # placed on its first consumer's device)
    assert dev_of(placed["main"].params[0].ty) == "cpu:1"
    assert rep.copies_per_run == 2 * n_conv - 1
    validate(placed)
    assert relative_error(run_placed(placed, inputs), want) <= TOL


def test_bad_placement_map_or_policy_says_what_a_map_may_be(convnet):
    bound = convnet[2]
    for bad in (42, "relax.nn.conv2d", {"relax.nn.conv2d"}, is_op("relax.nn.conv2d")(wildcard(), wildcard())):
        with pytest.raises(PlacementError, match="a placement map is a dict .*policy function"):
            place(bound, bad, fallback="cpu:0")
    with pytest.raises(PlacementError, match="policy .*relax.nn.conv2d bound to .*unknown device 'gpu'"):
        place(bound, lambda s: "gpu" if s.op_name == "relax.nn.conv2d" else None, fallback="cpu:0")
    with pytest.raises(PlacementError, match="policy .*raised KeyError"):
        place(bound, lambda s: {}[s.op_name], fallback="cpu:0")
    with pytest.raises(PlacementError, match="policy .* → cpu:2: device not declared"):
        place(bound, lambda s: "cpu:2", fallback="cpu:0", devices=["cpu:0", "cpu:1"])


def test_stock_legalization_drops_the_conv_device_and_we_catch_it(convnet):
    """TVM's own LegalizeOps compiles conv2d with no target and allocates it on device 0;
    our validation names the kernel, our lowering keeps the device."""
    placed = place(convnet[2], {"relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")
    stock = relax.transform.LegalizeOps()(placed)
    with pytest.raises(PlacementError, match="conv2d.*(no device|no target)"):
        validate_lowered(stock)
    validate_lowered(lower(placed))  # ours: no violation


def test_unbound_weights_are_parameters_on_their_consumers_device(convnet):
    mod, params, _bound, inputs, want = convnet
    placed = place(mod, {"relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")
    devs = {p.name: dev_of(p.ty) for p in placed["main"].params}
    assert devs["data"] == "cpu:1"  # its only consumer is the first conv
    assert devs["conv1_weight"] == devs["conv2_weight"] == "cpu:1"
    assert devs["conv1_bias"] == devs["fc1_weight"] == "cpu:0"
    weights = [params[p.name] for p in mod["main"].params if p.name in params]
    machine = vm(compile(placed))
    assert [str(d) for d in machine.input_devices()[:2]] == [str(tvm.cpu(1)), str(tvm.cpu(1))]
    got = machine["main"](*inputs, *weights).numpy()
    assert relative_error(got, want) <= TOL


def test_inputs_are_moved_to_their_devices():
    placed = place(SharedInput, {second_add: "cpu:1"}, fallback="cpu:0")
    machine = vm(compile(placed))
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal((2, 3)).astype("float32") for _ in range(3)]
    # tensors on the "wrong" device, numpy arrays, tensors already in place: all accepted
    given = [tvm.runtime.tensor(arrays[0], tvm.cpu(1)), arrays[1], tvm.runtime.tensor(arrays[2], tvm.cpu(1))]
    out = machine["main"](*given)
    assert out.device == tvm.cpu(0)
    np.testing.assert_allclose(out.numpy(), (arrays[0] + arrays[1]) - (arrays[1] + arrays[2]), rtol=TOL, atol=1e-6)
    with pytest.raises(bh.InputError, match="takes 3 inputs"):
        machine["main"](arrays[0])


@I.ir_module
class HandWritten:
    """A model calling a hand-written TIR kernel twice."""

    @T.prim_func(s_tir=True)
    def twice(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("b"):
                vi = T.axis.remap("S", [i])
                y[vi] = x[vi] * T.float32(2)

    @R.function
    def main(a: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        cls = HandWritten
        with R.dataflow():
            x = R.call_tir(cls.twice, (a,), out_ty=R.Tensor((4,), "float32"))
            y = R.add(x, a)
            z = R.call_tir(cls.twice, (y,), out_ty=R.Tensor((4,), "float32"))
            R.output(z)
        return z


def test_hand_written_kernel_gets_the_target_of_its_device():
    placed = place(HandWritten, {lambda s: s.op_name == "twice" and s.index == 1: "cpu:1"}, fallback="cpu:0")
    lowered = lower(placed)
    calls = [(n, o) for n, o, _ in kernel_calls(lowered)]
    assert calls == [("twice", "cpu:0"), ("add_llvm", "cpu:0"), ("twice", "cpu:1")]
    assert lowered["twice"].attrs["target"].kind.name == "llvm"
    a = np.arange(4, dtype="float32")
    out = vm(compile(placed))["main"](a)
    assert out.device == tvm.cpu(1)
    np.testing.assert_allclose(out.numpy(), (2 * a + a) * 2)


# -- item 7: a CPU-only op, everything else on the other device -----------------------------------------

SEEN_DEVICES: list = []


@tvm.register_global_func("test_placement.cpu_only_scale", override=True)
def _cpu_only_scale(x, out):
    """A packed function that only works on host memory: records where its tensors live."""
    SEEN_DEVICES.append((x.device, out.device))
    out.copyfrom(x.numpy() * 2.0)


def test_cpu_only_op_runs_on_its_device_and_is_never_compiled_for_the_other():
    @I.ir_module
    class WithCpuOp:
        @R.function
        def main(x: R.Tensor((2, 8), "float32"), w: R.Tensor((8, 8), "float32")) -> R.Tensor((2, 8), "float32"):
            with R.dataflow():
                y = R.matmul(x, w)
                z = R.call_dps_packed("test_placement.cpu_only_scale", (y,), out_ty=R.Tensor((2, 8), "float32"))
                s = R.nn.softmax(z)
                o = R.add(s, y)
                R.output(o)
            return o

    rules = {"test_placement.cpu_only_scale": "cpu:0", "relax.nn.softmax": "cpu:0"}
    placed = place(WithCpuOp, rules, fallback="cpu:1")
    assert [dev_of(p.ty) for p in placed["main"].params] == ["cpu:1", "cpu:1"]
    lowered = lower(placed)
    for name, out, args in kernel_calls(lowered):
        if "softmax" in name:
            assert out == "cpu:0" and set(args) == {"cpu:0"}
        else:
            assert out == "cpu:1" and set(args) <= {"cpu:1"}, (name, out, args)
    softmax_kernels = [k for k in kernel_calls(lowered) if "softmax" in k[0]]
    assert softmax_kernels and all(k[1] == "cpu:0" for k in softmax_kernels)
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 8)).astype("float32"), rng.standard_normal((8, 8)).astype("float32")
    SEEN_DEVICES.clear()
    got = run_placed(placed, [x, w])
    assert SEEN_DEVICES == [(tvm.cpu(0), tvm.cpu(0))]
    y = x @ w
    z = y * 2
    e = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True) + y, rtol=1e-4, atol=1e-5)


# -- item 2: constants on the non-default device ---------------------------------------------------------

def test_constants_on_the_non_default_device_are_copied_once_at_load():
    k = np.arange(6, dtype="float32").reshape(2, 3)

    @I.ir_module
    class WithConst:
        @R.function
        def main(a: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                x = R.add(a, R.const(k))          # cpu:0 (device 0 keeps its constant)
                y = R.multiply(x, R.const(k))     # cpu:1: the constant is a device constant
                z = R.multiply(y, R.const(k))     # cpu:1: the same constant object? no: a second one
                R.output(z)
            return z

    placed = place(WithConst, {"relax.multiply": "cpu:1"}, fallback="cpu:0")
    func = placed["main"]
    lifted = [p for p in func.params if p.name.startswith("const")]
    assert [dev_of(p.ty) for p in lifted] == ["cpu:1"] * 2
    for b in main_bindings(placed):
        for arg in b.value.args if isinstance(b.value, relax.Call) else []:
            if isinstance(arg, tvm.ir.Constant):
                assert dev_of(arg.ty) == "cpu:0"
    rep = placement_report(placed)
    assert (rep.load_copies, rep.load_bytes) == (2, 2 * k.nbytes)
    assert rep.copies_per_run == 1 and rep.bytes_per_run == k.nbytes  # only x goes to cpu:1
    ex = compile(placed)
    text = ex.executable.as_text()
    main_code = text[text.index("@main:"):text.index("@", text.index("@main:") + 1)]
    assert main_code.count("vm.builtin.to_device") == 1  # x → cpu:1; no constant copied per call
    machine = vm(ex)
    assert [c.device for c in machine.device_constants()] == [tvm.cpu(1)] * 2
    a = np.random.default_rng(4).standard_normal((2, 3)).astype("float32")
    for _ in range(2):
        got = machine["main"](a).numpy()
        np.testing.assert_allclose(got, (a + k) * k * k, rtol=TOL)
    np.testing.assert_allclose(got, reference(WithConst, [a]), rtol=TOL)


def test_bound_weights_used_on_device_1(convnet):
    _mod, _params, bound, inputs, want = convnet
    placed = place(bound, {"relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")
    rep = placement_report(placed)
    # the three conv weights live on cpu:1, copied once at load; biases stay constants of cpu:0
    assert rep.load_copies == 3
    assert rep.load_bytes == 4 * (8 * 3 * 3 * 3 + 16 * 8 * 3 * 3 + 16 * 16)
    assert relative_error(run_placed(placed, inputs), want) <= TOL


# -- item 7: map entries that name nothing / undeclared devices -----------------------------------------

def test_rule_for_an_op_not_in_the_model_warns(convnet):
    _mod, _params, bound, inputs, want = convnet
    with pytest.warns(PlacementWarning, match="'relax.nn.softmax'.*matched no call"):
        placed = place(bound, {"relax.nn.softmax": "cpu:1", "relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")
    assert relative_error(run_placed(placed, inputs), want) <= TOL
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        place(bound, {"relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")  # used rules: no warning


def test_device_not_declared_is_an_error():
    with pytest.raises(PlacementError, match="'relax.add'.*cpu:2: device not declared.*cpu:0, cpu:1"):
        place(SharedInput, {"relax.add": "cpu:2"}, fallback="cpu:0", devices=["cpu:0", "cpu:1"])
    with pytest.raises(PlacementError, match="fallback device cpu:3 is not declared"):
        place(SharedInput, {}, fallback="cpu:3", devices=["cpu:0"])
    with pytest.raises(PlacementError, match="unknown device 'gpu:0'"):
        place(SharedInput, {"relax.add": "gpu:0"})

    @I.ir_module
    class Declared:
        I.module_global_infos({"vdevice": [I.vdevice("llvm", 0), I.vdevice("llvm", 1)]})

        @R.function
        def main(a: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                b = R.add(a, a)
                R.output(b)
            return b

    with pytest.raises(PlacementError, match="cuda:0: device not declared"):
        place(Declared, {"relax.add": "cuda"}, fallback="cpu:0")
    placed = place(Declared, {"relax.add": "cpu:1"}, fallback="cpu:0")  # the module's own devices
    a = np.ones((2, 3), "float32")
    np.testing.assert_allclose(run_placed(placed, [a]), 2 * a)


def test_devices_are_data_in_the_module():
    placed = place(SharedInput, {second_add: "cpu:1"}, fallback="cpu:0")
    vds = placed.global_infos["vdevice"]
    assert [(v.target.kind.name, int(v.vdevice_id)) for v in vds] == [("llvm", 0), ("llvm", 1)]
    assert "vdevice" not in (SharedInput.global_infos or {})  # the input module is unchanged
    # the placed module is ordinary Relax: it prints and parses back
    again = tvm.script.from_source(placed.script(show_meta=True))
    tvm.ir.assert_structural_equal(again, placed)


# -- item 3: validation --------------------------------------------------------------------------------

def test_matmul_with_operands_on_two_devices_is_rejected():
    @I.ir_module
    class Mixed:
        I.module_global_infos({"vdevice": [I.vdevice("llvm", 0), I.vdevice("llvm", 1)]})

        @R.function
        def main(x: R.Tensor((2, 3), "float32", "llvm:0"),
                 w: R.Tensor((3, 4), "float32", "llvm:1")) -> R.Tensor((2, 4), "float32"):
            with R.dataflow():
                y = R.matmul(x, w)
                R.output(y)
            return y

    # TVM infers a device-less output and says nothing
    assert Mixed["main"].body.blocks[0].bindings[0].var.ty.vdevice is None
    no_device = "relax.matmul bound to 'y'.*output has no device .operands: x on cpu:0, w on cpu:1"
    with pytest.raises(PlacementError, match=no_device):
        validate(Mixed)
    with pytest.raises(PlacementError, match="relax.matmul"):
        compile(Mixed)
    # placing it fixes it: place() decides parameter devices anew, w goes next to its consumer
    fixed = place(Mixed, {}, fallback="cpu:0")
    assert [dev_of(p.ty) for p in fixed["main"].params] == ["cpu:0", "cpu:0"]
    assert copies(fixed) == []
    x, w = np.ones((2, 3), "float32"), np.ones((3, 4), "float32")
    np.testing.assert_allclose(run_placed(fixed, [x, w]), x @ w)


def test_operand_on_the_wrong_device_is_named():
    @I.ir_module
    class Wrong:
        I.module_global_infos({"vdevice": [I.vdevice("llvm", 0), I.vdevice("llvm", 1)]})

        @R.function
        def main(x: R.Tensor((2, 3), "float32", "llvm:0"),
                 w: R.Tensor((2, 3), "float32", "llvm:1")) -> R.Tensor((2, 3), "float32", "llvm:1"):
            with R.dataflow():
                y: R.Tensor((2, 3), "float32", "llvm:1") = R.nn.relu(w)
                z: R.Tensor((2, 3), "float32", "llvm:1") = R.call_dps_packed(
                    "test_placement.cpu_only_scale", (x,), out_ty=R.Tensor((2, 3), "float32", "llvm:1"))
                R.output(y, z)
            return z

    wrong = "test_placement.cpu_only_scale bound to 'z'.*output on cpu:1 but operand.*x on cpu:0"
    with pytest.raises(PlacementError, match=wrong):
        validate(Wrong)


def test_unplaced_module_is_rejected():
    with pytest.raises(PlacementError, match="declares no virtual devices"):
        compile(SharedInput)


# -- item 5: with BYOC ---------------------------------------------------------------------------------------

def sin_net():
    """conv → sin → conv → sin → dense: ``sin`` stays with TVM, so regions are separated by TVM ops
    whatever else the partitioner learns to offload."""
    nb = bh.models._NetBuilder(seed=5)
    x = relax.Var("data", relax.TensorType((1, 3, 8, 8), "float32"))

    def layers(nb, x):
        x = nb.conv(x, "conv1", 3, 8, 3, pad=1)
        x = nb.emit(relax.op.sin(x))
        x = nb.conv(x, "conv2", 8, 8, 3, pad=1, relu=False)
        x = nb.emit(relax.op.sin(x))
        x = nb.flatten(x)
        return nb.linear(x, "fc", 8 * 8 * 8, 10, relu=False)

    mod, params = bh.models._finish(nb, [x], layers)
    inputs = random_inputs(mod, params)
    bound = bh.bind_params(mod, params)
    return mod, params, bound, inputs, reference(bound, inputs)


@pytest.fixture(scope="module")
def sinnet():
    return sin_net()


def region_bindings(mod, entry="main"):
    """(var, region symbol) of every offloaded-region call."""
    out = []
    for b in main_bindings(mod, entry):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.call_dps_packed":
            if v.args[0].global_symbol.endswith("onednn"):
                out.append(b)
    return out


def copy_targets(mod, entry="main"):
    """Names of the variables bound to copies."""
    return {b.var.name for b in main_bindings(mod, entry)
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
            and b.value.op.name == "relax.to_vdevice"}


def test_partition_then_place(sinnet):
    mod, params, _bound, inputs, want = sinnet
    part = bh.partition(mod, params)
    regions = region_bindings(part)
    assert len(regions) >= 2 and "relax.sin" in op_devices(place(part, {}, fallback="cpu:0"))
    placed = place(part, {"byoc_hetero": "cpu:1"}, fallback="cpu:0")
    rep = placement_report(placed)
    assert rep.regions == {"cpu:1": {"onednn": len(regions)}}
    for op, devs in op_devices(placed).items():
        if op != "relax.call_dps_packed":
            assert set(devs) == {"cpu:0"}, (op, devs)  # TVM's own ops stay on the fallback
    moved = copies(placed)
    assert len(moved) == len(set(moved)) and moved  # copies at the boundaries, one per value
    assert relative_error(run_placed(placed, inputs), want) <= TOL


def test_region_follows_its_inputs_or_a_rule_naming_it(sinnet):
    mod, params, _bound, inputs, want = sinnet
    part = bh.partition(mod, params)
    # no rule names a region: each region stays where its input is (data on cpu:0, sin on cpu:1)
    placed = place(part, {"relax.sin": "cpu:1"}, fallback="cpu:0")
    devs = [dev_of(b.var.ty) for b in region_bindings(placed)]
    assert devs[0] == "cpu:0" and set(devs[1:]) == {"cpu:1"}
    copied = copy_targets(placed)
    for b in region_bindings(placed):  # nothing is copied for a region
        assert not any(isinstance(a, relax.Var) and a.name in copied for a in b.value.args[1].fields)
    assert relative_error(run_placed(placed, inputs), want) <= TOL
    # an op inside a region does not place it (the warning says how); a callable on its ops does
    with pytest.warns(PlacementWarning, match="inside offloaded regions"):
        place(part, {"relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")
    with_conv = lambda s: "relax.nn.conv2d" in s.contained_ops  # noqa: E731
    placed = place(part, {with_conv: "cpu:1"}, fallback="cpu:0")
    rep = placement_report(placed)
    assert rep.region_ops["cpu:1"]["relax.nn.conv2d"] == 2
    assert "relax.nn.conv2d" not in rep.region_ops.get("cpu:0", {})
    assert relative_error(run_placed(placed, inputs), want) <= TOL


@pytest.mark.parametrize("net", ["convnet", "sinnet"])
def test_place_then_partition(net, request):
    mod, _params, bound, inputs, want = request.getfixturevalue(net)
    placed = place(bound, {"relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")
    part = bh.partition(placed)
    validate(part)  # every region has its operands and output on one device
    rep = placement_report(part)
    n_conv = sum(1 for b in main_bindings(bound) if isinstance(b.value, relax.Call)
                 and isinstance(b.value.op, tvm.ir.Op) and b.value.op.name == "relax.nn.conv2d")
    assert rep.region_ops["cpu:1"]["relax.nn.conv2d"] == n_conv  # each conv offloaded where it was placed
    assert "relax.nn.conv2d" not in rep.region_ops.get("cpu:0", {})
    assert relative_error(run_placed(part, inputs), want) <= TOL


def test_cpu_region_on_a_gpu_is_an_error(sinnet):
    mod, params, *_ = sinnet
    part = bh.partition(mod, params)
    with pytest.raises(PlacementError, match="onednn, a CPU runtime.*cuda:0"):
        place(part, {"byoc_hetero": "cuda"}, fallback="cpu")
    # without a rule, a CPU region stays on a CPU even when its input is on the GPU
    placed = place(part, {"relax.sin": "cuda"}, fallback="cpu")
    assert set(op_devices(placed)["relax.sin"]) == {"cuda:0"}
    assert set(placement_report(placed).regions) == {"cpu:0"}


# -- inputs ------------------------------------------------------------------------------------------------

@I.ir_module
class Symbolic:
    """``n`` is symbolic and shared by both inputs; the second dimension is fixed."""

    @R.function
    def main(a: R.Tensor(("n", 7), "float32"), b: R.Tensor(("n", 7), "float32")) -> R.Tensor(("n", 7), "float32"):
        n = T.int64()
        with R.dataflow():
            x = R.add(a, b)
            y = R.multiply(x, b)
            R.output(y)
        return y


def test_vm_checks_input_shapes_and_dtypes():
    placed = place(Symbolic, {"relax.multiply": "cpu:1"}, fallback="cpu:0")
    machine = vm(compile(placed))
    rng = np.random.default_rng(3)
    for n in (5, 2):  # any value for the symbolic n, on every call
        a, b = (rng.standard_normal((n, 7)).astype("float32") for _ in range(2))
        np.testing.assert_allclose(machine["main"](a, b).numpy(), (a + b) * b, rtol=TOL)
        np.testing.assert_allclose(machine["main"](a, b).numpy(), reference(Symbolic, [a, b]), rtol=TOL)
    a = np.zeros((5, 7), "float32")
    bad = {
        "input 1 \\('b'\\): expected shape \\[n, 7\\], got \\[5, 8\\]": (a, np.zeros((5, 8), "float32")),
        "input 0 \\('a'\\): expected dtype float32, got float64": (np.zeros((5, 7)), a),
        "input 1 \\('b'\\): expected shape \\[n, 7\\], got \\[5, 7, 1\\]": (a, np.zeros((5, 7, 1), "float32")),
        "input 1 \\('b'\\): .* with n = 5 \\(from input 0 \\('a'\\)\\), got \\[4, 7\\]": (a, np.zeros((4, 7), "float32")),
        "main takes 2 inputs \\(a, b\\), got 1": (a,),
    }
    for message, inputs in bad.items():
        with pytest.raises(bh.InputError, match="main: " * ("takes" not in message) + message):
            machine["main"](*inputs)
    # tensors already on a device are checked too (SharedInput: fixed shapes)
    fixed = vm(compile(place(SharedInput, {second_add: "cpu:1"}, fallback="cpu:0")))
    ok = np.ones((2, 3), "float32")
    with pytest.raises(bh.InputError, match="input 2 \\('c'\\): expected shape \\[2, 3\\], got \\[3, 2\\]"):
        fixed["main"](ok, ok, tvm.runtime.tensor(np.ones((3, 2), "float32"), tvm.cpu(1)))


# -- item 6: report ---------------------------------------------------------------------------------------------

def test_report_counts_ops_and_bytes():
    placed = place(SharedInput, {second_add: "cpu:1"}, fallback="cpu:0")
    rep = placement_report(placed)
    assert rep.devices == ["cpu:0", "cpu:1"]
    assert dict(rep.ops["cpu:0"]) == {"relax.add": 1, "relax.subtract": 1}
    assert dict(rep.ops["cpu:1"]) == {"relax.add": 1}
    assert rep.copies_per_run == 2 and rep.bytes_per_run == 2 * 2 * 3 * 4
    assert rep.load_copies == 0
    text = str(rep)
    assert "copies per run: 2 (48 B)" in text and "b                        cpu:0 -> cpu:1" in text
    ex = compile(placed)
    assert placement_report(ex).copies_per_run == 2  # a compiled placement reports the same


def two_conv_net():
    """conv → add → relu, twice: one offloaded region holding 2 conv2d, 2 add and 2 relu."""
    rng = np.random.default_rng(7)
    x = relax.Var("data", relax.TensorType((1, 3, 8, 8), "float32"))
    weights = {"w1": (8, 3, 3, 3), "b1": (1, 8, 1, 1), "w2": (8, 8, 3, 3), "b2": (1, 8, 1, 1)}
    wvars = [relax.Var(n, relax.TensorType(shape, "float32")) for n, shape in weights.items()]
    bb = relax.BlockBuilder()
    with bb.function("main", [x, *wvars]):
        with bb.dataflow():
            y = x
            for w, b in (wvars[:2], wvars[2:]):
                y = bb.emit(relax.op.nn.conv2d(y, w, padding=1))
                y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, b))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    params = {n: (0.3 * rng.standard_normal(shape)).astype("float32") for n, shape in weights.items()}
    return bb.get(), params


def test_report_counts_the_ops_inside_regions_not_their_kinds():
    mod, params = two_conv_net()
    part = bh.partition(mod, params)
    assert len(region_bindings(part)) == 1
    placed = place(part, {"byoc_hetero": "cpu:1"}, fallback="cpu:0")
    rep = placement_report(placed)
    want = {}  # every op of the unpartitioned model, counted here from the IR
    for b in main_bindings(mod):
        if isinstance(b.value, relax.Call):
            want[b.value.op.name] = want.get(b.value.op.name, 0) + 1
    assert want == {"relax.nn.conv2d": 2, "relax.add": 2, "relax.nn.relu": 2}
    assert dict(rep.region_ops["cpu:1"]) == want and "cpu:0" not in rep.region_ops
    assert dict(rep.ops["cpu:1"]) == {"onednn": 1}
    text = str(rep)
    assert "inside the regions: 6 ops" in text and "nn.conv2d                        2" in text
    inputs = random_inputs(mod, params)
    want_out = reference(bh.bind_params(mod, params), inputs)
    assert relative_error(run_placed(placed, inputs), want_out) <= TOL


# -- export ----------------------------------------------------------------------------------------------------

def test_exported_library_carries_its_plan(tmp_path):
    placed = place(SharedInput, {second_add: "cpu:1"}, fallback="cpu:0")
    path = str(tmp_path / "placed.so")
    compile(placed).export_library(path)
    loaded = tvm.runtime.load_module(path)
    machine = vm(loaded)
    assert [str(d) for d in machine.devices] == ["cpu:0", "cpu:1"]
    a, b, c = (np.full((2, 3), v, "float32") for v in (1.0, 2.0, 4.0))
    np.testing.assert_allclose(machine["main"](a, b, c).numpy(), (a + b) - (b + c))
    with pytest.raises(bh.InputError, match="input 1 \\('b'\\): expected dtype float32, got float64"):
        machine["main"](a, b.astype("float64"), c)  # the signature travels with the library
    assert [s.name for s in machine.input_specs("main")] == ["a", "b", "c"]
    assert [(s.name, s.dtype, s.shape) for s in machine.output_specs("main")] == [("output0", "float32", (2, 3))]
