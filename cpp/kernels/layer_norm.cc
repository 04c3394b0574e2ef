/*!
 * \file kernels/layer_norm.cc
 * \brief layer_norm: normalization over the trailing axes (one oneDNN
 *        layer_normalization_forward, forward_inference, statistics computed per row).
 *
 *   y = (x - mean(x)) / sqrt(var(x) + epsilon) * gamma + beta   over the last `axis_count` axes
 *
 * Inputs: data (rank >= 1), then gamma (with has_scale) and beta (with has_shift), each with
 * prod(trailing dims) elements in any shape.  Attrs: epsilon (required, finite, >= 0),
 * axis_count (default 1; 1 <= axis_count <= rank), has_scale / has_shift (default: 2 / 3 inputs).
 *
 * oneDNN normalizes over the last dim only, so the data is read as the plain matrix
 * [prod(leading dims), prod(trailing dims)]; a producer that wrote a blocked layout gets one plain
 * copy first (the planner's view -> want), which is also what a channels-last layer norm after a
 * permute (ConvNeXt) reads.
 */
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildLayerNorm(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const double eps = ReadEpsilon(attrs);
  const size_t n_in = ctx.node().inputs.size();
  const bool has_scale = attrs.Flag("has_scale", n_in >= 2);
  const bool has_shift = attrs.Flag("has_shift", n_in >= 3);
  const int64_t axis_count = attrs.Int("axis_count", 1);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1 + has_scale + has_shift,
                       std::string("data") + (has_scale ? ", gamma" : "") + (has_shift ? ", beta" : ""));

  const auto& shape = ctx.input(0).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank < 1) ctx.Fail("data must have rank >= 1, got a scalar");
  if (axis_count < 1 || axis_count > rank) {
    ctx.Fail("attrs.axis_count must be in [1, " + std::to_string(rank) + "] for data " +
             ShapeToString(shape) + ", got " + std::to_string(axis_count));
  }
  ctx.ExpectOutputShape(shape);
  int64_t rows = 1, cols = 1;
  for (int64_t i = 0; i < rank; ++i) (i < rank - axis_count ? rows : cols) *= shape[i];
  for (size_t k = 1; k < n_in; ++k) {
    if (ctx.input(k).numel() != cols) {
      ctx.Fail(std::string(k == 1 && has_scale ? "gamma" : "beta") + " must have " + std::to_string(cols) +
               " elements (the normalized axes' size), got shape " + ShapeToString(ctx.input(k).shape));
    }
  }
  const memory::desc plain = PlainDesc({rows, cols});
  auto flags = dnnl::normalization_flags::none;
  if (has_scale) flags |= dnnl::normalization_flags::use_scale;
  if (has_shift) flags |= dnnl::normalization_flags::use_shift;
  // Computed in f32; in a bf16 region whose readers round the result to bf16 anyway (the Q/K/V or
  // MLP denses after it), it is written as bf16 directly instead of through a reorder per reader.
  auto make = [&](const memory::desc& dst) {
    return dnnl::layer_normalization_forward::primitive_desc(ctx.engine, dnnl::prop_kind::forward_inference, plain,
                                                             dst, static_cast<float>(eps), flags, ctx.MakeAttr());
  };
  const memory::desc dst = Bf16OutputIfRounded(ctx, plain);
  dnnl::layer_normalization_forward::primitive_desc pd = TryWithType(make, dst, plain);
  std::vector<OperandLayout> inputs{{plain, plain}};
  std::vector<int> args{DNNL_ARG_SRC};
  const memory::desc channel = PlainDesc({cols});
  if (has_scale) {
    inputs.push_back({channel, channel});
    args.push_back(DNNL_ARG_SCALE);
  }
  if (has_shift) {
    inputs.push_back({channel, channel});
    args.push_back(DNNL_ARG_SHIFT);
  }
  return std::make_unique<PrimitiveKernel>(ctx.where(), "layer_norm", std::move(pd), std::move(args),
                                           std::move(inputs), OperandLayout{plain, pd.dst_desc()});
}

BYOC_HETERO_REGISTER_KERNEL("layer_norm", BuildLayerNorm);

}  // namespace byoc_hetero
