"""The oneDNN backend: backend ``onednn``, whose regions run in this package's C++ runtime.

Naming contract (what tests, reports and placement rely on):

* backend ``onednn`` (alias ``byoc_hetero``, its earlier name, accepted wherever a target name is);
  pattern-rule composites are ``onednn.<rule>`` (``conv2d_bias_relu``, ``dense_flat_bias_relu``,
  ``max_pool2d``, ``softmax``, ``add_act``, ``activation``, ...); op-rule composites
  ``onednn.op.<op>``;
* regions carry ``Codegen="onednn"``; PartitionGraph calls ``relax.ext.onednn`` (also registered
  as ``relax.ext.byoc_hetero``; :mod:`.codegen`), which writes each region as the graph of
  ``docs/region-format.md`` and creates a runtime module of kind ``byoc_hetero`` from it.

The backend object (:data:`BACKEND`, ``bh.rules.get_target("onednn")``) holds the rules, the
lowering table (:data:`.table.TABLE`), the region-graph passes in run order
(:data:`REGION_PASSES`), the options a partition may give (:data:`OPTIONS`) and the
implementation variants per op (:data:`VARIANTS`) and the knobs a tuner may set
(:data:`.tuning.KNOBS`).

Layout: :mod:`.ops` holds one module per op family with its patterns, checks and lowering side by
side (registered in :mod:`.table`); :mod:`.epilogue` the bias / batch norm / activation / residual
tail shared by conv2d and dense; :mod:`.lowering` the region walk; :mod:`.precision` the dtypes
the runtime computes in.

Rules, tried largest first (priority = 100 + ops covered for conv2d / dense):

==============================  ===============================================================
rules                           match
==============================  ===============================================================
``conv2d[_bias][_bn][_act]``    conv2d → [add(bias)] → [batch_norm (inference form)] →
``[_res|_res2[_act]]``          [activation] → [add(residual) → [activation]]
``dense[_flat][_bias][_act]``   [reshape →] matmul(x, W or permute_dims(W)) → [add(bias)] →
``[_res|_res2[_act]]``          [activation] → [add(residual) → [activation]]
``max_pool2d``, ``avg_pool2d``  pooling of NCHW data
``adaptive_avg_pool2d``         adaptive average pooling whose windows divide the input
``global_avg_pool``             mean over the spatial axes of NCHW data
``softmax``                     softmax along any axis
``safe_softmax[_scalar_zero]``  torch's _safe_softmax chain (softmax; rows all -inf -> 0): one
                                softmax node with ``safe`` 1
``add[_act]``, ``multiply[_act]`` with broadcasting on one side, [activation]
``activation``                  relu, clip, sigmoid, tanh, gelu, gelu_tanh, silu on their own
``hardswish``, ``hardsigmoid``  the chains the frontends spell them as (add 3, clip, divide by 6, or
``silu_decomposed``             alpha·x + beta, clip 0..1); x · sigmoid(x): one eltwise each, made
                                a post-op of their producer by a region-graph pass
``conv2d_pad[_bias][_bn]``      conv2d of a zero nn.pad of H/W: the pad joins the conv's
``[_act]``                      padding
``pad``                         a lone pad: never accepted, says why it stays on llvm
``layer_norm``, ``group_norm``  over the trailing axes / groups of channels (axis 1)
``*_norm_decomposed[_scale]``   mean/subtract/power|variance/add/sqrt/divide [multiply] [add] as
``[_shift]``                    ONNX exporters spell layer and instance norm (one kernel each)
``batch_norm[_relu]``           inference batch norm not after a conv (which folds it)
``reduce_<mean|sum|max|min>``   over any axes, keepdims or not
==============================  ===============================================================

Every check rejects, with the reason, what the runtime cannot run (non-float32 tensors, symbolic
shapes, layouts other than NCHW/OIHW, a bias that is not per output channel, ...), and the rejected
call stays with TVM.
"""

from __future__ import annotations

from typing import Any

from ...errors import RuleError
from ...rules import Option, Variant, register_pattern, register_target, set_default_target
from . import codegen, ops
from .ops.activation import ACTIVATIONS
from .ops.conv2d import check_algorithms
from .precision import DEFAULT_PRECISION, check_node_precisions, check_precision, warn_if_fallback
from .runtime import RUNTIME_KIND, region_graph
from .table import ALIASES, TABLE, TARGET, can_lower
from .tuning import KNOBS

REGION_PASSES: tuple[str, ...] = (
    "fuse_matmul_epilogues",       # ops/attention.py: bias / scale / activation after a matmul
    "fuse_eltwise_into_producer",  # epilogue.py: a lone eltwise becomes a post-op of its producer
    "fuse_rotary_embeddings",      # ops/rotary.py: x * cos + rotate_half(x) * sin (and its head permute) as one rope node
    "fold_operand_scales",         # ops/attention.py: a scalar multiply of a matmul's operand into its scale
    "fold_views",                  # ops/layout.py: permutes / reshapes read as strided views
    "fuse_attention",              # ops/fused_attention.py: matmul -> softmax -> matmul as one attention node
    "fold_channel_scales",         # ops/layout.py: per-channel multiply into the conv's weights
    "fold_dense_input_scales",     # ops/dense_input_scales.py: RMSNorm's per-feature weight into the denses reading it
    "drop_abs_before_square",      # ops/rms_statistic.py: square(abs(x)) reads x (a vector norm's abs)
    "fuse_rms_statistics",         # ops/rms_statistic.py: square, mean / sum, + eps, rsqrt as one reduce node
    "fold_norm_weights",           # ops/rms_statistic.py: the norm's weight (gamma) into that reduce node
    "fuse_affine_tails",           # ops/affine_tail.py: x * r, then * c, + b, + x as one binary x * s + t
    "fold_gate_products",          # ops/dense_wq.py: a GLU's product with a dense_wq output as its gate input
    "fold_residual_adds",          # ops/layout.py: add of a dense / dense_wq output as its residual sum
    "fold_pads",                   # ops/pad.py: zero pads into the padding of the conv reading them
    "fuse_dynamic_int8_sources",   # ops/qdq_dynamic.py: a per-call quantization into the int8 dense reading it
    "fuse_int8_anchors",           # ops/qdq.py: dequantize -> conv / dense / pool -> quantize as int8 nodes
    "fuse_int8_activations",       # ops/int8_activation.py: activation between two quantizations as a post-op
    "fuse_int8_lookup_tables",     # ops/int8_lookup.py: an element-wise chain of one 8-bit tensor as a table
    "fuse_int8_binaries",          # ops/int8_binary.py: dequantize -> add / mul -> quantize on the 8-bit values
    "fuse_quantize_dequantize",    # ops/qdq.py: quantize -> dequantize of one scale as one float32 step
    "move_views_to_8bit",          # ops/qdq_views.py: reshapes / permutes to the 8-bit side of a per-tensor Q/DQ
    "share_repeated_quantizations",  # ops/qdq_share.py: equal Q/DQ / reshape nodes of one tensor once
    "fuse_int8_matmuls",           # ops/int8_matmul.py: matmul of two dequantized 8-bit tensors as int8
    "fuse_elementwise_chains",     # ops/qdq_chain.py: element-wise ops + the Q/DQ between them as one step
    "apply_conv_algorithms",       # ops/conv2d.py: a tuner's direct / Winograd decision per conv site
    "merge_common_nodes",          # ops/common_nodes.py: a node repeating an earlier one (op, inputs, attrs) is dropped
    "apply_node_precisions",       # precision.py: a tuner's f32 / bf16 decision per node index of the final graph
)
"""The region-graph passes, in run order (each lowered region graph goes through them before it
is serialized). This was the alphabetical import order of :mod:`.ops`; it is now stated here, and
``tests/test_passes.py`` pins it."""


def _precision(value: Any) -> str:
    precision = check_precision(str(value))
    if precision != DEFAULT_PRECISION:
        warn_if_fallback(precision)
    return precision


def _dim_ranges(value: Any) -> str:
    if not isinstance(value, str):
        raise RuleError(f"option dim_ranges of backend {TARGET!r} is a JSON string, got {type(value).__name__}")
    return value


OPTIONS = {
    "precision": Option("precision", "compute precision of conv2d / dense / matmul: f32 or bf16 "
                        "(bf16 falls back to f32, with a warning, where the CPU has no native bf16)",
                        DEFAULT_PRECISION, _precision),
    "dim_ranges": Option("dim_ranges", "declared ranges of the symbolic dims, JSON {symbol: [min, max]} "
                         "(the stages fill it from the module's bounds)", None, _dim_ranges),
    "algorithms": Option("algorithms", "per-convolution algorithm, JSON {site key: 'direct' | 'winograd' | "
                         "'auto'} (what bh.tune measured; ops/conv2d.py conv_site_key)", None, check_algorithms),
    "node_precisions": Option("node_precisions", "per-node precision of conv2d / dense / matmul, JSON "
                              "{'<region symbol>#<node>': 'f32' | 'bf16'}, over the region's precision; a node by "
                              "its content key (what bh.tune decided; precision.py content_keys) or its index "
                              "(node_key)", None, check_node_precisions),
    "region_threads": Option("region_threads", "threads per region call, JSON {region key: n}, at most the "
                             "process's count (what bh.tune measured)", None, codegen.check_region_threads),
}
"""The options the oneDNN backend accepts (:meth:`byoc_hetero.rules.Backend.check_options`)."""

_ALGO = "BYOC_HETERO_CONV_ALGO"
_INT8_BY = "Q/DQ around the node (bh.quantize, a QDQ ONNX file; bh.tune's quantizer per layer)"
_INT8_WHEN = ("calibration-derived scales; exact int8 kernels need VNNI (below it the node computes float32 "
              "between its Q/DQ steps, BYOC_HETERO_INT8=saturating keeps oneDNN's saturating ones)")
VARIANTS = {
    "conv2d": (
        Variant("conv2d", "direct", "oneDNN's convolution primitive (its own algorithm choice)",
                f"{_ALGO}=direct", level="algorithm"),
        Variant("conv2d", "winograd", "Winograd F(4x4, 3x3): batched GEMMs between input/output transforms",
                f"{_ALGO}=winograd ('auto', the default, picks it where it pays off and float32 stays within 1e-5: "
                "up to 112 input channels)",
                "3x3, stride 1, no dilation, no groups, channels multiples of 16, constant weights", "algorithm"),
        Variant("conv2d", "f32", "oneDNN convolution in float32", "precision='f32'", level="precision"),
        Variant("conv2d", "bf16", "bf16 weights and activations, f32 accumulation", "precision='bf16'",
                "a CPU with native bf16 (avx512_core_bf16)", "precision"),
        Variant("conv2d", "int8", "u8 activations, per-channel s8 weights, s32 accumulation", _INT8_BY, _INT8_WHEN,
                "precision", applied="quantize", layers=("conv2d",)),
    ),
    "dense": (
        Variant("dense", "f32", "oneDNN inner product / matmul in float32", "precision='f32'", level="precision"),
        Variant("dense", "bf16", "bf16 weights and activations, f32 accumulation", "precision='bf16'",
                "a CPU with native bf16 (avx512_core_bf16)", "precision"),
        Variant("dense", "int8", "u8 activations, per-channel s8 weights, s32 accumulation", _INT8_BY, _INT8_WHEN,
                "precision", applied="quantize", layers=("matmul",)),
    ),
    "matmul": (
        Variant("matmul", "f32", "oneDNN matmul in float32", "precision='f32'", level="precision"),
        Variant("matmul", "bf16", "bf16 operands, f32 accumulation", "precision='bf16'",
                "a CPU with native bf16 (avx512_core_bf16)", "precision"),
        Variant("matmul", "int8", "u8 / s8 operands, s32 accumulation", _INT8_BY, _INT8_WHEN, "precision",
                applied="quantize", layers=("matmul",)),
    ),
}
"""The implementation variants the oneDNN backend offers per op (what a tuner enumerates)."""


def register() -> Any:
    """Register backend ``onednn`` and its pattern rules (once per process; idempotent)."""
    backend = register_target(TARGET, can_lower, codegen.relax_ext_codegen, aliases=ALIASES,
                              options=OPTIONS, variants=VARIANTS, knobs=KNOBS, lowering=TABLE,
                              region_passes=REGION_PASSES, runtime_kind=RUNTIME_KIND,
                              region_graph=region_graph)
    set_default_target(TARGET)
    if backend.patterns:
        return backend
    for spec in TABLE.pattern_specs():
        register_pattern(TARGET, spec.name, spec.pattern, spec.annotations, spec.check, spec.priority)
    return backend


ops.load()
BACKEND = register()
"""The oneDNN backend object."""

__all__ = ["ACTIVATIONS", "BACKEND", "OPTIONS", "REGION_PASSES", "TARGET", "VARIANTS", "can_lower", "codegen",
           "register"]
