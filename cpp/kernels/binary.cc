/*!
 * \file kernels/binary.cc
 * \brief binary: elementwise add / multiply with numpy broadcasting (one oneDNN binary), with an
 *        optional activation fused as a post-op.
 *
 * Attrs: algorithm "add" | "mul" (required), activation (+ clip) (default "none").  The output
 * shape is the broadcast of the two input shapes, and one of the inputs must already have that
 * shape (oneDNN broadcasts only its second source; add and mul commute, so either input may be
 * the broadcast one).  The full-shape input is read in its producer's layout.
 */
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildBinary(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const std::string alg_name = attrs.Choice("algorithm", EnumNamesOf(BinaryAlgorithms()), "");
  Epilogue epilogue;
  epilogue.act = ctx.ReadActivation(attrs);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(2, "a, b");

  const auto& a = ctx.input(0).shape;
  const auto& b = ctx.input(1).shape;
  const size_t rank = std::max<size_t>(1, std::max(a.size(), b.size()));
  auto align = [&](const std::vector<int64_t>& s) {
    std::vector<int64_t> out(rank - s.size(), 1);
    out.insert(out.end(), s.begin(), s.end());
    return out;
  };
  const std::vector<int64_t> as = align(a), bs = align(b);
  std::vector<int64_t> out_shape(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (as[i] != bs[i] && as[i] != 1 && bs[i] != 1) {
      ctx.Fail("shapes " + ShapeToString(a) + " and " + ShapeToString(b) + " do not broadcast");
    }
    out_shape[i] = std::max(as[i], bs[i]);
  }
  ctx.ExpectOutputShape(a.empty() && b.empty() ? std::vector<int64_t>{} : out_shape);
  size_t full;
  if (as == out_shape) {
    full = 0;
  } else if (bs == out_shape) {
    full = 1;
  } else {
    ctx.Fail("one input must have the output shape " + ShapeToString(out_shape) + ", got " +
             ShapeToString(a) + " and " + ShapeToString(b) +
             " (broadcasting both inputs is not supported)");
  }
  const size_t other = 1 - full;
  const memory::dims dst_dims(out_shape.begin(), out_shape.end());
  // the full-shape input in its producer's layout (when it has the output's rank)
  const memory::desc src0 =
      ctx.input(full).shape.size() == rank ? ctx.InputLayout(full) : PlainDesc(dst_dims);
  const std::vector<int64_t>& os = full == 0 ? bs : as;
  const memory::dims other_dims(os.begin(), os.end());
  const memory::desc src1 = other_dims == dst_dims ? src0 : PlainDesc(other_dims);

  dnnl::binary::primitive_desc pd(
      ctx.engine, *FindEnum(BinaryAlgorithms(), alg_name),
      src0, src1, AnyDesc(dst_dims), ctx.MakeAttr(epilogue));
  std::vector<OperandLayout> inputs(2);
  std::vector<int> args(2);
  inputs[full] = {PlainDesc(dst_dims), pd.src0_desc()};
  args[full] = DNNL_ARG_SRC_0;
  inputs[other] = {PlainDesc(other_dims), pd.src1_desc()};
  args[other] = DNNL_ARG_SRC_1;
  OperandLayout output{PlainDesc(dst_dims), pd.dst_desc()};
  return std::make_unique<PrimitiveKernel>(ctx.where(), "binary", std::move(pd), std::move(args),
                                           std::move(inputs), std::move(output));
}

BYOC_HETERO_REGISTER_KERNEL("binary", BuildBinary);

}  // namespace byoc_hetero
