"""Every rewrite of the pipeline, one module each, listed here in the order they run.

The pipeline, from a model file to the module ``relax.build`` takes:

=====================  =======================================================================
where                  passes, in run order
=====================  =======================================================================
``from_onnx``          :data:`ONNX_IMPORT` on the ONNX protobuf, before TVM's importer, then
                       :data:`ONNX_IMPORTED` on the imported Relax module
``from_torch``         :data:`TORCH_EXPORTED` on the decomposed ``torch.export`` program, before
                       TVM's importer, then :data:`TORCH_IMPORT` on the imported Relax module
``partition``          :data:`BEFORE_STAGES` after the weights are bound
MergeComposite         :data:`BEFORE_FUSION`, then FuseOpsByPattern over the pattern rules
AnnotateTarget         FuseOpsByPattern over the op rules, then each composite marked with its
                       backend
MergeCompilerRegions   :data:`BEFORE_MERGE`, then MergeCompositeFunctions
                       (:mod:`.merge_composite_functions`) with the cost gate (a refused region's
                       composites go back through :mod:`.inline_composites` and the merge is
                       redone), then :data:`AFTER_MERGE`
PartitionGraph         RunCodegen: each backend lowers its regions; the oneDNN backend runs its
                       region-graph passes (:meth:`byoc_hetero.rules.Backend.graph_passes`, in
                       the order its ``region_passes`` lists)
=====================  =======================================================================

:func:`pipeline` returns the whole order as names (``tests/test_passes.py`` pins it). A new
rewrite is a new module here with a docstring saying what it rewrites and why, and one entry in
the list of its place; the stages (``byoc_hetero/stages.py``) run the lists and name no pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from .._relax import entry_functions
from .bool_arith import bool_arith
from .bound_assumed_slices import bound_assumed_slices
from .checked_take import checked_take
from .close_shape_arguments import close_shape_arguments
from .combine_parallel_denses import combine_parallel_denses
from .compose_permutes import compose_permutes
from .compose_row_moves import compose_row_moves
from .conv_integer_qdq import conv_integer_qdq
from .dequantized_pad_values import dequantized_pad_values
from .drop_constant_selects import drop_constant_selects
from .drop_empty_operands import drop_empty_operands
from .drop_needless_broadcasts import drop_needless_broadcasts
from .drop_identity_expands import drop_identity_expands
from .drop_proven_index_checks import drop_proven_index_checks
from .drop_zero_pads import drop_zero_pads
from .dynamic_quantize_linear import dynamic_quantize_linear
from .einsum_as_matmul import einsum_as_matmul
from .explicit_same_pads import explicit_same_pads
from .float_ops_on_integers import float_ops_on_integers
from .fold_int_constants import fold_int_constants
from .fold_negative_indices import fold_negative_indices
from .fold_weight_subgraphs import fold_weight_subgraphs
from .fold_zero_pads import fold_zero_pads
from .gather_elements_as_take import gather_elements_as_take
from .narrow_gathered_products import narrow_gathered_products
from .gather_before_dequantize import gather_before_dequantize
from .inbound_slices import inbound_slices
from .inline_composites import inline_composites
from .integer_clips import integer_clips
from .matmul_integer_qdq import matmul_integer_qdq
from .matmul_nbits import matmul_nbits
from .matmul_repeated_heads import matmul_repeated_heads
from .dynamic_quantize_per_reader import dynamic_quantize_per_reader
from .merge_composite_functions import merge_composite_functions
from .nonempty_dims import nonempty_dims
from .ranges_from_dims import ranges_from_dims
from .resolve_shape_tensors import resolve_shape_tensors
from .scalar_reshapes import scalar_reshapes
from .shape_initializers_as_constants import shape_initializers_as_constants
from .shorten_region_names import MAX_REGION_NAME, shorten_region_names
from .te_clips import te_clips
from .te_pads import te_pads


@dataclass(frozen=True)
class Pass:
    """One rewrite of the pipeline: its name, what it works on, and the function.

    ``level`` is ``"onnx"`` (an ``onnx.ModelProto`` in, one out), ``"torch"`` (a decomposed
    ``torch.export.ExportedProgram`` in, one out) or ``"relax"`` (an IRModule in, one out). ``run(x, **context)`` takes the context the caller has (``shape`` for the ONNX
    passes) and ignores the rest.
    """

    name: str
    level: str
    fn: Callable[..., Any]

    def run(self, x: Any, **context: Any) -> Any:
        """Apply the pass."""
        return self.fn(x, **context)

    @property
    def doc(self) -> str:
        """The first line of the pass's docstring: what it rewrites."""
        return (self.fn.__doc__ or "").strip().splitlines()[0]


def _relax(fn: Callable[[tvm.IRModule], tvm.IRModule]) -> Callable[..., tvm.IRModule]:
    def run(mod: tvm.IRModule, **_context: Any) -> tvm.IRModule:
        return fn(mod)

    run.__doc__ = fn.__doc__
    return run


def canonicalize_bindings(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's CanonicalizeBindings: ``(a, b)[0]`` → ``a``, so values read only through a tuple
    nobody else reads (the unused indices of PyTorch's max-pools) do not become region outputs."""
    return relax.transform.CanonicalizeBindings()(mod)


def dead_code_elimination(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's DeadCodeElimination over the entry functions: dead bindings would make regions
    nobody calls (which RunCodegen never compiles)."""
    return relax.transform.DeadCodeElimination(entry_functions(mod))(mod)


def close_region_shape_arguments(mod: tvm.IRModule) -> tvm.IRModule:
    """:func:`close_shape_arguments` for the regions MergeCompositeFunctions made: a shape the
    region's tensor parameters define is bound inside, not passed at every call."""
    return close_shape_arguments(mod, regions=True)


ONNX_IMPORT: tuple[Pass, ...] = (
    # ONNX Runtime's MatMulNBits (int4 / int8 weights) as the weight-only form TVM's importer reads
    Pass("matmul_nbits", "onnx", matmul_nbits),
    Pass("dequantized_pad_values", "onnx", dequantized_pad_values),
    # before shape_initializers_as_constants, which turns the scale and zero point into Constant nodes
    Pass("gather_before_dequantize", "onnx", gather_before_dequantize),
    # after dequantized_pad_values, which reads the pad value's zero point as an initializer
    Pass("shape_initializers_as_constants", "onnx", shape_initializers_as_constants),
    Pass("explicit_same_pads", "onnx", explicit_same_pads),
    Pass("fold_zero_pads", "onnx", fold_zero_pads),
    Pass("dynamic_quantize_linear", "onnx", dynamic_quantize_linear),
    # after dynamic_quantize_linear: a ConvInteger's source is then a QuantizeLinear whose scale it finds
    Pass("conv_integer_qdq", "onnx", conv_integer_qdq),
    # MaxViT's attention products: a TIR function on llvm as Einsum, a MatMul the rules take
    Pass("einsum_as_matmul", "onnx", einsum_as_matmul),
    # DeBERTa's clamp of bucketed int64 positions: Where selects, which fold_int_constants evaluates
    Pass("integer_clips", "onnx", integer_clips),
    # symbolic sequence dims (the default exporter's shape arithmetic): forms TVM's importer reads
    Pass("scalar_reshapes", "onnx", scalar_reshapes),
    Pass("drop_identity_expands", "onnx", drop_identity_expands),
    Pass("ranges_from_dims", "onnx", ranges_from_dims),
)
"""Edits of the ONNX protobuf before TVM imports it (``bh.from_onnx``)."""

ONNX_IMPORTED: tuple[Pass, ...] = (
    # first: the symbols it substitutes give the later passes (and the partition) known shapes
    Pass("resolve_shape_tensors", "relax", _relax(resolve_shape_tensors)),
    Pass("bound_assumed_slices", "relax", _relax(bound_assumed_slices)),
    Pass("bool_arith", "relax", _relax(bool_arith)),
    Pass("checked_take", "relax", _relax(checked_take)),
    # Swin-V2's channels-last Pad to the window: the importer's TIR pad as nn.pad, which the rules read
    Pass("te_pads", "relax", _relax(te_pads)),
)
"""Rewrites of the module TVM's ONNX importer made (``bh.from_onnx``)."""

TORCH_EXPORTED: tuple[Pass, ...] = (
    # torch's int -> float promotion (true division, log of int64 positions), which TVM's importer skips
    Pass("float_ops_on_integers", "torch", float_ops_on_integers),
)
"""Edits of the decomposed ``torch.export`` program before TVM imports it (``bh.from_torch``)."""

TORCH_IMPORT: tuple[Pass, ...] = (
    Pass("nonempty_dims", "relax", _relax(nonempty_dims)),
    Pass("inbound_slices", "relax", _relax(inbound_slices)),
    Pass("bool_arith", "relax", _relax(bool_arith)),
    Pass("checked_take", "relax", _relax(checked_take)),
)
"""Rewrites of the module TVM's torch importer made (``bh.from_torch``)."""

BEFORE_STAGES: tuple[Pass, ...] = (
    # before the folding, which would turn the int8 weight's int32 casts into constants that no
    # longer show the int8 weight
    Pass("matmul_integer_qdq", "relax", _relax(matmul_integer_qdq)),
    Pass("dynamic_quantize_per_reader", "relax", _relax(dynamic_quantize_per_reader)),
    Pass("fold_int_constants", "relax", _relax(fold_int_constants)),
    # after the folding, which turns DeBERTa's relative-position indices into constants; before the
    # weight folding, which folds the slice of the position keys it makes
    Pass("narrow_gathered_products", "relax", _relax(narrow_gathered_products)),
    # weight-only subgraphs (wav2vec2's weight norm) become constants once the weights are bound
    Pass("fold_weight_subgraphs", "relax", _relax(fold_weight_subgraphs)),
    # after the folding, which makes an absent attention mask's condition a constant
    Pass("drop_constant_selects", "relax", _relax(drop_constant_selects)),
    # after the folding, which makes the ONNX importer's NaN-guarded Clip bounds constants
    Pass("te_clips", "relax", _relax(te_clips)),
    # after the folding, which turns DeBERTa's relative-position indices into constants
    Pass("gather_elements_as_take", "relax", _relax(gather_elements_as_take)),
    # after the folding, which turns computed indices (Swin's windows) into constants
    Pass("drop_proven_index_checks", "relax", _relax(drop_proven_index_checks)),
    # the same for the ONNX importer's Gather form, where(i < 0, i + n, i) between check and take
    Pass("fold_negative_indices", "relax", _relax(fold_negative_indices)),
    Pass("drop_zero_pads", "relax", _relax(drop_zero_pads)),
    # after the index checks are dropped: Swin's roll (two takes) and window partition as one take of rows
    Pass("compose_row_moves", "relax", _relax(compose_row_moves)),
    # partial rotary's empty pass-through slice: a concat operand of no elements
    Pass("drop_empty_operands", "relax", _relax(drop_empty_operands)),
    # torch's sdpa output: three permutes in a row, two of them undoing each other
    Pass("compose_permutes", "relax", _relax(compose_permutes)),
    # grouped-query attention's repeat_kv: the matmuls broadcast the K / V heads instead of a copy
    Pass("matmul_repeated_heads", "relax", _relax(matmul_repeated_heads)),
    # last: the weights are constants; Q / K / V projections of one input as one wider dense
    Pass("combine_parallel_denses", "relax", _relax(combine_parallel_denses)),
)
"""Run by ``bh.partition`` after binding the weights, before the four stages."""

BEFORE_FUSION: tuple[Pass, ...] = (
    Pass("drop_needless_broadcasts", "relax", _relax(drop_needless_broadcasts)),
    Pass("canonicalize_bindings", "relax", _relax(canonicalize_bindings)),
    Pass("dead_code_elimination", "relax", _relax(dead_code_elimination)),
)
"""MergeComposite, before FuseOpsByPattern groups the pattern rules' matches."""

BEFORE_MERGE: tuple[Pass, ...] = (Pass("close_shape_arguments", "relax", _relax(close_shape_arguments)),)
"""MergeCompilerRegions, before MergeCompositeFunctions: composites of both fusing stages."""

AFTER_MERGE: tuple[Pass, ...] = (
    Pass("close_region_shape_arguments", "relax", _relax(close_region_shape_arguments)),
    Pass("shorten_region_names", "relax", _relax(shorten_region_names)),
)
"""MergeCompilerRegions, once the cost gate accepts every region."""


def run_passes(passes: Sequence[Pass], x: Any, **context: Any) -> Any:
    """Apply ``passes`` in order."""
    for p in passes:
        x = p.run(x, **context)
    return x


def pipeline(targets: Sequence[str] | None = None) -> list[str]:
    """Every pass in run order, by name, for a partition to ``targets`` (default: the default
    backend). The stages and the codegens' own steps are named in brackets; a backend's
    region-graph passes are ``<backend>:<pass>``."""
    from ..rules import default_target, get_target

    names = [get_target(t).name for t in (targets or [default_target()])]
    region = [f"{n}:{p}" for n in names for p, _ in get_target(n).graph_passes()]
    return ([f"onnx:{p.name}" for p in ONNX_IMPORT] + [f"onnx:{p.name}" for p in ONNX_IMPORTED]
            + [f"torch:{p.name}" for p in TORCH_EXPORTED + TORCH_IMPORT]
            + [p.name for p in BEFORE_STAGES]
            + ["[MergeComposite]", *(p.name for p in BEFORE_FUSION), "fuse_pattern_rules",
               "[AnnotateTarget]", "fuse_op_rules", "mark_composite_targets",
               "[MergeCompilerRegions]", *(p.name for p in BEFORE_MERGE), "merge_composite_functions",
               "cost_gate", *(p.name for p in AFTER_MERGE),
               "[PartitionGraph]", "run_codegen", *region, "insert_range_checks", "host_code_anchor"])


__all__ = [
    "AFTER_MERGE", "BEFORE_FUSION", "BEFORE_MERGE", "BEFORE_STAGES", "MAX_REGION_NAME", "ONNX_IMPORT", "ONNX_IMPORTED",
    "TORCH_EXPORTED", "TORCH_IMPORT", "Pass", "float_ops_on_integers", "bool_arith", "bound_assumed_slices", "checked_take", "drop_constant_selects", "drop_empty_operands", "drop_identity_expands", "drop_proven_index_checks", "drop_zero_pads", "fold_weight_subgraphs", "nonempty_dims", "ranges_from_dims", "resolve_shape_tensors", "scalar_reshapes", "shape_initializers_as_constants", "canonicalize_bindings", "close_region_shape_arguments", "close_shape_arguments", "combine_parallel_denses",
    "compose_permutes", "compose_row_moves", "conv_integer_qdq",
    "dead_code_elimination", "dequantized_pad_values", "drop_needless_broadcasts", "dynamic_quantize_linear", "dynamic_quantize_per_reader", "einsum_as_matmul", "explicit_same_pads", "fold_int_constants", "fold_negative_indices", "gather_before_dequantize", "gather_elements_as_take",
    "fold_zero_pads", "inbound_slices", "inline_composites", "integer_clips", "matmul_integer_qdq", "matmul_nbits", "matmul_repeated_heads", "merge_composite_functions", "narrow_gathered_products", "pipeline",
    "run_passes", "shorten_region_names", "te_clips", "te_pads",
]
