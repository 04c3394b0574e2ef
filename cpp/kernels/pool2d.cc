/*!
 * \file kernels/pool2d.cc
 * \brief pool2d: max / average pooling over NCHW data, or NCDHW (3-D pooling: every spatial attr
 *        then has 3 entries, padding 6), one oneDNN pooling_forward.
 *
 * Attrs: algorithm "max" | "avg_include_padding" | "avg_exclude_padding" (required),
 * kernel [kh, kw] (required), strides [sh, sw] (default [1, 1]), padding [top, left, bottom, right]
 * (default 0), dilation [dh, dw] (1 = dense, default [1, 1]), ceil_mode 0/1 (default 0: output
 * size rounds down; 1: rounds up, the extra windows reaching past the bottom/right padding).
 * Global average pooling is kernel = [H, W].  The op reads its input in whatever layout the
 * producer wrote (e.g. oneDNN's blocked layout after a conv) and writes the same layout.
 */
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "int8.h"
#include "kernel.h"

namespace byoc_hetero {

/*! \brief The window geometry of one pooling, per spatial dim, as PoolWindows checked it. */
struct PoolWindows {
  memory::dims out, pad_end;  // output sizes; the end padding oneDNN needs for them (ceil_mode adds some)
};

/*!
 * \brief Checks the windows of node ctx over the spatial dims of \p in (kernel.size() of them)
 *        and returns the output sizes and end paddings (oneDNN wants
 *        (in + pad_begin + pad_end - extent) / stride + 1 == out exactly).
 */
static PoolWindows CheckPoolWindows(const KernelContext& ctx, const std::vector<int64_t>& in,
                                    const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                                    const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation,
                                    bool ceil_mode, bool include_padding) {
  const size_t s = kernel.size();
  PoolWindows win;
  for (size_t i = 0; i < s; ++i) {
    const int64_t extent = (kernel[i] - 1) * dilation[i] + 1;
    const int64_t span = in[i] + padding[i] + padding[i + s] - extent;
    if (span < 0) {
      ctx.Fail("the dilated window (" + std::to_string(extent) + ") is larger than the padded input (" +
               std::to_string(in[i] + padding[i] + padding[i + s]) + ")");
    }
    const int64_t floor_out = span / strides[i] + 1;
    const int64_t out = ceil_mode ? (span + strides[i] - 1) / strides[i] + 1 : floor_out;
    if (ceil_mode && out != floor_out && include_padding) {
      ctx.Fail("ceil_mode with avg_include_padding changes the output size; not supported");
    }
    const int64_t pad_end = std::max((out - 1) * strides[i] + extent - in[i] - padding[i], padding[i + s]);
    if (padding[i] >= extent || pad_end >= extent) {
      ctx.Fail("padding " + ShapeToString(padding) + (ceil_mode ? " (with ceil_mode)" : "") +
               " would put a whole pooling window of extent " + std::to_string(extent) + " in the padding");
    }
    win.out.push_back(out);
    win.pad_end.push_back(pad_end);
  }
  return win;
}

static std::unique_ptr<Kernel> BuildPool2D(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const std::string alg_name = attrs.Choice("algorithm", EnumNamesOf(PoolAlgorithms()), "");
  // the spatial dims the attrs describe: 3 for rank-5 data (NCDHW), else 2
  const size_t s = ctx.input(0).shape.size() == 5 ? 3 : 2;
  if (!attrs.Has("kernel")) attrs.Fail("kernel", s == 3 ? "missing (required, [kd, kh, kw])" : "missing (required, [kh, kw])");
  const std::vector<int64_t> kernel = attrs.Ints("kernel", s, {});
  const std::vector<int64_t> strides = attrs.Ints("strides", s, std::vector<int64_t>(s, 1));
  const std::vector<int64_t> padding = attrs.Ints("padding", 2 * s, std::vector<int64_t>(2 * s, 0));
  const std::vector<int64_t> dilation = attrs.Ints("dilation", s, std::vector<int64_t>(s, 1));
  const bool ceil_mode = attrs.Flag("ceil_mode", false);
  attrs.CheckNoUnknown();
  for (size_t i = 0; i < s; ++i) {
    if (kernel[i] < 1) attrs.Fail("kernel", "must be >= 1, got " + ShapeToString(kernel));
    if (strides[i] < 1) attrs.Fail("strides", "must be >= 1, got " + ShapeToString(strides));
    if (dilation[i] < 1) attrs.Fail("dilation", "must be >= 1 (1 = dense), got " + ShapeToString(dilation));
  }
  for (size_t i = 0; i < 2 * s; ++i) {
    if (padding[i] < 0) attrs.Fail("padding", "must be >= 0, got " + ShapeToString(padding));
  }

  ctx.ExpectInputCount(1, "data");
  ctx.ExpectRank(0, "data", s + 2);
  const auto& x = ctx.input(0).shape;
  const PoolWindows win = CheckPoolWindows(ctx, std::vector<int64_t>(x.begin() + 2, x.end()), kernel, strides,
                                           padding, dilation, ceil_mode, alg_name == "avg_include_padding");
  memory::dims dst_dims{x[0], x[1]};
  dst_dims.insert(dst_dims.end(), win.out.begin(), win.out.end());
  ctx.ExpectOutputShape(dst_dims);
  memory::dims dilation_m1, pad_begin(padding.begin(), padding.begin() + s);
  for (int64_t d : dilation) dilation_m1.push_back(d - 1);

  const dnnl::algorithm alg = *FindEnum(PoolAlgorithms(), alg_name);
  // uint8 / int8 data (a pool between a dequantize and a quantize of one scale, docs/int8.md)
  // pools the 8-bit values themselves and writes the same type
  const bool int8 = IsInt8(ctx.input(0).dtype);
  const memory::data_type qdt = DnnlType(ctx.input(0).dtype);
  if (ctx.output().dtype != ctx.input(0).dtype) {
    ctx.Fail(std::string("the output must have the data's dtype ") + DTypeName(ctx.input(0).dtype));
  }
  memory::desc src = ctx.InputLayout(0);
  if (int8 && src.get_data_type() != qdt) src = WithType(src, qdt);
  auto make = [&](memory::data_type dt) {
    return dnnl::pooling_forward::primitive_desc(
        ctx.engine, dnnl::prop_kind::forward_inference, alg, src, AnyDesc(dst_dims, dt), strides, kernel,
        dilation_m1, pad_begin, win.pad_end, ctx.MakeAttr());
  };
  // dst bf16 where every reader rounds it to bf16 anyway (OutputOnlyFeedsBf16Convs: a max pool
  // between convs, a squeeze-excitation's global pool before its first 1x1 conv), else f32. A
  // bf16 src reaches here only in a bf16 region where the producer stored it so (kernel.cc).
  // oneDNN 3.2 has jit pooling for mixed f32 / bf16 src and dst on avx512_core_bf16; where it
  // has none (or only a reference kernel), the dst keeps the src's type.
  const memory::data_type src_dt = src.get_data_type();
  const memory::data_type want = int8                           ? qdt
                                 : OutputOnlyFeedsBf16Convs(ctx) ? memory::data_type::bf16
                                                                 : memory::data_type::f32;
  std::optional<dnnl::pooling_forward::primitive_desc> mixed;
  if (want != src_dt) {
    try {
      mixed = make(want);
      if (std::string(mixed->impl_info_str()).find("ref") != std::string::npos) mixed.reset();
    } catch (const dnnl::error&) {
      mixed.reset();
    }
  }
  dnnl::pooling_forward::primitive_desc pd = mixed ? std::move(*mixed) : make(src_dt);
  const memory::data_type view_dt = int8 ? qdt : memory::data_type::f32;
  std::vector<OperandLayout> inputs{{WithType(PlainDesc(src.get_dims()), view_dt), pd.src_desc()}};
  OperandLayout output{WithType(PlainDesc(dst_dims), view_dt), pd.dst_desc()};
  return std::make_unique<PrimitiveKernel>(ctx.where(), "pool2d", std::move(pd),
                                           std::vector<int>{DNNL_ARG_SRC}, std::move(inputs),
                                           std::move(output));
}

/*!
 * \brief bf16 region: the input is stored bf16 when the output is.  max: exact (the max of rounded
 *        values is the rounded max); average: the mean of rounded values, rounded again (a
 *        squeeze-excitation's global pool, EfficientNet's pooler).
 */
static KernelTraits Pool2DTraits() {
  KernelTraits traits;
  traits.bf16_input = Bf16ReadLikeOutput;
  traits.accepts_int8 = true;  // pools 8-bit values between a dequantize and a quantize of one scale
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("pool2d", BuildPool2D, Pool2DTraits());

}  // namespace byoc_hetero
