/*!
 * \file kernels/softmax.cc
 * \brief softmax along one axis (one oneDNN softmax_forward, accurate algorithm).
 *
 * Attrs: axis (default -1; negative counts from the end).  Any rank; runs on plain data.
 */
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildSoftmax(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  int64_t axis = attrs.Int("axis", -1);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  const auto& shape = ctx.input(0).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (axis < -rank || axis >= rank) {
    attrs.Fail("axis", "out of range for data of rank " + std::to_string(rank) + ": " + std::to_string(axis));
  }
  if (axis < 0) axis += rank;
  ctx.ExpectOutputShape(shape);
  const memory::desc plain = PlainDesc(memory::dims(shape.begin(), shape.end()));
  // Written f32 even in a bf16 region whose P @ V matmul rounds it anyway: oneDNN 3.2's jit softmax
  // with a bf16 destination is off by up to 2^-7 relative (1-2 bf16 ulps) from the rounded f32
  // result (measured on attention probabilities, tests/test_bf16.py), so the matmul's reorder
  // rounds it instead (to nearest even).
  dnnl::softmax_forward::primitive_desc pd(ctx.engine, dnnl::prop_kind::forward_inference,
                                           dnnl::algorithm::softmax_accurate, plain, plain,
                                           static_cast<int>(axis), ctx.MakeAttr());
  const memory::desc dst = pd.dst_desc();
  return std::make_unique<PrimitiveKernel>(ctx.where(), "softmax", std::move(pd),
                                           std::vector<int>{DNNL_ARG_SRC},
                                           std::vector<OperandLayout>{{plain, plain}},
                                           OperandLayout{plain, dst});
}

BYOC_HETERO_REGISTER_KERNEL("softmax", BuildSoftmax);

}  // namespace byoc_hetero
