/*!
 * \file kernels/permute.cc
 * \brief permute: out = numpy.transpose(data, axes), one oneDNN reorder.
 *
 * Attrs: axes (required; a permutation of 0..rank-1, as the codegen writes it after normalizing
 * negative axes).  The input is read through a strided view (the output's dims, the input's
 * row-major strides permuted), so the reorder is the only copy; a matmul that reads a permuted
 * value directly (its a_strides / b_strides attrs) needs no permute node at all.
 *
 * The kernel also declares its axes (Kernel::relabel_axes): the planner then usually runs no step
 * at all and hands the output the input's buffer under the permuted descriptor.  ConvNeXt's
 * permute to channels-last after a depthwise conv that writes NHWC is then free, as is the permute
 * back before the residual add (the next conv reads NHWC); the reorder below runs only where the
 * planner cannot relabel (a constant input, or a value whose storage has other dims).
 */
#include <utility>

#include "int8.h"
#include "kernel.h"

namespace byoc_hetero {

/*! \brief Row-major strides of a shape (a scalar as [1]). */
static memory::dims RowMajorStrides(const std::vector<int64_t>& shape) {
  return PlainDesc(memory::dims(shape.begin(), shape.end())).get_strides();
}

namespace {
/*! \brief The reorder, plus the axes the planner may relabel the input's storage with instead. */
class PermuteKernel : public PrimitiveKernel {
 public:
  PermuteKernel(const KernelContext& ctx, dnnl::reorder::primitive_desc pd, const OperandLayout& in,
                const OperandLayout& out, std::vector<int64_t> axes)
      : PrimitiveKernel(ctx.where(), "permute", std::move(pd), std::vector<int>{DNNL_ARG_FROM},
                        std::vector<OperandLayout>{in}, out) {
    relabel_axes_ = std::move(axes);
  }
};
}  // namespace

static std::unique_ptr<Kernel> BuildPermute(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  ctx.ExpectInputCount(1, "data");
  const auto& in = ctx.input(0).shape;
  const std::vector<int64_t> axes = attrs.Ints("axes", in.size(), {});
  attrs.CheckNoUnknown();
  std::vector<bool> seen(in.size(), false);
  for (int64_t a : axes) {
    if (a < 0 || a >= static_cast<int64_t>(in.size()) || seen[a]) {
      attrs.Fail("axes", "expected a permutation of 0.." + std::to_string(in.size()) + "-1, got " +
                             ShapeToString(axes));
    }
    seen[a] = true;
  }
  if (in.empty()) ctx.Fail("cannot permute a scalar");
  const memory::dims in_strides = RowMajorStrides(in);
  memory::dims dims(in.size()), strides(in.size());
  for (size_t i = 0; i < axes.size(); ++i) {
    dims[i] = in[axes[i]];
    strides[i] = in_strides[axes[i]];
  }
  ctx.ExpectOutputShape(std::vector<int64_t>(dims.begin(), dims.end()));
  // 8-bit values (ops/qdq_views.py moves permutes there): the same reorder on bytes
  const bool int8 = IsInt8(ctx.input(0).dtype);
  if (int8 && ctx.output().dtype != ctx.input(0).dtype) {
    ctx.Fail(std::string("input is ") + DTypeName(ctx.input(0).dtype) + " but output is " +
             DTypeName(ctx.output().dtype) + "; a permute keeps the dtype");
  }
  const memory::data_type type = int8 ? DnnlType(ctx.input(0).dtype) : memory::data_type::f32;
  const memory::desc view = WithType(StridedDesc(dims, strides), type);
  const memory::desc out = WithType(PlainDesc(dims), type);
  // bf16 region: a bf16-stored input is read as bf16 and the output written as bf16 where its
  // readers round it anyway (OutputOnlyFeedsBf16Convs: attention's heads merged before the output
  // dense); the reorder converts when the two differ.  A relabel keeps the input's storage type.
  const bool bf16_in = !ctx.input_storage.empty() && ctx.input_storage[0].get_data_type() == memory::data_type::bf16;
  const memory::desc src = bf16_in ? WithType(view, memory::data_type::bf16) : view;
  const memory::desc dst = int8 ? out : Bf16OutputIfRounded(ctx, out);
  dnnl::reorder::primitive_desc pd(ctx.engine, src, ctx.engine, dst, ctx.MakeAttr());
  return std::make_unique<PermuteKernel>(ctx, std::move(pd), OperandLayout{view, src}, OperandLayout{out, dst}, axes);
}

/*! \brief bf16 region: a bf16 -> bf16 reorder when the output is stored bf16 (no number changes). */
static KernelTraits PermuteTraits() {
  KernelTraits traits;
  traits.bf16_input = Bf16ReadLikeOutput;
  traits.accepts_int8 = true;  // moves bytes of any dtype
  traits.strided_input = StridedPassesOn;  // the output views the input's bytes (planned as a view)
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("permute", BuildPermute, PermuteTraits());

}  // namespace byoc_hetero
