/*!
 * \file kernels/pool2d.cc
 * \brief pool2d: max / average pooling over NCHW data (one oneDNN pooling_forward).
 *
 * Attrs: algorithm "max" | "avg_include_padding" | "avg_exclude_padding" (required),
 * kernel [kh, kw] (required), strides [sh, sw] (default [1, 1]), padding [top, left, bottom, right]
 * (default 0), dilation [dh, dw] (1 = dense, default [1, 1]), ceil_mode 0/1 (default 0: output
 * size rounds down; 1: rounds up, the extra windows reaching past the bottom/right padding).
 * Global average pooling is kernel = [H, W].  The op reads its input in whatever layout the
 * producer wrote (e.g. oneDNN's blocked layout after a conv) and writes the same layout.
 */
#include <optional>
#include <string>
#include <utility>

#include "int8.h"
#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildPool2D(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const std::string alg_name = attrs.Choice("algorithm", EnumNamesOf(PoolAlgorithms()), "");
  if (!attrs.Has("kernel")) attrs.Fail("kernel", "missing (required, [kh, kw])");
  const std::vector<int64_t> kernel = attrs.Ints("kernel", 2, {});
  const std::vector<int64_t> strides = attrs.Ints("strides", 2, {1, 1});
  const std::vector<int64_t> padding = attrs.Ints("padding", 4, {0, 0, 0, 0});
  const std::vector<int64_t> dilation = attrs.Ints("dilation", 2, {1, 1});
  const bool ceil_mode = attrs.Flag("ceil_mode", false);
  attrs.CheckNoUnknown();
  for (int i = 0; i < 2; ++i) {
    if (kernel[i] < 1) attrs.Fail("kernel", "must be >= 1, got " + ShapeToString(kernel));
    if (strides[i] < 1) attrs.Fail("strides", "must be >= 1, got " + ShapeToString(strides));
    if (dilation[i] < 1) attrs.Fail("dilation", "must be >= 1 (1 = dense), got " + ShapeToString(dilation));
  }
  for (int i = 0; i < 4; ++i) {
    if (padding[i] < 0) attrs.Fail("padding", "must be >= 0, got " + ShapeToString(padding));
  }

  ctx.ExpectInputCount(1, "data");
  ctx.ExpectRank(0, "data", 4);
  const auto& x = ctx.input(0).shape;
  const int64_t in[2] = {x[2], x[3]};
  int64_t out[2], pad_end[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t extent = (kernel[i] - 1) * dilation[i] + 1;
    const int64_t span = in[i] + padding[i] + padding[i + 2] - extent;
    if (span < 0) {
      ctx.Fail("the dilated window (" + std::to_string(extent) + ") is larger than the padded input (" +
               std::to_string(in[i] + padding[i] + padding[i + 2]) + ")");
    }
    const int64_t floor_out = span / strides[i] + 1;
    out[i] = ceil_mode ? (span + strides[i] - 1) / strides[i] + 1 : floor_out;
    if (ceil_mode && out[i] != floor_out && alg_name == "avg_include_padding") {
      ctx.Fail("ceil_mode with avg_include_padding changes the output size; not supported");
    }
    // oneDNN wants (in + pad_begin + pad_end - extent) / stride + 1 == out exactly.
    pad_end[i] = (out[i] - 1) * strides[i] + extent - in[i] - padding[i];
    if (pad_end[i] < padding[i + 2]) pad_end[i] = padding[i + 2];
    if (padding[i] >= extent || pad_end[i] >= extent) {
      ctx.Fail("padding " + ShapeToString(padding) + (ceil_mode ? " (with ceil_mode)" : "") +
               " would put a whole pooling window of extent " + std::to_string(extent) +
               " in the padding");
    }
  }
  const memory::dims dst_dims{x[0], x[1], out[0], out[1]};
  ctx.ExpectOutputShape({x[0], x[1], out[0], out[1]});

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
        ctx.engine, dnnl::prop_kind::forward_inference, alg, src, AnyDesc(dst_dims, dt), {strides[0], strides[1]},
        {kernel[0], kernel[1]}, {dilation[0] - 1, dilation[1] - 1}, {padding[0], padding[1]},
        {pad_end[0], pad_end[1]}, ctx.MakeAttr());
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
