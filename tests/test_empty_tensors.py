"""Tensors with no elements (a static dim of 0; issue 39 item 5).

A concat operand that holds nothing is dropped before the partition (pass ``drop_empty_operands``);
any other empty tensor stays on llvm with the reason (``empty_tensor_reason``), so no region
document carries a dim of 0 (the runtime takes dims >= 1). Checked on a minimal Relax graph against
the llvm-only build, and on a Phi-3 decoder (its rotary embedding's pass-through slice is empty at
a rotary factor of 1) through both import paths against torch.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero import passes
from byoc_hetero._relax import region_graph_json
from model_paths import PATHS, first_output, one_region

R = relax.op


def _slice_concat_module(*, empty_output: bool) -> tvm.IRModule:
    """``x`` [1, 4, 6, 8]: relu(x) concatenated with ``x[..., 8:]`` (empty) on the last axis; with
    ``empty_output`` the empty slice's exp is a second output too."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 6, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(R.nn.relu(x))
            empty = bb.emit(R.strided_slice(x, axes=[3], begin=[8], end=[8]))
            z = bb.emit(R.multiply(bb.emit(R.concat([y, empty], axis=3)), relax.const(np.float32(2.0))))
            if empty_output:
                out = bb.emit_output(relax.Tuple([z, bb.emit(R.exp(empty))]))
            else:
                out = bb.emit_output(z)
        bb.emit_func_output(out)
    return bb.get()


def _run(mod: tvm.IRModule, x: np.ndarray) -> list[np.ndarray]:
    out = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _region_shapes(part: tvm.IRModule) -> list[list]:
    """The shape of every tensor of every region document of ``part``."""
    return [t["shape"] for m in part.attrs.get("external_mods", []) for t in region_graph_json(m)["tensors"]]


def test_drop_empty_operands_drops_the_empty_concat_operand():
    mod = _slice_concat_module(empty_output=False)
    out = passes.drop_empty_operands(mod)
    ops = [str(b.value.op.name) for b in out["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert "relax.concat" not in ops and "relax.strided_slice" not in ops
    assert passes.drop_empty_operands(out).same_as(out)  # nothing left to drop


def test_empty_concat_operand_is_dropped_and_matches_llvm():
    mod = _slice_concat_module(empty_output=False)
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 8)).astype("float32")
    want = _run(mod, x)
    part = bh.partition(mod, require_heavy_op=False)
    assert len(bh.report(part).regions) == 1
    assert all(0 not in shape for shape in _region_shapes(part))
    got = _run(part, x)
    np.testing.assert_array_equal(got[0], want[0])


def test_an_empty_tensor_that_is_not_a_noop_stays_on_llvm_with_the_reason():
    mod = _slice_concat_module(empty_output=True)
    x = np.random.default_rng(1).standard_normal((1, 4, 6, 8)).astype("float32")
    want = _run(mod, x)
    part = bh.partition(mod, require_heavy_op=False)
    report = bh.report(part)
    assert any("holds no elements" in f.reason for f in report.fallbacks), report
    assert all(0 not in shape for shape in _region_shapes(part))
    got = _run(part, x)
    assert got[1].shape == (1, 4, 6, 0) == want[1].shape
    np.testing.assert_array_equal(got[0], want[0])


# -- Phi-3: the rotary pass-through part is empty at partial_rotary_factor = 1 ----------------------
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def phi3():
    config = transformers.Phi3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     partial_rotary_factor=1.0, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    model = first_output(transformers.Phi3ForCausalLM(config).eval(), use_cache=False, return_dict=False)
    ids = torch.randint(0, 128, (1, 10))
    with torch.no_grad():
        want = model(ids).numpy()
    return model, ids, want


@pytest.mark.parametrize("path", PATHS[:2])
def test_phi3_with_an_empty_rotary_pass_through_is_one_region(phi3, path, tmp_path):
    model, ids, want = phi3
    part = one_region(model, (ids,), path, tmp_path, nothing_on_llvm=False)  # the mask's integer ops stay
    got = _run(part, ids.numpy())[0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
