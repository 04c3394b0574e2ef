/*!
 * \file kernels/reshape.cc
 * \brief reshape: the same row-major bytes under another shape (e.g. a flatten before a dense).
 *
 * No attrs; the output tensor's declared shape is the new shape and must have as many elements
 * as the input.  No step runs: the planner gives the output the input's plain bytes (making a
 * plain copy first only if the input is held in a blocked layout).
 */
#include "reshape.h"

#include "int8.h"

namespace byoc_hetero {

memory::desc ReshapedView(const memory::desc& stored, const memory::dims& dims) {
  if (stored.get_format_kind() != memory::format_kind::blocked || stored.get_inner_nblks() != 0 ||
      stored.get_data_type() != memory::data_type::f32 || stored.get_submemory_offset() != 0 ||
      stored.get_padded_dims() != stored.get_dims()) {
    return memory::desc();
  }
  const memory::dims in = stored.get_dims(), in_strides = stored.get_strides();
  memory::dims strides(dims.size(), 0);
  // Walk both shapes from the innermost dim, one chunk of stored dims at a time: a chunk is a run
  // of dims contiguous to each other (stride[i] == stride[i + 1] * dim[i + 1]); the output dims
  // covering it must multiply to its size, and take the chunk's strides from its innermost one.
  int64_t out_d = static_cast<int64_t>(dims.size()) - 1;
  int64_t chunk_stride = in_strides.back(), chunk_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(in.size()) - 1; d >= 0; --d) {
    chunk_numel *= in[d];
    const bool chunk_ends = d == 0 || (in[d - 1] != 1 && in_strides[d - 1] != chunk_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (out_d >= 0 && (view_numel < chunk_numel || dims[out_d] == 1)) {
      strides[out_d] = view_numel * chunk_stride;
      view_numel *= dims[out_d];
      --out_d;
    }
    if (view_numel != chunk_numel) return memory::desc();
    if (d > 0) {
      chunk_stride = in_strides[d - 1];
      chunk_numel = view_numel = 1;
    }
  }
  if (out_d != -1) return memory::desc();
  // Leading unit dims (a batch of 1) outermost, as oneDNN's own tags have them: any stride is the
  // same bytes, but oneDNN picks its optimized kernels by the strides' order (acdb, not cadb).
  const int64_t numel = stored.get_size() / static_cast<int64_t>(sizeof(float));
  for (size_t d = 0; d < dims.size() && dims[d] == 1; ++d) strides[d] = numel;
  return memory::desc(dims, memory::data_type::f32, strides);
}

static std::unique_ptr<Kernel> BuildReshape(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  if (ctx.input(0).numel() != ctx.output().numel()) {
    ctx.Fail("cannot reshape " + ShapeToString(ctx.input(0).shape) + " (" +
             std::to_string(ctx.input(0).numel()) + " elements) to " +
             ShapeToString(ctx.output().shape) + " (" + std::to_string(ctx.output().numel()) +
             " elements)");
  }
  if (IsInt8(ctx.input(0).dtype) || IsInt8(ctx.output().dtype)) {
    // the 8-bit values of a per-tensor quantization (ops/qdq_views.py moves reshapes there): the
    // same bytes, so input and output must agree on the dtype
    if (ctx.input(0).dtype != ctx.output().dtype) {
      ctx.Fail(std::string("input is ") + DTypeName(ctx.input(0).dtype) + " but output is " +
               DTypeName(ctx.output().dtype) + "; a reshape keeps the dtype");
    }
    return std::make_unique<AliasKernel>(PlainDescOf(ctx.input(0)), PlainDescOf(ctx.output()));
  }
  const auto& in = ctx.input(0).shape;
  const auto& out = ctx.output().shape;
  return std::make_unique<AliasKernel>(PlainDesc(memory::dims(in.begin(), in.end())),
                                       PlainDesc(memory::dims(out.begin(), out.end())));
}

/*! \brief bf16 region: the same bytes, so bf16 exactly when the output is (the planner aliases them). */
static KernelTraits ReshapeTraits() {
  KernelTraits traits;
  traits.bf16_input = Bf16ReadLikeOutput;
  traits.accepts_int8 = true;  // the same bytes whatever their dtype
  traits.strided_input = StridedPassesOn;  // the output views the input's bytes (planned as a view)
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("reshape", BuildReshape, ReshapeTraits());

}  // namespace byoc_hetero
