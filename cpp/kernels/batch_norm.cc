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
 *
 * Except one case, run by a host kernel of ours: a 4-d input stored channel-blocked (nChw16c /
 * nChw8c: a DenseNet block's shared concat buffer, plan/concat_in_place.h) on an AVX-512 core.
 * There the reader is a convolution, and oneDNN 3.2's f32 convolutions there pick nhwc (brgconv;
 * DenseNet-121's profile: every 1x1 conv after a batch norm read acdb), so the oneDNN batch norm
 * (blocked in, blocked out) was followed by a reorder of the same bytes to nhwc.  The host kernel
 * does both in one pass: it reads the blocked input and writes nhwc, y = act(x * scale + shift)
 * with scale and shift per channel (BatchNormScaleShift).
 */
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief scale[c] = gamma / sqrt(var + eps), shift[c] = beta - mean * scale (in double). */
void BatchNormScaleShift(const float* gamma, const float* beta, const float* mean, const float* var, double eps,
                         int64_t channels, float* scale, float* shift) {
  for (int64_t c = 0; c < channels; ++c) {
    const double s = gamma[c] / std::sqrt(static_cast<double>(var[c]) + eps);
    scale[c] = static_cast<float>(s);
    shift[c] = static_cast<float>(beta[c] - mean[c] * s);
  }
}

/*!
 * \brief y = act(x * scale + shift) from an [N, C/B, H*W, B] (channel-blocked) input to an
 *        [N, H*W, C] (nhwc) output, parallel over pixels: each pixel reads one run of B floats
 *        per channel block and writes its C channels contiguously.
 */
template <int B>
void BlockedToNhwc(const float* src, float* dst, const float* scale, const float* shift, int64_t batch,
                   int64_t channels, int64_t pixels, bool relu) {
  const int64_t blocks = channels / B;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < batch * pixels; ++row) {
    const int64_t n = row / pixels, p = row % pixels;
    const float* in = src + n * channels * pixels + p * B;
    float* out = dst + row * channels;
    for (int64_t cb = 0; cb < blocks; ++cb) {
      const float* x = in + cb * pixels * B;
      const float* sc = scale + cb * B;
      const float* sh = shift + cb * B;
      float* y = out + cb * B;
#pragma omp simd
      for (int i = 0; i < B; ++i) {
        const float v = x[i] * sc[i] + sh[i];
        y[i] = relu && v < 0.0f ? 0.0f : v;  // NaN stays NaN, as in torch's relu
      }
    }
  }
}

/*! \brief The host kernel (see the file comment), or nullptr where oneDNN's batch norm runs. */
std::unique_ptr<Kernel> BlockedBatchNormToNhwc(const KernelContext& ctx, const memory::desc& src, double eps,
                                               bool relu) {
  const std::optional<memory::format_tag> tag = ChannelBlockedTag(src);
  if (!tag || !IsaHasAvx512()) return nullptr;
  const memory::dims dims = src.get_dims();
  const int64_t batch = dims[0], channels = dims[1], pixels = dims[2] * dims[3];
  const bool b16 = *tag == memory::format_tag::aBcd16b;
  // whole blocks only: 8 channels stored nChw16c (a conv's pick for a few channels) are padded
  if (channels % (b16 ? 16 : 8) != 0) return nullptr;
  HostFn fn = [=](const std::vector<void*>& p) {
    std::vector<float> scale(static_cast<size_t>(channels)), shift(static_cast<size_t>(channels));
    BatchNormScaleShift(static_cast<const float*>(p[1]), static_cast<const float*>(p[2]),
                        static_cast<const float*>(p[3]), static_cast<const float*>(p[4]), eps, channels,
                        scale.data(), shift.data());
    const float* x = static_cast<const float*>(p[0]);
    float* y = static_cast<float*>(p[5]);
    if (b16) {
      BlockedToNhwc<16>(x, y, scale.data(), shift.data(), batch, channels, pixels, relu);
    } else {
      BlockedToNhwc<8>(x, y, scale.data(), shift.data(), batch, channels, pixels, relu);
    }
  };
  const memory::desc plain = PlainDesc(dims), channel = PlainDesc({channels});
  auto kernel = std::make_unique<HostKernel>(ctx.where() + " (blocked -> nhwc)", "batch_norm", std::move(fn),
                                             std::vector<memory::desc>{plain, channel, channel, channel, channel},
                                             plain);
  kernel->FollowLayout(src, memory::desc(dims, memory::data_type::f32, memory::format_tag::acdb));
  return kernel;
}

}  // namespace

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
  if (auto host = BlockedBatchNormToNhwc(ctx, src, eps, act == "relu")) return host;
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
