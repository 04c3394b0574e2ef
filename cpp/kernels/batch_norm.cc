/*!
 * \file kernels/batch_norm.cc
 * \brief batch_norm: batch normalization in inference form on its own (not folded into a
 *        convolution), e.g. the pre-activation batch norm of DenseNet-style blocks; one oneDNN
 *        batch_normalization_forward (forward_inference, use_global_stats | use_scale | use_shift).
 *
 *   y = act(gamma[c] * (x - mean[c]) / sqrt(var[c] + epsilon) + beta[c])    c = axis 1
 *
 * Inputs: data (rank >= 2, channels on axis 1), gamma, beta, mean, var (C elements each, any
 * shape).  Attrs: epsilon (required, finite, >= 0), activation "none" | "relu" (default "none";
 * oneDNN's fuse_norm_relu flag: its batch norm takes no other post-op).  The data is read in its
 * producer's layout (oneDNN has jit kernels for nchw, nhwc and nChw16c/8c), the output keeps it.
 */
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildBatchNorm(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const double eps = ReadEpsilon(attrs);
  const std::string act = attrs.Choice("activation", {"none", "relu"}, "none");
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(5, "data, gamma, beta, mean, var");
  const auto& shape = ctx.input(0).shape;
  if (shape.size() < 2) ctx.Fail("data must have rank >= 2 (channels on axis 1), got " + ShapeToString(shape));
  ctx.ExpectOutputShape(shape);
  const int64_t channels = shape[1];
  const char* names[] = {"data", "gamma", "beta", "mean", "var"};
  for (size_t k = 1; k < 5; ++k) {
    if (ctx.input(k).numel() != channels) {
      ctx.Fail(std::string(names[k]) + " must have " + std::to_string(channels) +
               " elements (one per channel), got shape " + ShapeToString(ctx.input(k).shape));
    }
  }
  auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
               dnnl::normalization_flags::use_shift;
  if (act == "relu") flags |= dnnl::normalization_flags::fuse_norm_relu;
  const memory::desc src = ctx.InputLayout(0);
  dnnl::batch_normalization_forward::primitive_desc pd(ctx.engine, dnnl::prop_kind::forward_inference, src,
                                                       src, static_cast<float>(eps), flags, ctx.MakeAttr());
  const memory::desc channel = PlainDesc({channels});
  std::vector<OperandLayout> inputs{{PlainDesc(src.get_dims()), pd.src_desc()}};
  for (size_t k = 1; k < 5; ++k) inputs.push_back({channel, channel});
  return std::make_unique<PrimitiveKernel>(
      ctx.where(), "batch_norm", std::move(pd),
      std::vector<int>{DNNL_ARG_SRC, DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE},
      std::move(inputs), OperandLayout{PlainDesc(src.get_dims()), pd.dst_desc()});
}

BYOC_HETERO_REGISTER_KERNEL("batch_norm", BuildBatchNorm);

}  // namespace byoc_hetero
