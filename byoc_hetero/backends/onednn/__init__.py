"""The oneDNN backend: target ``byoc_hetero``, whose regions run in this package's C++ runtime.

Naming contract (what tests, reports and placement rely on):

* target ``byoc_hetero``; pattern-rule composites are ``byoc_hetero.<rule>`` (``conv2d_bias_relu``,
  ``dense_flat_bias_relu``, ``max_pool2d``, ``softmax``, ``add_act``, ``activation``, ...);
  op-rule composites ``byoc_hetero.op.<op>``;
* regions carry ``Codegen="byoc_hetero"``; PartitionGraph calls ``relax.ext.byoc_hetero``
  (:mod:`.codegen`), which writes each region as the graph of ``docs/region-format.md`` and
  creates a runtime module of kind ``byoc_hetero`` from it.

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

from ...rules import register_pattern, register_target
from . import codegen, ops
from .ops.activation import ACTIVATIONS
from .table import TARGET, can_lower, pattern_specs


def register() -> None:
    """Register target ``byoc_hetero`` and its pattern rules (once per process; idempotent)."""
    target = register_target(TARGET, can_lower)
    if target.patterns:
        return
    for spec in pattern_specs():
        register_pattern(TARGET, spec.name, spec.pattern, spec.annotations, spec.check, spec.priority)


ops.load()
register()

__all__ = ["ACTIVATIONS", "TARGET", "can_lower", "codegen", "register"]
