/*!
 * \file kernels/dense.cc
 * \brief dense: act(x @ W + bias) with one oneDNN matmul; leading data dims flattened into M.
 *
 * Attrs: weight_layout "KN" (W stored [K, N]) | "NK" (W stored [N, K], i.e. x @ W^T) - required,
 * has_bias 0/1 (default: whether a third input is present), has_gate 0/1 (default 0: a float32 input of the
 * output's shape multiplying the output after the activation, a binary post-op: a GLU's product, region pass
 * fold_gate_products), and the epilogue as for conv2d (activation, residual, post_activation).
 * Inputs: data, weight, [bias], [gate], [residual].
 * Both weight layouts are the same logical [K, N] matrix with different strides, so one reorder
 * (once, for a constant weight) brings either into the layout matmul prefers.  A float32 dense on
 * a constant weight runs as oneDNN's brgemm inner product instead (InnerProductDense: 9-11 %
 * faster than the matmul at the SmolLM decoder's shapes on 2 threads, bench/LLM.md session 6); one
 * of at most kGemvDefaultRows rows runs our own GEMV (dense_gemv.h).  BYOC_HETERO_DENSE_IP=off (read when a
 * plan is made) keeps the matmul at every row count: the primitive A/B at a prefill's rows.
 */
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

#include "dense_gemv.h"
#include "env_switch.h"
#include "int8.h"
#include "kernel.h"
#include "../threading.h"

namespace byoc_hetero {

/*! \brief A float32 dense on a constant weight as oneDNN's inner product (weights reordered once
 *         into its blocked layout), when oneDNN has a brgemm one for it; null otherwise (the
 *         caller builds the matmul).  Measured at SmolLM-135M's shapes (M = 128, weights flushed
 *         from cache before each call, 2 threads, p25 of 100 interleaved calls): 576x960 0.555 vs
 *         0.626 ms for matmul, 576x576 0.385 vs 0.422, 1536x576 0.85 vs 0.93, 576x1536 even. */
static std::unique_ptr<Kernel> InnerProductDense(const KernelContext& ctx, int64_t m, int64_t k, int64_t n, bool nk,
                                                 bool has_bias, const Epilogue& epilogue) {
  // the weight as inner product's [N, K] (oi): an NK weight is that plain, a KN one its transpose
  const memory::desc wei_view = nk ? PlainDesc({n, k}) : StridedDesc({n, k}, {1, n});
  dnnl::inner_product_forward::primitive_desc pd;
  try {
    pd = dnnl::inner_product_forward::primitive_desc(
        ctx.engine, dnnl::prop_kind::forward_inference, PlainDesc({m, k}), AnyDesc({n, k}),
        has_bias ? PlainDesc({n}) : memory::desc(), PlainDesc({m, n}), ctx.MakeAttr(epilogue));
  } catch (const dnnl::error&) {
    return nullptr;  // e.g. a post-op inner product has no implementation for: the matmul runs it
  }
  if (std::string(pd.impl_info_str()).rfind("brgemm", 0) != 0) return nullptr;
  return MakeAnchorKernel(ctx, "dense", std::move(pd), PlainDesc({m, k}), wei_view, {n}, has_bias, {m, n}, epilogue);
}

/*! \brief BYOC_HETERO_DENSE_IP, read when a plan is made: "auto" (or unset: the inner product where
 *         BuildDense's rules take it) or "off" (the matmul always: the primitive A/B at a prefill's rows). */
static bool InnerProductAllowed() { return EnvSwitch("BYOC_HETERO_DENSE_IP", "auto", "off", true); }

/*! \brief Rows of the prefill plan whose inner-product weight layout a few-row GEMV may share (PrefillWeightLayout):
 *         oneDNN 3.2's AVX2 inner product gives AB8b24a from 128 rows up (1024 alike), AB8b16a at 64. */
constexpr int64_t kPrefillRows = 128;

/*! \brief BYOC_HETERO_GEMV_LAYOUT, read when a plan is made: which weight copy a few-row GEMV may read where the
 *         matmul's own is no panels (oneDNN 3.2 without AVX-512: its jit sgemm keeps the weight [N, K] row-major).
 *         `matmul`: the matmul's panels only, else the matmul runs; `prefill` (unset; quiet A/B under an AVX2 cap,
 *         Zen 5, SmolLM-135M f32 decode 1.16x `matmul` at 2 threads, 1.09x at 1, bench/GENERATE.md session 17 end):
 *         the prefill inner product's
 *         panels where a prefill plan of the process's threads (RegionThreads, not a contention plan's fewer) takes
 *         it (PrefillWeightLayout), else the [N, K] rows (the sgemm's copy; an NK weight as it is), so that decode
 *         and prefill read one copy; `rows`: the rows, `panels`: the inner product's panels at any threads (a copy of
 *         the GEMV's own where no prefill shares it): the A/Bs of the two forms. */
enum class GemvLayout { kMatmul, kPrefill, kRows, kPanels };
static GemvLayout ReadGemvLayout() {
  const char* env = std::getenv("BYOC_HETERO_GEMV_LAYOUT");
  const std::string value = env == nullptr ? "" : env;
  if (value == "matmul") return GemvLayout::kMatmul;
  if (value.empty() || value == "prefill") return GemvLayout::kPrefill;
  if (value == "rows") return GemvLayout::kRows;
  if (value == "panels") return GemvLayout::kPanels;
  TVM_FFI_THROW(ValueError) << "BYOC_HETERO_GEMV_LAYOUT must be matmul, prefill, rows or panels, got '" << value << "'";
}

/*! \brief The [k, n] view of the weight layout oneDNN's inner product picks for a prefill of kPrefillRows rows of
 *         this dense (InnerProductDense's choice there, so the two plans share one prepared copy: Buffers::Key reads
 *         [N, K] AB8b24a and [K, N] BA8a24b as the same bytes), or an empty desc where it has no brgemm one. */
static memory::desc PrefillWeightLayout(const KernelContext& ctx, int64_t k, int64_t n) {
  dnnl::inner_product_forward::primitive_desc pd;
  try {
    pd = dnnl::inner_product_forward::primitive_desc(ctx.engine, dnnl::prop_kind::forward_inference,
                                                     PlainDesc({kPrefillRows, k}), AnyDesc({n, k}), memory::desc(),
                                                     PlainDesc({kPrefillRows, n}), ctx.MakeAttr());
  } catch (const dnnl::error&) {
    return memory::desc();
  }
  if (std::string(pd.impl_info_str()).rfind("brgemm", 0) != 0) return memory::desc();
  return pd.weights_desc().permute_axes({1, 0});
}

/*! \brief int8 (int8.h): u8/s8 data x s8 weights reordered once, scales per output column (mask on N). */
static std::unique_ptr<Kernel> Int8Dense(const KernelContext& ctx, const Int8Params& int8, const Epilogue& epilogue,
                                         const memory::dims& src_dims, const memory::dims& wei_dims,
                                         const memory::desc& wei_view, bool has_bias, const memory::dims& bias_dims,
                                         const memory::dims& dst_dims) {
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

/*! \brief The dense's operands checked against each other: (M rows, K, N); fails naming the operand. */
struct DenseDims {
  int64_t m, k, n;
};
static DenseDims CheckDenseShapes(const KernelContext& ctx, bool nk, bool has_bias, bool has_gate, bool residual) {
  ctx.ExpectInputCount(2 + has_bias + has_gate + residual,
                       std::string(has_bias ? "data, weight, bias" : "data, weight") + (has_gate ? ", gate" : "") +
                           (residual ? ", residual" : ""));
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
  if (has_gate) {
    ctx.ExpectInputShape(2 + has_bias, "gate", out_shape);
    if (ctx.input(2 + has_bias).dtype != DType::kFloat32) {
      ctx.Fail("gate is " + std::string(DTypeName(ctx.input(2 + has_bias).dtype)) + ", expected float32");
    }
  }
  if (residual) ctx.ExpectInputShape(2 + has_bias + has_gate, "residual", out_shape);
  return {m, k, n};
}

static std::unique_ptr<Kernel> BuildDense(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const bool nk = *FindEnum(DenseWeightLayouts(), attrs.Choice("weight_layout", EnumNamesOf(DenseWeightLayouts()), ""));
  Epilogue epilogue = ctx.ReadEpilogue(attrs);
  const bool has_gate = attrs.Flag("has_gate", false);
  const size_t base = ctx.node().inputs.size() - (epilogue.residual ? 1 : 0) - (has_gate ? 1 : 0);
  const bool has_bias = attrs.Flag("has_bias", base == 3);
  ReadNodePrecision(ctx, attrs);  // validated; ctx.bf16 holds what it means here
  const auto& w_shape = ctx.input(1).shape;
  Int8Params int8 = ReadInt8Params(ctx, attrs, w_shape.size() == 2 ? (nk ? w_shape[0] : w_shape[1]) : 1);
  // a float32 residual of a dynamic-source dense (BERT's attention output + its input) is summed
  // into the float32 output as it is: sum scale 1, no zero point
  if (int8.dynamic_src && !int8.int8_dst && epilogue.residual) int8.residual = true;
  attrs.CheckNoUnknown();

  const auto [m, k, n] = CheckDenseShapes(ctx, nk, has_bias, has_gate, epilogue.residual);
  if (has_gate && int8.enabled) ctx.Fail("an int8 dense takes no gate (fold_gate_products folds float32 ones only)");
  if (has_gate) epilogue.gate = {m, n};

  const memory::dims src_dims{m, k}, wei_dims{k, n}, bias_dims{1, n}, dst_dims{m, n};
  const memory::desc wei_view = nk ? StridedDesc(wei_dims, {1, k}) : PlainDesc(wei_dims);
  if (int8.enabled) return Int8Dense(ctx, int8, epilogue, src_dims, wei_dims, wei_view, has_bias, bias_dims, dst_dims);
  // A constant weight is reordered once into the layout matmul prefers; one that arrives at run
  // time is read where it lies (no per-call reorder).
  const bool constant_weight = ctx.input_constant.size() > 1 && ctx.input_constant[1];

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
  // Fewer rows than kInnerProductMinRows keep the matmul: at wav2vec2-base's 49 rows (K, N of 768 /
  // 3072) the inner product's 73 denses took 36.9 ms against the matmul's 36.0 (per-step minima of 10
  // calls, 2 threads, quiet Sapphire Rapids class, session 6), while at 128 and 1500 rows it wins.
  // A plan for one thread keeps the matmul too: the SmolLM-135M decoder (S = 128) ran 213-228 ms a call
  // with inner products against 194-198 ms with matmuls at 1 thread, and 103-105 against 110-112 ms at
  // 2 (alternating processes, quiet, session 6).
  constexpr int64_t kInnerProductMinRows = 64;
  if (!ctx.bf16 && constant_weight && m >= kInnerProductMinRows && ctx.threads >= 2 &&
      dst.get_data_type() == memory::data_type::f32 && InnerProductAllowed()) {
    std::unique_ptr<Kernel> ip = InnerProductDense(ctx, m, k, n, nk, has_bias, epilogue);
    if (ip) return ip;
  }
  dnnl::matmul::primitive_desc pd = ctx.bf16 ? make(constant_weight ? AnyDesc(wei_dims, cdt) : WithType(wei_view, cdt))
                                    : constant_weight ? MatmulForConstantWeight(make, wei_dims) : make(wei_view);
  // A plan of few rows (the decode step's M = 1) streams the weight once: our GEMV reads the
  // matmul's own blocked copy (dense_gemv.h) when its panels allow.
  if (!ctx.bf16 && constant_weight && dst.get_data_type() == memory::data_type::f32) {
    const GemvLayout layout = ReadGemvLayout();
    // where a prefill plan of the process's threads runs the inner product: a plan of fewer threads made under
    // contention reads the same panels, so that its decode gives the same bits as the full plan's
    const bool prefill_panels = std::max(ctx.threads, RegionThreads()) >= 2 && InnerProductAllowed();
    std::function<memory::desc()> prefill_layout;
    if ((layout == GemvLayout::kPrefill && prefill_panels) || layout == GemvLayout::kPanels) {
      prefill_layout = [&ctx, k = k, n = n] { return PrefillWeightLayout(ctx, k, n); };
    }
    std::unique_ptr<Kernel> gemv = GemvDense(ctx, m, k, n, nk, has_bias, epilogue, pd.weights_desc(), prefill_layout,
                                             layout != GemvLayout::kMatmul);
    if (gemv) return gemv;
  }

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
