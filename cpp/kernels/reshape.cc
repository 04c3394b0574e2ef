/*!
 * \file kernels/reshape.cc
 * \brief reshape: the same row-major bytes under another shape (e.g. a flatten before a dense).
 *
 * No attrs; the output tensor's declared shape is the new shape and must have as many elements
 * as the input.  No step runs: the planner gives the output the input's plain bytes (making a
 * plain copy first only if the input is held in a blocked layout).
 */
#include "int8.h"
#include "kernel.h"

namespace byoc_hetero {

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
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("reshape", BuildReshape, ReshapeTraits());

}  // namespace byoc_hetero
