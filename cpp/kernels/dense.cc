/*!
 * \file kernels/dense.cc
 * \brief dense: act(x @ W + bias) with one oneDNN matmul; leading data dims flattened into M.
 *
 * Attrs: weight_layout "KN" (W stored [K, N]) | "NK" (W stored [N, K], i.e. x @ W^T) - required,
 * has_bias 0/1 (default: whether a third input is present), and the epilogue as for conv2d
 * (activation, residual, post_activation); or, instead of a residual, multiply 1: the output times
 * a node input of the output's shape after the activation (one binary_mul post-op applied while
 * the output tile is in registers: a gated unit's product, SwiGLU's silu(x Wg) * (x Wu), as the
 * epilogue of one of its denses; region pass fuse_gated_products, ops/gated_dense.py).
 * Inputs: data, weight, [bias], [residual | multiplier].
 * Both weight layouts are the same logical [K, N] matrix with different strides, so one reorder
 * (once, for a constant weight) brings either into the layout matmul prefers.
 */
#include <utility>

#include "int8.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {
/*!
 * \brief The kernel of a float dense whose output is multiplied by a node input (attr multiply):
 *        the activation, then binary_mul with that input (last node input, read plain as the
 *        post-op's second source).  No residual: the pass that writes multiply checks it.
 */
std::unique_ptr<Kernel> GatedDenseKernel(const KernelContext& ctx, const Epilogue& epilogue, bool constant_weight,
                                         const memory::desc& wei_view, const memory::dims& bias_dims, bool has_bias,
                                         const memory::dims& dst_dims) {
  const memory::dims src_dims{dst_dims[0], wei_view.get_dims()[0]}, wei_dims = wei_view.get_dims();
  const memory::data_type cdt = ctx.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::desc multiplier = PlainDesc(dst_dims);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (!epilogue.act.none()) ops.append_eltwise(epilogue.act.alg, epilogue.act.alpha, epilogue.act.beta);
  ops.append_binary(dnnl::algorithm::binary_mul, multiplier);
  attr.set_post_ops(ops);
  auto make = [&](const memory::desc& wei) {
    return dnnl::matmul::primitive_desc(ctx.engine, WithType(PlainDesc(src_dims), cdt), wei,
                                        has_bias ? PlainDesc(bias_dims) : memory::desc(), PlainDesc(dst_dims), attr);
  };
  dnnl::matmul::primitive_desc pd = ctx.bf16 ? make(constant_weight ? AnyDesc(wei_dims, cdt) : WithType(wei_view, cdt))
                                    : constant_weight ? MatmulForConstantWeight(make, wei_dims) : make(wei_view);
  std::vector<OperandLayout> inputs{{PlainDesc(src_dims), pd.src_desc()}, {wei_view, pd.weights_desc()}};
  std::vector<int> args{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS};
  if (has_bias) {
    inputs.push_back({PlainDesc(bias_dims), pd.bias_desc()});
    args.push_back(DNNL_ARG_BIAS);
  }
  inputs.push_back({multiplier, multiplier});
  args.push_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(epilogue.act.none() ? 0 : 1) | DNNL_ARG_SRC_1);
  const OperandLayout output{PlainDesc(dst_dims), pd.dst_desc()};
  return std::make_unique<PrimitiveKernel>(ctx.where(), "dense", std::move(pd), std::move(args), std::move(inputs),
                                           output);
}
}  // namespace

static std::unique_ptr<Kernel> BuildDense(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const bool nk = *FindEnum(DenseWeightLayouts(), attrs.Choice("weight_layout", EnumNamesOf(DenseWeightLayouts()), ""));
  const Epilogue epilogue = ctx.ReadEpilogue(attrs);
  const bool multiply = attrs.Flag("multiply", false);
  const size_t base = ctx.node().inputs.size() - (epilogue.residual || multiply ? 1 : 0);
  const bool has_bias = attrs.Flag("has_bias", base == 3);
  ReadNodePrecision(ctx, attrs);  // validated; ctx.bf16 holds what it means here
  const auto& w_shape = ctx.input(1).shape;
  Int8Params int8 = ReadInt8Params(ctx, attrs, w_shape.size() == 2 ? (nk ? w_shape[0] : w_shape[1]) : 1);
  // a float32 residual of a dynamic-source dense (BERT's attention output + its input) is summed
  // into the float32 output as it is: sum scale 1, no zero point
  if (int8.dynamic_src && !int8.int8_dst && epilogue.residual) int8.residual = true;
  attrs.CheckNoUnknown();
  if (multiply && (int8.enabled || epilogue.residual)) {
    ctx.Fail(std::string("multiply (a gating post-op) runs on a float dense without a residual; this one has ") +
             (int8.enabled ? "int8 attrs" : "a residual"));
  }

  ctx.ExpectInputCount(2 + has_bias + (epilogue.residual || multiply),
                       std::string(has_bias ? "data, weight, bias" : "data, weight") +
                           (epilogue.residual ? ", residual" : multiply ? ", multiplier" : ""));
  const auto& x = ctx.input(0).shape;
  if (x.size() < 2) {
    ctx.Fail("data (tensor " + std::to_string(ctx.node().inputs[0]) +
             ") must have rank >= 2, got shape " + ShapeToString(x));
  }
  ctx.ExpectRank(1, "weight", 2);
  const auto& w = ctx.input(1).shape;
  const int64_t k = x.back();
  const int64_t m = ctx.input(0).numel() / k;
  const int64_t wk = nk ? w[1] : w[0];
  const int64_t n = nk ? w[0] : w[1];
  if (wk != k) {
    ctx.Fail(std::string("weight shape ") + ShapeToString(w) + " (layout " + (nk ? "NK" : "KN") +
             ") has K=" + std::to_string(wk) + " but data shape " + ShapeToString(x) +
             " has K=" + std::to_string(k));
  }
  if (has_bias && ctx.input(2).numel() != n) {
    ctx.Fail("bias must have N=" + std::to_string(n) + " elements, got shape " +
             ShapeToString(ctx.input(2).shape));
  }
  std::vector<int64_t> out_shape(x.begin(), x.end() - 1);
  out_shape.push_back(n);
  ctx.ExpectOutputShape(out_shape);
  const size_t residual_index = 2 + has_bias;
  if (epilogue.residual) ctx.ExpectInputShape(residual_index, "residual", out_shape);
  if (multiply) {
    ctx.ExpectInputShape(residual_index, "multiplier", out_shape);
    if (ctx.input(residual_index).dtype != DType::kFloat32 || ctx.output().dtype != DType::kFloat32) {
      ctx.Fail("multiply needs a float32 multiplier (tensor " + std::to_string(ctx.node().inputs[residual_index]) +
               ") and output");
    }
  }

  const memory::dims src_dims{m, k}, wei_dims{k, n}, bias_dims{1, n}, dst_dims{m, n};
  const memory::desc wei_view = nk ? StridedDesc(wei_dims, {1, k}) : PlainDesc(wei_dims);
  if (int8.enabled) {
    // int8 (int8.h): u8/s8 data x s8 weights reordered once, scales per output column (mask on N)
    if (epilogue.residual != int8.residual) ctx.Fail("an int8 residual needs attrs residual = 1 and sum_scale");
    const memory::data_type src_t = int8.dynamic_src ? memory::data_type::u8 : DnnlType(ctx.input(0).dtype);
    const memory::data_type dst_t = DnnlType(ctx.output().dtype);
    const dnnl::primitive_attr attr = MakeInt8Attr(ctx, epilogue, int8, 1 << 1);
    dnnl::matmul::primitive_desc pd(ctx.engine, WithType(PlainDesc(src_dims), src_t), AnyDesc(wei_dims, memory::data_type::s8),
                                    has_bias ? PlainDesc(bias_dims) : memory::desc(),
                                    WithType(PlainDesc(dst_dims), dst_t), attr);
    return MakeInt8AnchorKernel(ctx, "dense", std::move(pd), WithType(PlainDesc(src_dims), src_t),
                                WithType(wei_view, memory::data_type::s8),
                                has_bias ? PlainDesc(bias_dims) : memory::desc(), WithType(PlainDesc(dst_dims), dst_t), int8);
  }
  // A constant weight is reordered once into the layout matmul prefers; one that arrives at run
  // time is read where it lies (no per-call reorder).
  const bool constant_weight = ctx.input_constant.size() > 1 && ctx.input_constant[1];
  if (multiply) return GatedDenseKernel(ctx, epilogue, constant_weight, wei_view, bias_dims, has_bias, dst_dims);

  // bf16: src and weight are read as bf16 (the weight converted once when constant, the data on
  // every call), accumulation stays f32; the output is f32 unless every reader rounds it to bf16
  // anyway (OutputOnlyFeedsBf16Convs: e.g. attention's Q/K/V projections read by matmuls).
  const memory::data_type cdt = ctx.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::desc dst = WithType(PlainDesc(dst_dims), OutputOnlyFeedsBf16Convs(ctx) ? memory::data_type::bf16
                                                                                      : memory::data_type::f32);
  auto make = [&](const memory::desc& wei) {
    return dnnl::matmul::primitive_desc(ctx.engine, WithType(PlainDesc(src_dims), cdt), wei,
                                        has_bias ? PlainDesc(bias_dims) : memory::desc(), dst,
                                        ctx.MakeAttr(epilogue));
  };
  dnnl::matmul::primitive_desc pd = ctx.bf16 ? make(constant_weight ? AnyDesc(wei_dims, cdt) : WithType(wei_view, cdt))
                                    : constant_weight ? MatmulForConstantWeight(make, wei_dims) : make(wei_view);

  return MakeAnchorKernel(ctx, "dense", std::move(pd), PlainDesc(src_dims), wei_view, bias_dims,
                          has_bias, dst_dims, epilogue);
}

/*! \brief bf16 region: the data and a run-time weight are rounded to bf16; never the bias or a residual. */
static KernelTraits DenseTraits() {
  KernelTraits traits;
  traits.bf16_input = [](const NodeInfo&, size_t k) { return k <= 1 ? Bf16Read::kRounds : Bf16Read::kF32; };
  traits.accepts_int8 = true;  // u8/s8 data x s8 weights (int8.cc)
  traits.dynamic_int8_source = true;  // float32 data quantized per call (attr src_dynamic, int8.cc)
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("dense", BuildDense, DenseTraits());

}  // namespace byoc_hetero
