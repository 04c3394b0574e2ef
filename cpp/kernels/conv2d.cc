/*!
 * \file kernels/conv2d.cc
 * \brief conv2d: act(conv(data NCHW, weight OIHW) + bias), one oneDNN convolution_forward.
 *
 * Attrs: strides [sh, sw] (default [1, 1]), padding [top, left, bottom, right] (default 0),
 * dilation [dh, dw] (1 = dense, default [1, 1]), groups (default 1), has_bias 0/1 (default:
 * whether a third input is present), and the epilogue (post-ops, in this order): activation
 * (+ clip), residual 0/1 (the last input is added: a sum post-op), post_activation (+ post_clip).
 * Inputs: data, weight, [bias], [residual].
 */
#include <optional>
#include <string>
#include <utility>

#include "kernel.h"
#include "winograd.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildConv2D(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const std::vector<int64_t> strides = attrs.Ints("strides", 2, {1, 1});
  const std::vector<int64_t> padding = attrs.Ints("padding", 4, {0, 0, 0, 0});
  const std::vector<int64_t> dilation = attrs.Ints("dilation", 2, {1, 1});
  const int64_t groups = attrs.Int("groups", 1);
  const Epilogue epilogue = ctx.ReadEpilogue(attrs);
  const size_t base = ctx.node().inputs.size() - (epilogue.residual ? 1 : 0);
  const bool has_bias = attrs.Flag("has_bias", base == 3);
  attrs.CheckNoUnknown();

  for (int i = 0; i < 2; ++i) {
    if (strides[i] < 1) attrs.Fail("strides", "must be >= 1, got " + ShapeToString(strides));
    if (dilation[i] < 1) attrs.Fail("dilation", "must be >= 1 (1 = dense), got " + ShapeToString(dilation));
  }
  for (int i = 0; i < 4; ++i) {
    if (padding[i] < 0) attrs.Fail("padding", "must be >= 0, got " + ShapeToString(padding));
  }
  if (groups < 1) attrs.Fail("groups", "must be >= 1, got " + std::to_string(groups));

  ctx.ExpectInputCount(2 + has_bias + epilogue.residual,
                       std::string(has_bias ? "data, weight, bias" : "data, weight") +
                           (epilogue.residual ? ", residual" : ""));
  ctx.ExpectRank(0, "data", 4);
  ctx.ExpectRank(1, "weight", 4);
  const auto& x = ctx.input(0).shape;
  const auto& w = ctx.input(1).shape;
  const int64_t n = x[0], c = x[1], h = x[2], wd = x[3];
  const int64_t o = w[0], kh = w[2], kw = w[3];
  if (c % groups != 0 || o % groups != 0) {
    ctx.Fail("groups=" + std::to_string(groups) + " must divide both the input channels (" +
             std::to_string(c) + ") and the output channels (" + std::to_string(o) + ")");
  }
  if (w[1] != c / groups) {
    ctx.Fail("weight shape " + ShapeToString(w) + " does not match data shape " + ShapeToString(x) +
             " with groups=" + std::to_string(groups) + ": expected weight dim 1 = " +
             std::to_string(c / groups));
  }
  if (has_bias && ctx.input(2).numel() != o) {
    ctx.Fail("bias must have " + std::to_string(o) + " elements (one per output channel), got shape " +
             ShapeToString(ctx.input(2).shape));
  }
  const int64_t eff_kh = (kh - 1) * dilation[0] + 1, eff_kw = (kw - 1) * dilation[1] + 1;
  const int64_t ph = h + padding[0] + padding[2] - eff_kh;
  const int64_t pw = wd + padding[1] + padding[3] - eff_kw;
  if (ph < 0 || pw < 0) {
    ctx.Fail("the dilated kernel (" + std::to_string(eff_kh) + "x" + std::to_string(eff_kw) +
             ") is larger than the padded input (" + std::to_string(h + padding[0] + padding[2]) +
             "x" + std::to_string(wd + padding[1] + padding[3]) + ")");
  }
  const int64_t oh = ph / strides[0] + 1, ow = pw / strides[1] + 1;
  ctx.ExpectOutputShape({n, o, oh, ow});
  const size_t residual_index = 2 + has_bias;
  if (epilogue.residual) ctx.ExpectInputShape(residual_index, "residual", {n, o, oh, ow});

  const ConvParams params{n,  c,  h,          wd,         o,      kh,      kw,       oh,
                          ow, padding[0], padding[1], groups, strides, dilation, has_bias, epilogue};
  // bf16: the direct convolution reads bf16 data and weights (converted once at __init_) and
  // accumulates in f32; Winograd stays f32-only (its transforms would add bf16 rounding on top),
  // so bf16 regions use the direct convolution, which is also faster: the bf16 direct conv took
  // 0.3-0.7x our f32 Winograd's time on ResNet's 3x3 layers (64@56, 128@28, 256@14, 512@7;
  // bench/BF16.md "Winograd"), so no per-layer pick is needed.
  if (!ctx.bf16) {
    if (std::unique_ptr<Kernel> winograd = TryBuildWinogradConv2D(ctx, params)) return winograd;
  }
  const memory::data_type cdt = ctx.bf16 ? memory::data_type::bf16 : memory::data_type::f32;

  const memory::dims src_dims{n, c, h, wd}, dst_dims{n, o, oh, ow}, bias_dims{o};
  memory::dims wei_dims{o, c / groups, kh, kw};
  if (groups > 1) wei_dims = {groups, o / groups, c / groups, kh, kw};  // goihw: same bytes as OIHW

  auto make_pd = [&](const memory::desc& src, const memory::desc& dst) {
    return dnnl::convolution_forward::primitive_desc(
        ctx.engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src,
        AnyDesc(wei_dims, cdt), has_bias ? AnyDesc(bias_dims) : memory::desc(), dst, {strides[0], strides[1]},
        {dilation[0] - 1, dilation[1] - 1}, {padding[0], padding[1]}, {padding[2], padding[3]},
        ctx.MakeAttr(epilogue));
  };
  // The epilogue is applied in f32 either way. The output is written bf16 where every reader
  // rounds it to bf16 anyway, or reads it as a conv residual into a bf16 output (a bf16 residual
  // stream: OutputOnlyFeedsBf16Convs), saving a reorder per edge; else f32 (pooling averages,
  // normalizations, eltwise, region outputs read it as before).
  const memory::data_type odt = OutputOnlyFeedsBf16Convs(ctx) ? memory::data_type::bf16 : memory::data_type::f32;
  dnnl::convolution_forward::primitive_desc pd = make_pd(AnyDesc(src_dims, cdt), AnyDesc(dst_dims, odt));
  // A 1x1 or depthwise conv whose input arrives channel-blocked (e.g. nChw8c, as the stem conv
  // of a MobileNet writes it) keeps that layout for its input and output where oneDNN has a
  // jit kernel for it, rather than oneDNN's own pick (nhwc on AVX2), which would cost a reorder
  // and, measured on AVX2 in a network, runs slower than the blocked jit kernels (MobileNetV2 at
  // 2 threads: 4-5% less end to end). AVX-512 machines keep oneDNN's pick (not measured there).
  const bool one_by_one = kh == 1 && kw == 1;
  const bool depthwise = groups > 1 && groups == c && groups == o;
  if ((one_by_one || depthwise) && !IsaHasAvx512() && !ctx.bf16) {
    if (const std::optional<memory::format_tag> block = ChannelBlockedTag(ctx.InputLayout(0))) {
      try {
        auto blocked = make_pd(memory::desc(src_dims, memory::data_type::f32, *block),
                               memory::desc(dst_dims, memory::data_type::f32, *block));
        if (std::string(blocked.impl_info_str()).find("ref") == std::string::npos) pd = std::move(blocked);
      } catch (const dnnl::error&) {
        // no implementation for that layout: keep oneDNN's pick
      }
    }
  }

  return MakeAnchorKernel(ctx, "conv2d", std::move(pd), PlainDesc(src_dims), PlainDesc(wei_dims), bias_dims, has_bias,
                          dst_dims, epilogue);
}

BYOC_HETERO_REGISTER_KERNEL("conv2d", BuildConv2D);

}  // namespace byoc_hetero
