"""Differential fuzzing: random graphs and random rule sets, offloaded build vs llvm-only build.

CI runs a fixed-seed slice (``derandomize``); a longer random run:

    BYOC_FUZZ_EXAMPLES=2000 BYOC_FUZZ_RANDOM=1 python -m pytest -q tests/test_fuzz.py

Every failure found becomes a regression case in ``test_regressions`` below.
"""

from __future__ import annotations

import os

import numpy as np
from conftest import TOLERANCE, saved_rules
from fuzz_graphs import KINDS, graphs, run_all, transformer_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import byoc_hetero as bh
from byoc_hetero._relax import region_graph_json
from byoc_hetero.rules import pattern_rules
from byoc_hetero.timing import build, relative_error

EXAMPLES = int(os.environ.get("BYOC_FUZZ_EXAMPLES", "150"))
RANDOM = os.environ.get("BYOC_FUZZ_RANDOM") == "1"


def differential(mod, inputs, disabled=(), require_heavy_op=True):
    """Partition with some built-in rules disabled; compare every output with the llvm-only build.

    NaN and infinities must sit at the same places in both (the generator keeps them rare: a
    log or sqrt reads |x| + 0.5); the finite values agree within the tolerance."""
    with saved_rules():
        for name in disabled:
            bh.unregister_pattern("byoc_hetero", name)
        part = bh.partition(mod, require_heavy_op=require_heavy_op)
    got = run_all(build(part), inputs)
    want = run_all(build(mod), inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert g.dtype == w.dtype
        for special in (np.isnan, np.isposinf, np.isneginf):
            assert np.array_equal(special(g), special(w)), f"{special.__name__} at different places"
        finite = np.isfinite(w)
        error = relative_error(np.where(finite, g, 0), np.where(finite, w, 0))
        assert error <= TOLERANCE, error
    return part


RULE_NAMES = sorted(r.name for r in pattern_rules("byoc_hetero"))


@settings(max_examples=EXAMPLES, derandomize=not RANDOM, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=graphs(), disabled=st.sets(st.sampled_from(RULE_NAMES), max_size=len(RULE_NAMES)),
       require_heavy_op=st.booleans())
def test_offloaded_equals_llvm(case, disabled, require_heavy_op):
    """Every op the rules know (fuzz_graphs.KINDS); without the cost gate's heavy-op requirement,
    regions of only layout, norm, mask or elementwise ops are offloaded too."""
    mod, inputs, recipe = case
    differential(mod, inputs, sorted(disabled), require_heavy_op)


@settings(max_examples=max(10, EXAMPLES // 3), derandomize=not RANDOM, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=graphs(max_ops=0, kinds=("int8",)))
def test_int8_offloaded_equals_llvm_within_one_step(case):
    """One int8 conv2d / dense between random quantize / dequantize (u8 or s8, random scales and
    zero points, per-channel or per-tensor weights): the runtime's int8 primitive requantizes once,
    so it matches the llvm build (TVM's float emulation of Q/DQ) within one output step."""
    mod, inputs, recipe = case
    part = bh.partition(mod)
    nodes = [n for m in part.attrs.get("external_mods", []) for n in region_graph_json(m)["nodes"]]
    assert any("src_scale" in n["attrs"] for n in nodes), "no int8 anchor in the region"
    got, want = run_all(build(part), inputs), run_all(build(mod), inputs)
    for g, w in zip(got, want):
        assert np.max(np.abs(g - w)) <= recipe.quant_step * 1.001, (np.max(np.abs(g - w)), recipe)


def region_node_ops(part) -> set[str]:
    """The runtime kernels (node ops) of every region a partitioned module holds."""
    return {node["op"] for m in part.attrs.get("external_mods", []) for node in region_graph_json(m)["nodes"]}


def test_every_runtime_kernel_is_fuzzed():
    """Each kernel the runtime registers (``_C.kernels()``) appears in the regions of the graphs the
    fuzzer draws: a new kernel that no generator step reaches fails here until fuzz_graphs.py draws
    the ops that lower to it. Each kind of step is drawn on its own (a few derandomized graphs of
    that kind only), so that rare kinds are not left to chance."""
    seen: dict[str, set[str]] = {}

    for kind in KINDS:
        @settings(max_examples=2, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=graphs(max_ops=1, kinds=(kind,)))
        def collect(case):
            mod, _, _ = case
            for op in region_node_ops(bh.partition(mod, require_heavy_op=False)):
                seen.setdefault(op, set()).add(kind)  # noqa: B023 (called within this iteration)

        collect()
    missing = sorted(set(bh._C.kernels()) - set(seen))
    assert not missing, f"runtime kernels no fuzzed graph reaches: {missing} (reached: {sorted(seen)})"


@settings(max_examples=max(10, EXAMPLES // 3), derandomize=not RANDOM, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=graphs(wide=True))
def test_winograd_offloaded_equals_llvm(case):
    """Channels of 16 and 32 with every eligible conv (3x3, stride 1) forced onto Winograd F(4x4,3x3)."""
    mod, inputs, recipe = case
    saved = os.environ.get("BYOC_HETERO_CONV_ALGO")
    os.environ["BYOC_HETERO_CONV_ALGO"] = "winograd"
    try:
        differential(mod, inputs)
    finally:
        if saved is None:
            del os.environ["BYOC_HETERO_CONV_ALGO"]
        else:
            os.environ["BYOC_HETERO_CONV_ALGO"] = saved


@settings(max_examples=max(10, EXAMPLES // 5), derandomize=not RANDOM, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=transformer_graphs())
def test_transformer_offloaded_equals_llvm(case):
    """Attention (scale, mask post-ops), gelu chains, residuals through reshapes, take on any axis."""
    mod, inputs, recipe = case
    differential(mod, inputs)


def test_regression_dead_bindings_do_not_become_uncompiled_regions():
    """Found by the fuzzer: convs whose results nobody uses became regions RunCodegen never compiled
    (build failed with 'VMShapeLower do not work for local functions' or 'constant has no name')."""
    import numpy as np
    from conftest import graph
    from tvm import relax

    R = relax.op

    def body(e, x, w0):
        e(R.nn.conv2d(x, relax.const(np.full((1, 1, 1, 1), 0.5, "float32"))))  # dead
        e(R.nn.conv2d(x, w0))                                                     # dead
        pooled = e(R.sin(x))  # the only live op: stays on llvm
        e(R.reshape(e(R.nn.conv2d(x, w0)), (1, 9)))                               # dead
        return pooled

    mod = graph({"x": (1, 1, 3, 3), "w0": (1, 1, 1, 1)}, body)
    rng = np.random.default_rng(0)
    differential(mod, [rng.standard_normal((1, 1, 3, 3)).astype("float32"),
                       rng.standard_normal((1, 1, 1, 1)).astype("float32")])


def test_regression_noop_astype_is_a_region_output():
    """Found by the fuzzer: ``astype(x, "float32")`` of a float32 value, alone in a region (no
    heavy-op requirement), made the region return its own input: partition raised CodegenError
    ("a region output that is an input or constant is not supported"). A no-op cast is a relabel now."""
    from conftest import graph
    from tvm import relax

    R = relax.op
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype("float32")
    only = graph({"x": (2, 3)}, lambda e, v: R.astype(v, "float32"))
    both = graph({"x": (2, 3)}, lambda e, v: relax.Tuple([e(R.nn.relu(v)), e(R.astype(e(R.nn.relu(v)), "float32"))]))
    for mod in (only, both):
        part = differential(mod, [x], require_heavy_op=False)
        assert region_node_ops(part), "the cast runs in a region"
