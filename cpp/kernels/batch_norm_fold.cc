/*!
 * \file kernels/batch_norm_fold.cc
 * \brief Batch norm (inference form) folded into the preceding convolution's weight and bias.
 *
 *   scale[o]  = gamma[o] / sqrt(var[o] + epsilon)
 *   bn_fold_weight(weight, gamma, var)             -> weight[o, ...] * scale[o]
 *   bn_fold_bias(gamma, beta, mean, var, [bias])   -> (bias[o] - mean[o]) * scale[o] + beta[o]
 *
 * Host kernels over plain float32 data (scale in double).  When every input is a constant (the
 * usual case: weights bound as constants) the planner runs them once, in __init_, so the
 * convolution only ever sees the folded weight and bias; otherwise they run on every call.
 * Attrs: epsilon (required, >= 0); bn_fold_bias also has_bias (default: 5 inputs).
 */
#include <cmath>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

memory::desc Flat(int64_t n) { return PlainDesc({n}); }

void ExpectChannels(const KernelContext& ctx, size_t k, const char* name, int64_t channels) {
  if (ctx.input(k).numel() != channels) {
    ctx.Fail(std::string(name) + " must have " + std::to_string(channels) +
             " elements (one per output channel), got shape " + ShapeToString(ctx.input(k).shape));
  }
}

}  // namespace

static std::unique_ptr<Kernel> BuildBatchNormFoldWeight(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const double eps = ReadEpsilon(attrs);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(3, "weight, gamma, var");
  const auto& w = ctx.input(0).shape;
  if (w.empty()) ctx.Fail("weight must have rank >= 1");
  const int64_t channels = w[0];
  ExpectChannels(ctx, 1, "gamma", channels);
  ExpectChannels(ctx, 2, "var", channels);
  ctx.ExpectOutputShape(w);
  const int64_t inner = ctx.input(0).numel() / channels;
  HostFn fn = [channels, inner, eps](const std::vector<void*>& p) {
    const float* weight = static_cast<const float*>(p[0]);
    const float* gamma = static_cast<const float*>(p[1]);
    const float* var = static_cast<const float*>(p[2]);
    float* out = static_cast<float*>(p[3]);
    for (int64_t o = 0; o < channels; ++o) {
      const float scale = static_cast<float>(gamma[o] / std::sqrt(static_cast<double>(var[o]) + eps));
      for (int64_t i = 0; i < inner; ++i) out[o * inner + i] = weight[o * inner + i] * scale;
    }
  };
  const memory::desc wmd = PlainDesc(memory::dims(w.begin(), w.end()));
  return std::make_unique<HostKernel>(ctx.where(), "bn_fold_weight", std::move(fn),
                                      std::vector<memory::desc>{wmd, Flat(channels), Flat(channels)},
                                      wmd);
}

static std::unique_ptr<Kernel> BuildBatchNormFoldBias(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const double eps = ReadEpsilon(attrs);
  const bool has_bias = attrs.Flag("has_bias", ctx.node().inputs.size() == 5);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(has_bias ? 5 : 4, has_bias ? "gamma, beta, mean, var, bias" : "gamma, beta, mean, var");
  const int64_t channels = ctx.output().numel();
  const char* names[] = {"gamma", "beta", "mean", "var", "bias"};
  for (size_t k = 0; k < ctx.node().inputs.size(); ++k) ExpectChannels(ctx, k, names[k], channels);
  HostFn fn = [channels, eps, has_bias](const std::vector<void*>& p) {
    const float* gamma = static_cast<const float*>(p[0]);
    const float* beta = static_cast<const float*>(p[1]);
    const float* mean = static_cast<const float*>(p[2]);
    const float* var = static_cast<const float*>(p[3]);
    const float* bias = has_bias ? static_cast<const float*>(p[4]) : nullptr;
    float* out = static_cast<float*>(p[has_bias ? 5 : 4]);
    for (int64_t o = 0; o < channels; ++o) {
      const double scale = gamma[o] / std::sqrt(static_cast<double>(var[o]) + eps);
      const double b = bias ? bias[o] : 0.0;
      out[o] = static_cast<float>((b - mean[o]) * scale + beta[o]);
    }
  };
  std::vector<memory::desc> ins(has_bias ? 5 : 4, Flat(channels));
  return std::make_unique<HostKernel>(ctx.where(), "bn_fold_bias", std::move(fn), std::move(ins),
                                      Flat(channels));
}

BYOC_HETERO_REGISTER_KERNEL("bn_fold_weight", BuildBatchNormFoldWeight);
BYOC_HETERO_REGISTER_KERNEL("bn_fold_bias", BuildBatchNormFoldBias);

}  // namespace byoc_hetero
