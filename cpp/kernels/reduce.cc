/*!
 * \file kernels/reduce.cc
 * \brief reduce: mean / sum / max / min / mean of squares over some axes (one oneDNN reduction
 *        primitive), with an optional shift and activation applied to the result as post-ops.
 *
 * Attrs: algorithm "mean" | "sum" | "max" | "min" | "mean_square" | "sum_square" (required); shift (a number,
 * default 0: added to the result) and activation (+ clip), as in binary: act(reduce(x) + shift);
 * normalize (0/1, default 0; only mean_square over trailing axes with activation rsqrt): the output
 * is x * act(mean(x^2) + shift), the data's shape, instead of the statistic: RMSNorm's x * r
 * without gamma, where the statistic and the broadcast multiply were two steps (61 of each per
 * SmolLM-135M call).  Each element is the same float product the binary step computed.
 * has_weight (0/1, default 0; only with normalize): a second input, float32, one value per feature of
 * the last axis: the output is (x * r) * weight, RMSNorm with its gamma, where the gamma's multiply was
 * a step of its own wherever it could not go into the weights of the denses reading the norm (region
 * pass fold_norm_weights; the weight-only dense_wq of int8 / int4 decoders: 61 steps a SmolLM-135M call).
 * "mean_square" (the mean of x^2): with shift eps and activation rsqrt it is RMSNorm's
 * 1/sqrt(mean(x^2) + eps) in one pass over x (region pass fuse_rms_statistics,
 * ops/rms_statistic.py), where square, mean and add were three steps.  oneDNN 3.2 has it only as
 * norm_lp_power_p_sum, which runs its reference implementation (ref:any; measured in the SmolLM
 * decoder: 2 ms per [128, 576] norm at 1 thread, against 0.05 ms for the three jit steps), so a
 * reduction over trailing axes with activation none / sqrt / rsqrt is a host loop instead (one
 * read of each row, 16 partial sums the compiler keeps in one vector register); other shapes
 * keep the primitive.  "sum_square" (the sum of x^2, the same kernels with scale 1 instead of 1/n):
 * an L2 norm's sum in one read of x (ConvNeXt-V2's GRN over H, W; region pass fuse_rms_statistics),
 * where square and sum were two passes, the square writing a tensor of the data's size.
 * The reduced axes are those where
 * the output tensor (same rank as the data) has 1 and the data does not, as in oneDNN: every
 * output dim equals the data's or is 1 (reducing an axis of size 1 changes nothing).  A reduction
 * that drops its axes (keepdims=False) is this node followed by a `reshape`.  The data is read in
 * its producer's layout; the output is plain.
 */
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernel.h"

namespace byoc_hetero {

namespace {
const std::vector<std::pair<std::string, dnnl::algorithm>>& ReduceAlgorithms() {
  static const std::vector<std::pair<std::string, dnnl::algorithm>> algs{
      {"mean", dnnl::algorithm::reduction_mean},
      {"sum", dnnl::algorithm::reduction_sum},
      {"max", dnnl::algorithm::reduction_max},
      {"min", dnnl::algorithm::reduction_min},
      {"mean_square", dnnl::algorithm::reduction_norm_lp_power_p_sum},
      {"sum_square", dnnl::algorithm::reduction_norm_lp_power_p_sum},
  };
  return algs;
}
/*! \brief Whether the reduced axes (output dim 1, data dim not) are all after the kept ones. */
bool TrailingAxes(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  size_t kept = 0;
  while (kept < in.size() && out[kept] == in[kept]) ++kept;
  for (size_t i = kept; i < in.size(); ++i) {
    if (out[i] != 1) return false;
  }
  return true;
}

constexpr int64_t kLanes = 16;

/*! \brief sum(x^2) over one row: 16 partial sums over the whole 16-element blocks, the tail, then
 *         the partial sums in lane order (the order both versions below keep). */
float SumSquares(const float* x, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += x[i + l] * x[i + l];
  }
  float sum = 0.f;
  for (; i < n; ++i) sum += x[i] * x[i];
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

/*! \brief y = x * s over one row.  Element j reads only x[j], after the row's statistic is summed, so
 *         the loop stays right even on an output placed on the input's own bytes. */
void ScaleRow(const float* x, float s, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * s;
}

/*! \brief y = (x * s) * w over one row: ScaleRow, then the norm's weight per feature (the product the
 *         multiply step after it computed, w * (x * s), the same float32 bits). */
void ScaleRowWeighted(const float* x, float s, const float* w, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] * s) * w[j];
}

#if defined(__x86_64__)
/*! \brief SumSquares with the 16 partial sums in one register (same order of operations). */
__attribute__((target("avx512f"))) float SumSquaresAvx512(const float* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
  }
  float lanes[kLanes];
  _mm512_storeu_ps(lanes, acc);
  float sum = 0.f;
  for (; i < n; ++i) sum += x[i] * x[i];
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

/*! \brief ScaleRow, 16 lanes a step, the tail masked (GCC at -O2 leaves the loops above scalar: the
 *         first build of normalize took ~20 us per SmolLM [128, 576] norm against ~9 us of the
 *         binary step it replaced, 1-thread per-step minima). */
__attribute__((target("avx512f"))) void ScaleRowAvx512(const float* x, float s, float* y, int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = j + kLanes <= n ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(y + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), vs));
  }
}

/*! \brief ScaleRowWeighted, 16 lanes a step, the tail masked. */
__attribute__((target("avx512f"))) void ScaleRowWeightedAvx512(const float* x, float s, const float* w, float* y,
                                                               int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = j + kLanes <= n ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 xs = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), vs);
    _mm512_mask_storeu_ps(y + j, m, _mm512_mul_ps(xs, _mm512_maskz_loadu_ps(m, w + j)));
  }
}
#endif

struct RowFns {
  float (*sum_squares)(const float*, int64_t) = SumSquares;
  void (*scale)(const float*, float, float*, int64_t) = ScaleRow;
  void (*scale_weighted)(const float*, float, const float*, float*, int64_t) = ScaleRowWeighted;
};

RowFns PickRowFns() {
  RowFns fns;
#if defined(__x86_64__)
  if (IsaHasAvx512()) fns = {SumSquaresAvx512, ScaleRowAvx512, ScaleRowWeightedAvx512};
#endif
  return fns;
}

/*! \brief mean_square / sum_square (\p mean false) over the trailing axes as a host loop:
 *         act(sum(x^2) / n + shift) per row, or act(sum(x^2) + shift); with \p normalize, x times that
 *         per row (the output has the data's shape), and times the weight per feature where the node has one. */
std::unique_ptr<Kernel> MeanSquareRows(const KernelContext& ctx, double shift, const std::string& act,
                                       bool normalize, bool mean = true) {
  const bool weighted = normalize && ctx.node().inputs.size() == 2;  // has_weight: RMSNorm's gamma
  const int64_t n = normalize ? ctx.input(0).shape.back() : ctx.input(0).numel() / ctx.output().numel();
  const int64_t rows = ctx.input(0).numel() / n;
  const float inv_n = mean ? static_cast<float>(1.0 / static_cast<double>(n)) : 1.f;
  const float add = static_cast<float>(shift);
  const int mode = act == "sqrt" ? 1 : act == "rsqrt" ? 2 : 0;
  const RowFns row = PickRowFns();
  HostFn fn = [rows, n, inv_n, add, mode, normalize, weighted, row](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    const float* w = weighted ? static_cast<const float*>(p[1]) : nullptr;
    float* y = static_cast<float*>(p[weighted ? 2 : 1]);
    for (int64_t r = 0; r < rows; ++r, x += n) {
      const float v = row.sum_squares(x, n) * inv_n + add;
      const float stat = mode == 0 ? v : mode == 1 ? std::sqrt(v) : 1.f / std::sqrt(v);
      if (w != nullptr) {
        row.scale_weighted(x, stat, w, y + r * n, n);
      } else if (normalize) {
        row.scale(x, stat, y + r * n, n);
      } else {
        y[r] = stat;
      }
    }
  };
  std::vector<memory::desc> inputs{PlainDescOf(ctx.input(0))};
  if (weighted) inputs.push_back(PlainDescOf(ctx.input(1)));
  return std::make_unique<HostKernel>(ctx.where(), "reduce", std::move(fn), std::move(inputs),
                                      PlainDescOf(ctx.output()));
}

/*! \brief The data viewed as [outer, mid, inner] with the reduced axes exactly the middle block.*/
struct MiddleBlock {
  int64_t outer = 1, mid = 1, inner = 1;
};

/*! \brief The [outer, mid, inner] view when the reduced axes (output dim 1, data dim not) lie in one
 *         block of axes with only size-1 or reduced axes between them; nullopt otherwise. */
std::optional<MiddleBlock> MiddleAxes(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  size_t first = in.size(), last = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (out[i] == 1 && in[i] != 1) {
      first = std::min(first, i);
      last = i;
    }
  }
  if (first == in.size()) return std::nullopt;
  MiddleBlock b;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i >= first && i <= last && out[i] != 1) return std::nullopt;
    (i < first ? b.outer : i > last ? b.inner : b.mid) *= in[i];
  }
  return b;
}

constexpr int64_t kChunk = 64;  // output elements per task of MiddleReduce (4 AVX-512 vectors)

/*!
 * \brief sum / mean / mean_square / sum_square over the middle block of axes as a host loop: y[o, i] =
 *        act(scale * sum_m f(x[o, m, i]) + shift), f the identity or the square. Parallel over
 *        chunks of kChunk output elements; each chunk reads its columns row by row (contiguous
 *        runs), accumulating in float in row order.
 */
std::unique_ptr<Kernel> MiddleReduce(const KernelContext& ctx, const MiddleBlock& b, bool square, float scale,
                                     float shift, int mode) {
  const int64_t chunks_per_outer = (b.inner + kChunk - 1) / kChunk;
  HostFn fn = [b, square, scale, shift, mode, chunks_per_outer](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    float* y = static_cast<float*>(p[1]);
#pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < b.outer * chunks_per_outer; ++task) {
      const int64_t o = task / chunks_per_outer, i0 = (task % chunks_per_outer) * kChunk;
      const int64_t len = std::min(kChunk, b.inner - i0);
      float acc[kChunk] = {};
      for (int64_t m = 0; m < b.mid; ++m) {
        const float* row = x + (o * b.mid + m) * b.inner + i0;
        if (square) {
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) acc[i] += row[i] * row[i];
        } else {
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) acc[i] += row[i];
        }
      }
      float* dst = y + o * b.inner + i0;
      for (int64_t i = 0; i < len; ++i) {
        const float v = acc[i] * scale + shift;
        dst[i] = mode == 0 ? v : mode == 1 ? std::sqrt(v) : 1.f / std::sqrt(v);
      }
    }
  };
  return std::make_unique<HostKernel>(ctx.where(), "reduce", std::move(fn),
                                      std::vector<memory::desc>{PlainDescOf(ctx.input(0))}, PlainDescOf(ctx.output()));
}

/*! \brief normalize = 1: x * rsqrt(mean(x^2) over the last axis + shift), the data's shape. */
std::unique_ptr<Kernel> NormalizeRows(const KernelContext& ctx, const std::string& alg, double shift,
                                      const Activation& act) {
  if (alg != "mean_square" || act.name != "rsqrt") {
    ctx.Fail("normalize = 1 needs algorithm mean_square with activation rsqrt (x * rsqrt(mean(x^2) + shift)), got "
             "algorithm " + alg + " with activation " + act.name);
  }
  if (ctx.output().shape != ctx.input(0).shape) {
    ctx.Fail("normalize = 1 writes the data's shape " + ShapeToString(ctx.input(0).shape) + ", but the output has " +
             ShapeToString(ctx.output().shape));
  }
  if (ctx.input(0).dtype != DType::kFloat32 || ctx.output().dtype != DType::kFloat32) {
    ctx.Fail("normalize = 1 runs on float32 data and output only");
  }
  if (ctx.node().inputs.size() == 2) {  // has_weight: one float32 per feature of the last axis
    const auto& w = ctx.input(1).shape;
    const int64_t n = ctx.input(0).shape.back();
    if (ctx.input(1).dtype != DType::kFloat32 || w.empty() || w.back() != n || ctx.input(1).numel() != n) {
      ctx.Fail("weight must be float32 with one value per feature of the last axis (" + std::to_string(n) +
               "), got " + DTypeName(ctx.input(1).dtype) + " " + ShapeToString(w));
    }
  }
  return MeanSquareRows(ctx, shift, act.name, true);
}
}  // namespace

static std::unique_ptr<Kernel> BuildReduce(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  std::vector<std::string> names;
  for (const auto& a : ReduceAlgorithms()) names.push_back(a.first);
  const std::string alg_name = attrs.Choice("algorithm", names, "");
  const double shift = attrs.Float("shift", 0.0);
  const Activation act = ctx.ReadActivation(attrs, "activation", "clip");
  const bool normalize = attrs.Flag("normalize", false);
  const bool weighted = attrs.Flag("has_weight", false);
  attrs.CheckNoUnknown();
  if (!std::isfinite(shift)) attrs.Fail("shift", "expected a finite number");
  if (weighted && !normalize) attrs.Fail("has_weight", "needs normalize = 1 (the norm's weight times x * r)");
  ctx.ExpectInputCount(weighted ? 2 : 1, weighted ? "data, weight" : "data");
  const auto& in = ctx.input(0).shape;
  if (in.empty()) ctx.Fail("data must have rank >= 1, got a scalar");
  if (normalize) return NormalizeRows(ctx, alg_name, shift, act);
  const auto& out = ctx.output().shape;
  bool ok = out.size() == in.size();
  for (size_t i = 0; ok && i < in.size(); ++i) ok = out[i] == in[i] || out[i] == 1;
  if (!ok) {
    ctx.Fail("output tensor " + std::to_string(ctx.node().output) + " has shape " + ShapeToString(out) +
             "; a reduction of " + ShapeToString(in) +
             " keeps the rank, each dim the data's or 1 (the reduced axes)");
  }
  dnnl::algorithm alg = dnnl::algorithm::undef;
  for (const auto& a : ReduceAlgorithms()) {
    if (a.first == alg_name) alg = a.second;
  }
  const memory::dims dst_dims(out.begin(), out.end());
  const memory::desc dst = PlainDesc(dst_dims);
  const bool square = alg_name == "mean_square" || alg_name == "sum_square";
  const bool mean = alg_name == "mean" || alg_name == "mean_square";
  if (in == out && !square && shift == 0.0 && act.none()) {
    // nothing is reduced (every reduced axis has size 1): the output is the input's bytes
    return std::make_unique<AliasKernel>(PlainDesc(memory::dims(in.begin(), in.end())), dst);
  }
  if (square && TrailingAxes(in, out) && (act.none() || act.name == "sqrt" || act.name == "rsqrt") &&
      ctx.input(0).dtype == DType::kFloat32 && ctx.output().dtype == DType::kFloat32) {
    return MeanSquareRows(ctx, shift, act.name, false, mean);
  }
  int64_t n = 1;  // elements per output element
  for (size_t i = 0; i < in.size(); ++i) n *= in[i] / out[i];
  dnnl::primitive_attr attr = ctx.MakeAttr();
  dnnl::post_ops ops;
  const float scale = square && mean ? static_cast<float>(1.0 / static_cast<double>(n)) : 1.f;
  if (scale != 1.f || shift != 0.0) ops.append_eltwise(dnnl::algorithm::eltwise_linear, scale, static_cast<float>(shift));
  if (!act.none()) ops.append_eltwise(act.alg, act.alpha, act.beta);
  if (ops.len() > 0) attr.set_post_ops(ops);
  const memory::desc src = ctx.InputLayout(0);
  // norm_lp_power_p_sum: sum(|x|^p) + eps, here p = 2 and eps = 0; the other algorithms ignore p, eps
  dnnl::reduction::primitive_desc pd(ctx.engine, alg, src, dst, square ? 2.f : 0.f, 0.f, attr);
  // oneDNN 3.2 reduces axes between kept ones (ConvNeXt-V2's GRN: the L2 norm over H, W of
  // [N, H, W, C]) with its reference kernel only: there, a sum / mean / mean_square with
  // activation none, sqrt or rsqrt is a host loop instead (MiddleReduce); so is a sum_square (the
  // GRN's L2 norm) there
  const std::optional<MiddleBlock> block = MiddleAxes(in, out);
  if (block && std::string(pd.impl_info_str()).find("ref") != std::string::npos && alg_name != "max" &&
      alg_name != "min" && (act.none() || act.name == "sqrt" || act.name == "rsqrt") &&
      ctx.input(0).dtype == DType::kFloat32 && ctx.output().dtype == DType::kFloat32) {
    const float mid_scale = mean ? static_cast<float>(1.0 / static_cast<double>(block->mid)) : 1.f;
    return MiddleReduce(ctx, *block, square, mid_scale, static_cast<float>(shift),
                        act.none() ? 0 : act.name == "sqrt" ? 1 : 2);
  }
  return std::make_unique<PrimitiveKernel>(ctx.where(), "reduce", std::move(pd), std::vector<int>{DNNL_ARG_SRC},
                                           std::vector<OperandLayout>{{PlainDesc(src.get_dims()), pd.src_desc()}},
                                           OperandLayout{dst, dst});
}

BYOC_HETERO_REGISTER_KERNEL("reduce", BuildReduce);

}  // namespace byoc_hetero
