/*!
 * \file kernels/conv2d.cc
 * \brief conv2d: act(conv(data NCHW, weight OIHW) + bias), one oneDNN convolution_forward.
 *
 * Attrs: strides [sh, sw] (default [1, 1]), padding [top, left, bottom, right] (default 0),
 * dilation [dh, dw] (1 = dense, default [1, 1]), groups (default 1), has_bias 0/1 (default:
 * whether a third input is present), and the epilogue (post-ops, in this order): activation
 * (+ clip), residual 0/1 (the last input is added: a sum post-op), post_activation (+ post_clip).
 * Inputs: data, weight, [bias], [residual].
 *
 * conv1d runs here too: rank-3 data [N, C, W] and weight [O, I, K] are read as [N, C, 1, W] and
 * [O, I, 1, K] (the same bytes), with a unit height in the attrs (strides [1, s], padding
 * [0, l, 0, r], dilation [1, d]); its output is rank 3 [N, O, OW].
 *
 * conv3d too: rank-5 data [N, C, D, H, W] and weight [O, I, KD, KH, KW], every spatial attr with
 * three entries (padding [front, top, left, back, bottom, right]); CheckConvGeometry checks the
 * shapes over either spatial rank, and BuildConv3D makes oneDNN's direct 3-D convolution (the 2-D
 * layout picks, Winograd and int8 below are 2-D only).
 */
#include <tvm/ffi/container/array.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "int8.h"
#include "kernel.h"
#include "winograd.h"

namespace byoc_hetero {

/*!
 * \brief Whether node ctx's output is read only by one concat (an op joining its inputs,
 *        KernelTraits::joins_inputs_along) along the channels of a batch-1 tensor (Inception
 *        branches, DenseNet's new features): then the planner can let the conv write its slice of
 *        the concat's buffer in place, if the conv writes a layout whose channel slices are
 *        contiguous (channel-blocked; oneDNN's own pick on AVX-512, NHWC, is not).
 */
static bool OutputFeedsOneChannelConcat(const KernelContext& ctx) {
  const RegionGraph& g = ctx.graph;
  const int t = ctx.node().output;
  if (std::find(g.outputs.begin(), g.outputs.end(), t) != g.outputs.end() || ctx.output().shape[0] != 1) return false;
  int reads = 0;
  bool concat = false;
  for (size_t n = ctx.node_index + 1; n < g.nodes.size(); ++n) {
    for (int in : g.nodes[n].inputs) {
      if (in != t) continue;
      ++reads;
      concat = FindKernelTraits(g.nodes[n].op).JoinAxis(g.nodes[n]).value_or(-1) == 1;
    }
  }
  return reads == 1 && concat;
}

/*! \brief Whether every node reading ctx's output is a permute to channels-last ([0, 2, 3, 1]),
 *         and something reads it (ConvNeXt's depthwise conv before its layer norm). */
static bool OutputOnlyPermutedToChannelsLast(const KernelContext& ctx) {
  const RegionGraph& g = ctx.graph;
  const int t = ctx.node().output;
  if (std::find(g.outputs.begin(), g.outputs.end(), t) != g.outputs.end()) return false;
  bool read = false;
  for (size_t n = ctx.node_index + 1; n < g.nodes.size(); ++n) {
    for (int in : g.nodes[n].inputs) {
      if (in != t) continue;
      if (g.nodes[n].op != "permute") return false;
      auto axes = g.nodes[n].attrs.find("axes");
      if (axes == g.nodes[n].attrs.end()) return false;
      const auto list = axes->second.as<tvm::ffi::Array<tvm::ffi::Any>>();
      const int64_t want[4] = {0, 2, 3, 1};
      if (!list || list->size() != 4) return false;
      for (size_t i = 0; i < 4; ++i) {
        if ((*list)[i].as<int64_t>().value_or(-1) != want[i]) return false;
      }
      read = true;
    }
  }
  return read;
}

/*! \brief Whether ctx's output is read, and read only, as the data of depthwise or 1x1 conv2ds. */
static bool OutputOnlyReadByPointwiseOrDepthwise(const KernelContext& ctx) {
  const RegionGraph& g = ctx.graph;
  const int t = ctx.node().output;
  if (std::find(g.outputs.begin(), g.outputs.end(), t) != g.outputs.end()) return false;
  bool read = false;
  for (size_t n = ctx.node_index + 1; n < g.nodes.size(); ++n) {
    const NodeInfo& node = g.nodes[n];
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      if (node.inputs[k] != t) continue;
      if (node.op != "conv2d" || k != 0 || node.inputs.size() < 2) return false;
      const auto& w = g.tensors[node.inputs[1]].shape;  // OIHW
      auto groups = node.attrs.find("groups");
      const int64_t gr = groups == node.attrs.end() ? 1 : groups->second.as<int64_t>().value_or(1);
      const bool pointwise = w.size() == 4 && w[2] == 1 && w[3] == 1 && gr == 1;
      const bool depthwise = w.size() == 4 && w[1] == 1 && gr > 1 && w[0] == gr;
      if (!pointwise && !depthwise) return false;
      read = true;
    }
  }
  return read;
}

/*!
 * \brief An int8 conv2d (int8.h): u8/s8 data, s8 OIHW weights (reordered once at __init_), f32
 *        bias, the activation as a post-op in f32, the output requantized to u8/s8 (or f32).
 *        oneDNN picks the layouts (NHWC on AVX-512 VNNI/AMX); its readers run in that layout.
 */
static std::unique_ptr<Kernel> BuildInt8Conv2D(const KernelContext& ctx, const ConvParams& p,
                                                const std::vector<int64_t>& padding, const Int8Params& q) {
  if (p.epilogue.residual != q.residual) ctx.Fail("an int8 residual needs attrs residual = 1 and sum_scale");
  const memory::data_type src_t = DnnlType(ctx.input(0).dtype), dst_t = DnnlType(ctx.output().dtype);
  const memory::dims src_dims{p.n, p.c, p.h, p.w}, dst_dims{p.n, p.k, p.oh, p.ow}, bias_dims{p.k};
  memory::dims wei_dims{p.k, p.c / p.groups, p.kh, p.kw};
  if (p.groups > 1) wei_dims = {p.groups, p.k / p.groups, p.c / p.groups, p.kh, p.kw};
  // weight scales per output channel: dims 0 (OIHW) or 0-1 (GOIHW)
  const dnnl::primitive_attr attr = MakeInt8Attr(ctx, p.epilogue, q, p.groups > 1 ? 3 : 1);
  dnnl::convolution_forward::primitive_desc pd(
      ctx.engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, AnyDesc(src_dims, src_t),
      AnyDesc(wei_dims, memory::data_type::s8), p.has_bias ? AnyDesc(bias_dims) : memory::desc(),
      AnyDesc(dst_dims, dst_t), {p.strides[0], p.strides[1]}, {p.dilation[0] - 1, p.dilation[1] - 1},
      {padding[0], padding[1]}, {padding[2], padding[3]}, attr);
  return MakeInt8AnchorKernel(ctx, "conv2d", std::move(pd), WithType(PlainDesc(src_dims), src_t),
                              WithType(PlainDesc(wei_dims), memory::data_type::s8),
                              p.has_bias ? PlainDesc(bias_dims) : memory::desc(), WithType(PlainDesc(dst_dims), dst_t), q);
}

/*! \brief A convolution's geometry, as CheckConvGeometry checked it against the node's attrs. */
struct ConvGeometry {
  memory::dims src, wei, dst, bias;  // oneDNN's dims (weights goi... with groups; a conv1d with a unit height)
  memory::dims strides, dilation, pad_begin, pad_end;  // per spatial dim; dilation in oneDNN's form (0 = dense)
  std::vector<int64_t> kernel;                         // the kernel's spatial dims
  std::vector<int64_t> out_shape;                      // the output tensor's shape (rank 3 for a conv1d)
};

/*!
 * \brief Checks node ctx's data, weight, bias and output shapes against the attrs, over the
 *        spatial dims strides.size() says (2: rank-4 data, or rank 3 read with a unit height; 3:
 *        rank-5 data) and returns the geometry the primitive is made with.
 */
static ConvGeometry CheckConvGeometry(const KernelContext& ctx, const std::vector<int64_t>& strides,
                                      const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                                      int64_t groups, bool has_bias, bool residual) {
  const size_t s = strides.size();
  // rank 3 is conv1d: the tensors are read with a unit height (the same bytes)
  const bool unit_height = s == 2 && ctx.input(0).shape.size() == 3;
  ctx.ExpectRank(0, "data", unit_height ? 3 : s + 2);
  ctx.ExpectRank(1, "weight", unit_height ? 3 : s + 2);
  if (unit_height && (strides[0] != 1 || dilation[0] != 1 || padding[0] != 0 || padding[2] != 0)) {
    ctx.Fail("a rank-3 (conv1d) conv2d needs a unit height: strides[0] = dilation[0] = 1 and no top/bottom "
             "padding, got strides " + ShapeToString(strides) + " dilation " + ShapeToString(dilation) +
             " padding " + ShapeToString(padding));
  }
  std::vector<int64_t> x = ctx.input(0).shape, w = ctx.input(1).shape;
  if (unit_height) {
    x.insert(x.begin() + 2, 1);
    w.insert(w.begin() + 2, 1);
  }
  const int64_t n = x[0], c = x[1], o = w[0];
  if (c % groups != 0 || o % groups != 0) {
    ctx.Fail("groups=" + std::to_string(groups) + " must divide both the input channels (" +
             std::to_string(c) + ") and the output channels (" + std::to_string(o) + ")");
  }
  if (w[1] != c / groups) {
    ctx.Fail("weight shape " + ShapeToString(w) + " does not match data shape " + ShapeToString(x) +
             " with groups=" + std::to_string(groups) + ": expected weight dim 1 = " + std::to_string(c / groups));
  }
  if (has_bias && ctx.input(2).numel() != o) {
    ctx.Fail("bias must have " + std::to_string(o) + " elements (one per output channel), got shape " +
             ShapeToString(ctx.input(2).shape));
  }
  ConvGeometry g{x, {o, c / groups}, {n, o}, {o}, {}, {}, {}, {}, {}, {}};
  if (groups > 1) g.wei = {groups, o / groups, c / groups};  // goi...: the same bytes as OI...
  std::vector<int64_t> extents, padded;
  for (size_t i = 0; i < s; ++i) {
    const int64_t k = w[2 + i], extent = (k - 1) * dilation[i] + 1;
    extents.push_back(extent);
    padded.push_back(x[2 + i] + padding[i] + padding[s + i]);
    g.kernel.push_back(k);
    g.wei.push_back(k);
    g.dst.push_back((padded.back() - extent) / strides[i] + 1);
    g.strides.push_back(strides[i]);
    g.dilation.push_back(dilation[i] - 1);
    g.pad_begin.push_back(padding[i]);
    g.pad_end.push_back(padding[s + i]);
  }
  for (size_t i = 0; i < s; ++i) {
    if (padded[i] < extents[i]) {
      ctx.Fail("the dilated kernel " + ShapeToString(extents) + " is larger than the padded input " +
               ShapeToString(padded));
    }
  }
  g.out_shape = unit_height ? std::vector<int64_t>{n, o, g.dst[3]} : std::vector<int64_t>(g.dst);
  ctx.ExpectOutputShape(g.out_shape);
  if (residual) ctx.ExpectInputShape(2 + has_bias, "residual", g.out_shape);
  return g;
}

/*! \brief oneDNN's direct convolution of \p g from \p src to \p dst, weights of type \p wdt (layout any). */
static dnnl::convolution_forward::primitive_desc MakeConvPd(const KernelContext& ctx, const ConvGeometry& g,
                                                            const memory::desc& src, memory::data_type wdt,
                                                            bool has_bias, const memory::desc& dst,
                                                            const Epilogue& epilogue) {
  return dnnl::convolution_forward::primitive_desc(
      ctx.engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, AnyDesc(g.wei, wdt),
      has_bias ? AnyDesc(g.bias) : memory::desc(), dst, g.strides, g.dilation, g.pad_begin, g.pad_end,
      ctx.MakeAttr(epilogue));
}

/*!
 * \brief A 3-D convolution (rank-5 data NCDHW, weight OIDHW): oneDNN's direct convolution in the
 *        layouts it picks (f32, or bf16 operands in a bf16 region), the epilogue as post-ops. The
 *        2-D layout choices and Winograd below do not apply to it; int8 is not offered.
 */
static std::unique_ptr<Kernel> BuildConv3D(const KernelContext& ctx, const ConvGeometry& g, bool has_bias,
                                           const Epilogue& epilogue, bool int8) {
  if (int8) ctx.Fail("an int8 convolution of rank-5 (3-D) data is not supported; int8 convolutions are 1-D or 2-D");
  const memory::data_type cdt = ctx.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::data_type odt = OutputOnlyFeedsBf16Convs(ctx) ? memory::data_type::bf16 : memory::data_type::f32;
  auto pd = MakeConvPd(ctx, g, AnyDesc(g.src, cdt), cdt, has_bias, AnyDesc(g.dst, odt), epilogue);
  return MakeAnchorKernel(ctx, "conv2d", std::move(pd), PlainDesc(g.src), PlainDesc(g.wei), g.bias, has_bias, g.dst,
                          epilogue);
}

/*! \brief \p pd replaced by \p make()'s primitive when oneDNN makes one and it is no reference
 *         implementation; otherwise \p pd stays (oneDNN's own pick). */
template <typename Pd, typename Make>
static void PreferJit(Pd* pd, Make make) {
  try {
    Pd other = make();
    if (std::string(other.impl_info_str()).find("ref") == std::string::npos) *pd = std::move(other);
  } catch (const dnnl::error&) {
    // no implementation for that layout
  }
}

using ConvPdMaker = std::function<dnnl::convolution_forward::primitive_desc(const memory::desc&, const memory::desc&)>;

/*! \brief The layouts a float conv's input and output take where its readers or its producer
 *         favour one over oneDNN's own pick (each kept only where a jit implementation takes it). */
static void PreferConvLayouts(const KernelContext& ctx, const ConvGeometry& geo, int64_t groups, bool residual,
                              memory::data_type odt, const ConvPdMaker& make_pd,
                              dnnl::convolution_forward::primitive_desc* pd) {
  const memory::data_type cdt = ctx.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::dims &src_dims = geo.src, &dst_dims = geo.dst;
  const int64_t c = geo.src[1], o = geo.dst[1], kh = geo.kernel[0], kw = geo.kernel[1];
  // A 1x1 or depthwise conv whose input arrives channel-blocked (e.g. nChw8c, as the stem conv
  // of a MobileNet writes it) keeps that layout for its input and output where oneDNN has a
  // jit kernel for it, rather than oneDNN's own pick (nhwc on AVX2), which would cost a reorder
  // and, measured on AVX2 in a network, runs slower than the blocked jit kernels (MobileNetV2 at
  // 2 threads: 4-5% less end to end). AVX-512 machines keep oneDNN's pick (not measured there).
  const bool one_by_one = kh == 1 && kw == 1;
  const bool depthwise = groups > 1 && groups == c && groups == o;
  if ((one_by_one || depthwise) && !IsaHasAvx512() && !ctx.bf16) {
    if (const std::optional<memory::format_tag> block = ChannelBlockedTag(ctx.InputLayout(0))) {
      // where no implementation takes that layout, oneDNN's pick stays
      PreferJit(pd, [&] {
        return make_pd(memory::desc(src_dims, memory::data_type::f32, *block),
                       memory::desc(dst_dims, memory::data_type::f32, *block));
      });
    }
  }

  // A conv whose output is only permuted to channels-last writes NHWC, so that the permute is a
  // relabel of its buffer (plan/layouts.cc, LayoutResolver::Relabel) and the layer norm after it reads it in place
  // (oneDNN's own pick on AVX-512 is NHWC already; elsewhere it may be channel-blocked, which
  // would cost a reorder to plain).
  if (!ctx.bf16 && !dnnl::memory::desc(pd->dst_desc()).is_zero() &&
      pd->dst_desc() != memory::desc(dst_dims, memory::data_type::f32, memory::format_tag::acdb) &&
      OutputOnlyPermutedToChannelsLast(ctx)) {
    // where no implementation writes NHWC, oneDNN's pick stays (the consumer reorders once)
    PreferJit(pd, [&] {
      return make_pd(AnyDesc(src_dims), memory::desc(dst_dims, memory::data_type::f32, memory::format_tag::acdb));
    });
  }
  // bf16: a conv whose bf16 output only depthwise and 1x1 convs read writes NHWC, the layout those
  // convs' bf16 kernels (brgconv_1x1, jit_dw, brdgmm_dw) read on AVX-512, where oneDNN's own pick
  // for a conv with few input channels is channel-blocked and cost a relayout per call
  // (EfficientNet-B0's stem, 3 -> 32 channels at 112x112 feeding a depthwise conv: region input
  // reorder 6 us + conv 78 us + aBcd16b -> acdb relayout 38 us, vs 27 us (the input reorder to
  // NHWC) + 79 us; 2 threads, Zen 5).
  if (ctx.bf16 && odt == memory::data_type::bf16 &&
      pd->dst_desc() != memory::desc(dst_dims, odt, memory::format_tag::acdb) && OutputOnlyReadByPointwiseOrDepthwise(ctx)) {
    // where no implementation writes NHWC, oneDNN's pick stays (the readers relayout once)
    PreferJit(pd, [&] { return make_pd(AnyDesc(src_dims, cdt), memory::desc(dst_dims, odt, memory::format_tag::acdb)); });
  }
  // A conv feeding a channel concat writes channel blocks, whole ones (the planner then puts its
  // output straight into the concat's buffer: no copy; on AVX-512 oneDNN's jit convolution for
  // nChw16c, instead of brgconv for NHWC plus a reorder and a concat copy per input).
  const int64_t block = IsaHasAvx512() ? 16 : 8;
  if (!ctx.bf16 && o % block == 0 && !residual && OutputFeedsOneChannelConcat(ctx)) {
    // where no implementation writes that layout, oneDNN's pick stays (the concat copies)
    PreferJit(pd, [&] {
      return make_pd(AnyDesc(src_dims), memory::desc(dst_dims, memory::data_type::f32,
                                                     block == 16 ? memory::format_tag::aBcd16b : memory::format_tag::aBcd8b));
    });
  }
}

static std::unique_ptr<Kernel> BuildConv2D(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  // the spatial dims the attrs describe: 3 for rank-5 data (a 3-D convolution), else 2
  const size_t s = ctx.input(0).shape.size() == 5 ? 3 : 2;
  const std::vector<int64_t> strides = attrs.Ints("strides", s, std::vector<int64_t>(s, 1));
  const std::vector<int64_t> padding = attrs.Ints("padding", 2 * s, std::vector<int64_t>(2 * s, 0));
  const std::vector<int64_t> dilation = attrs.Ints("dilation", s, std::vector<int64_t>(s, 1));
  const int64_t groups = attrs.Int("groups", 1);
  const Epilogue epilogue = ctx.ReadEpilogue(attrs);
  const size_t base = ctx.node().inputs.size() - (epilogue.residual ? 1 : 0);
  const bool has_bias = attrs.Flag("has_bias", base == 3);
  // which algorithm: "auto" (the measured thresholds of winograd.cc), or a tuner's decision
  const std::string algo = attrs.Choice("algo", {"auto", "direct", "winograd"}, "auto");
  ReadNodePrecision(ctx, attrs);  // validated; ctx.bf16 holds what it means here
  const Int8Params int8 = ReadInt8Params(ctx, attrs, ctx.input(1).shape.empty() ? 1 : ctx.input(1).shape[0]);
  attrs.CheckNoUnknown();

  for (size_t i = 0; i < s; ++i) {
    if (strides[i] < 1) attrs.Fail("strides", "must be >= 1, got " + ShapeToString(strides));
    if (dilation[i] < 1) attrs.Fail("dilation", "must be >= 1 (1 = dense), got " + ShapeToString(dilation));
  }
  for (size_t i = 0; i < 2 * s; ++i) {
    if (padding[i] < 0) attrs.Fail("padding", "must be >= 0, got " + ShapeToString(padding));
  }
  if (groups < 1) attrs.Fail("groups", "must be >= 1, got " + std::to_string(groups));

  ctx.ExpectInputCount(2 + has_bias + epilogue.residual,
                       std::string(has_bias ? "data, weight, bias" : "data, weight") +
                           (epilogue.residual ? ", residual" : ""));
  const ConvGeometry geo = CheckConvGeometry(ctx, strides, padding, dilation, groups, has_bias, epilogue.residual);
  if (s == 3) return BuildConv3D(ctx, geo, has_bias, epilogue, int8.enabled);
  const int64_t n = geo.src[0], c = geo.src[1], h = geo.src[2], wd = geo.src[3], o = geo.dst[1];
  const int64_t kh = geo.kernel[0], kw = geo.kernel[1], oh = geo.dst[2], ow = geo.dst[3];

  const ConvParams params{n,  c,  h,          wd,         o,      kh,      kw,       oh,
                          ow, padding[0], padding[1], groups, strides, dilation, has_bias, epilogue, algo};
  if (int8.enabled) return BuildInt8Conv2D(ctx, params, padding, int8);
  // bf16: the direct convolution reads bf16 data and weights (converted once at __init_) and
  // accumulates in f32; Winograd stays f32-only (its transforms would add bf16 rounding on top),
  // so bf16 regions use the direct convolution, which is also faster: the bf16 direct conv took
  // 0.3-0.7x our f32 Winograd's time on ResNet's 3x3 layers (64@56, 128@28, 256@14, 512@7;
  // bench/BF16.md "Winograd"), so no per-layer pick is needed.
  if (!ctx.bf16) {
    if (std::unique_ptr<Kernel> winograd = TryBuildWinogradConv2D(ctx, params)) return winograd;
  }
  const memory::data_type cdt = ctx.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::dims &src_dims = geo.src, &dst_dims = geo.dst, &wei_dims = geo.wei, &bias_dims = geo.bias;
  auto make_pd = [&](const memory::desc& src, const memory::desc& dst) {
    return MakeConvPd(ctx, geo, src, cdt, has_bias, dst, epilogue);
  };
  // The epilogue is applied in f32 either way. The output is written bf16 where every reader
  // rounds it to bf16 anyway, or reads it as a conv residual into a bf16 output (a bf16 residual
  // stream: OutputOnlyFeedsBf16Convs), saving a reorder per edge; else f32 (pooling averages,
  // normalizations, eltwise, region outputs read it as before).
  const memory::data_type odt = OutputOnlyFeedsBf16Convs(ctx) ? memory::data_type::bf16 : memory::data_type::f32;
  dnnl::convolution_forward::primitive_desc pd = make_pd(AnyDesc(src_dims, cdt), AnyDesc(dst_dims, odt));
  PreferConvLayouts(ctx, geo, groups, epilogue.residual, odt, make_pd, &pd);

  return MakeAnchorKernel(ctx, "conv2d", std::move(pd), PlainDesc(src_dims), PlainDesc(wei_dims), bias_dims, has_bias,
                          dst_dims, epilogue);
}

/*! \brief Whether input k of \p node is its residual (its last input, a sum post-op). */
static bool IsConvResidual(const NodeInfo& node, size_t k) {
  if (k + 1 != node.inputs.size() || k < 2) return false;
  auto it = node.attrs.find("residual");
  if (it == node.attrs.end()) return false;
  const tvm::ffi::Any& v = it->second;  // 0/1 or false/true, as AttrReader::Flag reads it
  if (v.type_index() == tvm::ffi::TypeIndex::kTVMFFIBool) return v.cast<bool>();
  return v.type_index() == tvm::ffi::TypeIndex::kTVMFFIInt && v.cast<int64_t>() == 1;
}

/*!
 * \brief bf16 region: the data is rounded to bf16; the residual is stored bf16 when the output is
 *        (a bf16 residual stream: the sum post-op adds the rounded residual to the f32
 *        accumulator, then rounds once, as OpenVINO's bf16 ResNet does; the bound is
 *        tests/test_bf16.py's); weights and bias stay f32 (constants, converted at __init_).
 */
static Bf16Read Conv2DBf16Input(const NodeInfo& node, size_t k) {
  if (k == 0) return Bf16Read::kRounds;
  return IsConvResidual(node, k) ? Bf16Read::kLikeOutput : Bf16Read::kF32;
}

static KernelTraits Conv2DTraits() {
  KernelTraits traits;
  traits.bf16_input = Conv2DBf16Input;
  traits.accepts_int8 = true;  // u8/s8 data x s8 weights (int8.cc)
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("conv2d", BuildConv2D, Conv2DTraits());

}  // namespace byoc_hetero
