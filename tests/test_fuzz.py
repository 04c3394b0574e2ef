"""Differential fuzzing: random graphs and random rule sets, offloaded build vs llvm-only build.

CI runs a fixed-seed slice (``derandomize``); a longer random run:

    BYOC_FUZZ_EXAMPLES=2000 BYOC_FUZZ_RANDOM=1 python -m pytest -q tests/test_fuzz.py

Every failure found becomes a regression case in ``test_regressions`` below.
"""

from __future__ import annotations

import os

from conftest import TOLERANCE, saved_rules
from fuzz_graphs import graphs, run_all, transformer_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import byoc_hetero as bh
from byoc_hetero.rules import pattern_rules
from byoc_hetero.timing import build, relative_error

EXAMPLES = int(os.environ.get("BYOC_FUZZ_EXAMPLES", "150"))
RANDOM = os.environ.get("BYOC_FUZZ_RANDOM") == "1"


def differential(mod, inputs, disabled=()):
    """Partition with some built-in rules disabled; compare every output with the llvm-only build."""
    with saved_rules():
        for name in disabled:
            bh.unregister_pattern("byoc_hetero", name)
        part = bh.partition(mod)
    got = run_all(build(part), inputs)
    want = run_all(build(mod), inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert relative_error(g, w) <= TOLERANCE, relative_error(g, w)
    return part


RULE_NAMES = sorted(r.name for r in pattern_rules("byoc_hetero"))


@settings(max_examples=EXAMPLES, derandomize=not RANDOM, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=graphs(), disabled=st.sets(st.sampled_from(RULE_NAMES), max_size=len(RULE_NAMES)))
def test_offloaded_equals_llvm(case, disabled):
    mod, inputs, recipe = case
    differential(mod, inputs, sorted(disabled))


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
