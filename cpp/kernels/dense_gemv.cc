/*!
 * \file kernels/dense_gemv.cc
 * \brief GemvDense (dense_gemv.h): a float32 dense of few rows over the matmul's weight panels, one
 *        micro-kernel per ISA (each with its own target attribute: the choice is made at run time).
 */
#include "dense_gemv.h"

#include <immintrin.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "simd_isa.h"

namespace byoc_hetero {

namespace {

constexpr int64_t kSlice = 16;   // columns of one AVX-512 vector
constexpr int64_t kChunk = 8;    // columns of one AVX2 vector: panels are 1..8 chunks wide
constexpr int64_t kMaxPanel = 64;  // the widest panel (BA16a64b)
constexpr int kMaxRows = 4;        // rows one micro-kernel call keeps in registers
constexpr int64_t kPrefetchBytes = 2048;  // software prefetch distance along a panel

/*! \brief One micro-kernel call: rows [0, rows) of x times one panel of ldw columns, into out [rows][ldw]. */
struct PanelJob {
  const float* x;  // row stride k
  const float* w;  // the panel: k rows of ldw floats (the rows form: ldw rows of k floats, [N, K])
  int64_t k, ldw, rows;
  float* out;      // row stride ldw
  int64_t cols;    // the columns of out to write (the rows form; a panel writes all ldw)
};
using PanelFn = void (*)(const PanelJob&);

/*! \brief AVX-512: the whole panel (V vectors a row) in one pass, R x V accumulators. */
template <int R, int V>
__attribute__((target("avx512f"))) void Panel512(const PanelJob& j) {
  __m512 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  const int64_t ahead = kPrefetchBytes / static_cast<int64_t>(sizeof(float)) / j.ldw * j.ldw;
  for (int64_t kk = 0; kk < j.k; ++kk) {
    const float* row = j.w + kk * j.ldw;
    __m512 w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      // one cache line a vector: ask for the one 2 KiB ahead (into the next panel at the end)
      _mm_prefetch(reinterpret_cast<const char*>(row + ahead + v * kSlice), _MM_HINT_T0);
      w[v] = _mm512_loadu_ps(row + v * kSlice);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(j.x[r * j.k + kk]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(xv, w[v], acc[r][v]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(j.out + r * j.ldw + v * kSlice, acc[r][v]);
}

/*! \brief AVX2 + FMA: C vectors (8 columns each) of the panel from column c0, U k at a time (U = 2 where the
 *         accumulators and both rows' weights fit the 16 registers, so that M = 1 keeps 2 C chains of FMAs going). */
template <int R, int C>
__attribute__((target("avx2,fma"))) void Chunk256(const PanelJob& j, int64_t c0) {
  constexpr int U = 2 * R * C + 2 * C <= 16 ? 2 : 1;
  __m256 acc[R][U][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][u][c] = _mm256_setzero_ps();
  const float* w0 = j.w + c0;
  int64_t kk = 0;
  for (; kk + U <= j.k; kk += U) {
    __m256 w[U][C];
#pragma GCC unroll 2
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) w[u][c] = _mm256_loadu_ps(w0 + (kk + u) * j.ldw + c * 8);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
      for (int u = 0; u < U; ++u) {
        const __m256 xv = _mm256_set1_ps(j.x[r * j.k + kk + u]);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[r][u][c] = _mm256_fmadd_ps(xv, w[u][c], acc[r][u][c]);
      }
    }
  }
  for (; kk < j.k; ++kk) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_set1_ps(j.x[r * j.k + kk]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        acc[r][0][c] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w0 + kk * j.ldw + c * 8), acc[r][0][c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      __m256 sum = acc[r][0][c];
#pragma GCC unroll 2
      for (int u = 1; u < U; ++u) sum = _mm256_add_ps(sum, acc[r][u][c]);
      _mm256_storeu_ps(j.out + r * j.ldw + c0 + c * 8, sum);
    }
}

/*! \brief Portable C++: one kChunk-column chunk of the panel. */
template <int R>
void ChunkGeneric(const PanelJob& j, int64_t c0) {
  float acc[R][kChunk] = {};
  for (int64_t kk = 0; kk < j.k; ++kk) {
    const float* w = j.w + kk * j.ldw + c0;
    for (int r = 0; r < R; ++r) {
      const float xv = j.x[r * j.k + kk];
      for (int c = 0; c < kChunk; ++c) acc[r][c] += xv * w[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kChunk; ++c) j.out[r * j.ldw + c0 + c] = acc[r][c];
}

/*! \brief The sum of the 8 lanes. */
__attribute__((target("avx2,fma"))) inline float Sum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/*! \brief The rows form (the weight [N, K] row-major, as oneDNN's jit sgemm keeps it without AVX-512), AVX2 + FMA:
 *         out[r][c] = x[r] . w[c] for c < cols, G weight rows (G streams) at a time, 8 k a vector. */
template <int R>
__attribute__((target("avx2,fma"))) void Rows256(const PanelJob& j) {
  constexpr int G = R <= 2 ? 4 : 2;
  const int64_t k8 = j.k / 8 * 8;
  for (int64_t c = 0; c < j.cols; c += G) {
    const float* w[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) w[g] = j.w + std::min<int64_t>(c + g, j.cols - 1) * j.k;  // past cols: recomputed
    __m256 acc[R][G];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k8; kk += 8) {
      __m256 xv[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(j.x + r * j.k + kk);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m256 wv = _mm256_loadu_ps(w[g] + kk);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) acc[r][g] = _mm256_fmadd_ps(xv[r], wv, acc[r][g]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int g = 0; g < G && c + g < j.cols; ++g) {
        float sum = Sum256(acc[r][g]);
        for (int64_t kk = k8; kk < j.k; ++kk) sum += j.x[r * j.k + kk] * w[g][kk];
        j.out[r * j.ldw + c + g] = sum;
      }
    }
  }
}

/*! \brief The rows form in portable C++. */
template <int R>
void RowsGeneric(const PanelJob& j) {
  for (int64_t c = 0; c < j.cols; ++c) {
    const float* w = j.w + c * j.k;
    for (int r = 0; r < R; ++r) {
      float sum = 0.f;
      for (int64_t kk = 0; kk < j.k; ++kk) sum += j.x[r * j.k + kk] * w[kk];
      j.out[r * j.ldw + c] = sum;
    }
  }
}

/*! \brief The kernel instantiated for a job's rows (1..kMaxRows): K<R>::Run(job). */
template <template <int> class K>
void ByRows(const PanelJob& j) {
  switch (j.rows) {
    case 1:
      return K<1>::Run(j);
    case 2:
      return K<2>::Run(j);
    case 3:
      return K<3>::Run(j);
    default:
      return K<4>::Run(j);
  }
}
/*! \brief AVX-512 for a panel of V vectors. */
template <int V>
struct Avx512Width {
  template <int R>
  struct K {
    static void Run(const PanelJob& j) { Panel512<R, V>(j); }
  };
};
/*! \brief AVX2: the panel's 8-column vectors C at a time (C = 3 where the width is a multiple of 24, as oneDNN's
 *         AVX2 inner product panels of 24 are; else 2, else 1). */
template <int C>
struct Avx2Chunks {
  template <int R>
  struct K {
    static void Run(const PanelJob& j) {
      for (int64_t c0 = 0; c0 < j.ldw; c0 += C * kChunk) Chunk256<R, C>(j, c0);
    }
  };
};
/*! \brief Portable C++: the panel's kChunk-column chunks one after another. */
template <int R>
struct GenericK {
  static void Run(const PanelJob& j) {
    for (int64_t c0 = 0; c0 < j.ldw; c0 += kChunk) ChunkGeneric<R>(j, c0);
  }
};

template <int R>
struct RowsAvx2K {
  static void Run(const PanelJob& j) { Rows256<R>(j); }
};
template <int R>
struct RowsGenericK {
  static void Run(const PanelJob& j) { RowsGeneric<R>(j); }
};

/*! \brief The rows form's kernel of \p isa (AVX2 for AVX-512: UsableIsa). */
PanelFn FindRowsFn(SimdIsa isa) { return isa == SimdIsa::kGeneric ? ByRows<RowsGenericK> : ByRows<RowsAvx2K>; }

/*! \brief The micro-kernel of \p isa for panels of \p width columns (a multiple of 8 up to 64; AVX-512 takes
 *         multiples of 16 only: UsableIsa). */
PanelFn FindPanelFn(SimdIsa isa, int64_t width) {
  switch (isa) {
    case SimdIsa::kAvx512:
      switch (width / kSlice) {
        case 1:
          return ByRows<Avx512Width<1>::K>;
        case 2:
          return ByRows<Avx512Width<2>::K>;
        case 3:
          return ByRows<Avx512Width<3>::K>;
        default:
          return ByRows<Avx512Width<4>::K>;
      }
    case SimdIsa::kAvx2:
      if (width % (3 * kChunk) == 0) return ByRows<Avx2Chunks<3>::K>;
      return width % (2 * kChunk) == 0 ? ByRows<Avx2Chunks<2>::K> : ByRows<Avx2Chunks<1>::K>;
    default:
      return ByRows<GenericK>;
  }
}

/*! \brief BYOC_HETERO_GEMV_ROWS (an integer >= 0), else kGemvDefaultRows. */
int64_t GemvMaxRows() {
  const char* env = std::getenv("BYOC_HETERO_GEMV_ROWS");
  if (env == nullptr || *env == '\0') return kGemvDefaultRows;
  char* end = nullptr;
  const long value = std::strtol(env, &end, 10);
  if (*end != '\0' || value < 0) {
    TVM_FFI_THROW(ValueError) << "BYOC_HETERO_GEMV_ROWS must be an integer >= 0, got '" << env << "'";
  }
  return value;
}

/*! \brief What one call needs: the shapes, the epilogue's sums, the threads. */
struct GemvShape {
  int64_t m = 0, k = 0, n = 0;
  bool has_bias = false, gate = false, residual = false;
  int threads = 1;
  int64_t width = kMaxPanel;  // columns per panel: BA<k_block>a<width>b (the rows form: columns per task)
  int64_t k_block = 16;       // the layout pads K to a multiple of this
  bool rows_form = false;     // the weight [N, K] row-major (dot products along K), not panels
  int64_t panels() const { return (n + width - 1) / width; }
  int64_t panel_floats() const { return rows_form ? width * k : (k + k_block - 1) / k_block * k_block * width; }
};

/*! \brief One call: panels split across the threads, each panel's rows kMaxRows at a time. */
void RunGemv(const GemvShape& s, PanelFn fn, const std::vector<void*>& p) {
  const float* x = static_cast<const float*>(p[0]);
  const float* w = static_cast<const float*>(p[1]);
  const float* bias = s.has_bias ? static_cast<const float*>(p[2]) : nullptr;
  const float* gate = s.gate ? static_cast<const float*>(p[2 + s.has_bias]) : nullptr;
  float* y = static_cast<float*>(p.back());  // holds the residual when s.residual
  const int64_t panels = s.panels();
  // below ~64K multiply-adds a fork/join costs more than the split saves
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(s.threads, panels)));
  const bool parallel = threads > 1 && s.m * s.k * s.n >= (1 << 16);
#pragma omp parallel for schedule(static) num_threads(threads) if (parallel)
  for (int64_t t = 0; t < panels; ++t) {
    alignas(64) float out[kMaxRows * kMaxPanel];
    const int64_t n0 = t * s.width, cols = std::min<int64_t>(s.width, s.n - n0);
    for (int64_t r0 = 0; r0 < s.m; r0 += kMaxRows) {
      const int64_t rows = std::min<int64_t>(kMaxRows, s.m - r0);
      fn(PanelJob{x + r0 * s.k, w + t * s.panel_floats(), s.k, s.width, rows, out, cols});
      for (int64_t r = 0; r < rows; ++r) {
        float* dst = y + (r0 + r) * s.n + n0;
        const float* g = gate != nullptr ? gate + (r0 + r) * s.n + n0 : nullptr;
        for (int64_t c = 0; c < cols; ++c) {
          // oneDNN's order: (x @ W + bias), the gate's multiply, then the sum post-op adds the residual
          float v = out[r * s.width + c] + (bias != nullptr ? bias[n0 + c] : 0.f);
          if (g != nullptr) v *= g[c];
          dst[c] = s.residual ? dst[c] + v : v;
        }
      }
    }
  }
}

/*! \brief \p isa, or AVX2 where it is AVX-512 and the panels are no whole 16-float vectors (oneDNN's AVX2 inner
 *         product's 24) or the weight is in rows (every CPU with AVX-512F has AVX2 and FMA). */
SimdIsa UsableIsa(SimdIsa isa, const GemvShape& s) {
  return isa == SimdIsa::kAvx512 && (s.rows_form || s.width % kSlice != 0) ? SimdIsa::kAvx2 : isa;
}

/*! \brief The activation after the GEMV's sum (act without a residual, post_act after one), or none. */
const Activation& ActivationAfter(const Epilogue& e) { return e.residual ? e.post_act : e.act; }

class GemvDenseKernel : public Kernel {
 public:
  GemvDenseKernel(const KernelContext& ctx, const GemvShape& s, const memory::desc& wei_view,
                  const memory::desc& wei_want, const Activation& act)
      : label_(ctx.where()), s_(s), isa_(UsableIsa(SelectSimdIsa("BYOC_HETERO_GEMV_ISA"), s)) {
    if (!act.none()) {  // oneDNN's own eltwise, in place on the output: the post-op the matmul would apply
      act_ = dnnl::eltwise_forward::primitive_desc(ctx.engine, dnnl::prop_kind::forward_inference, act.alg,
                                                   PlainDesc({s.m, s.n}), PlainDesc({s.m, s.n}), act.alpha, act.beta,
                                                   ctx.MakeAttr());
      act_name_ = act.name;
    }
    inputs_.push_back({PlainDesc({s.m, s.k}), PlainDesc({s.m, s.k})});
    inputs_.push_back({wei_view, wei_want});
    if (s.has_bias) inputs_.push_back({PlainDesc({1, s.n}), PlainDesc({1, s.n})});
    if (s.gate) inputs_.push_back({PlainDesc({s.m, s.n}), PlainDesc({s.m, s.n})});
    output_ = {PlainDesc({s.m, s.n}), PlainDesc({s.m, s.n})};
    if (s.residual) {
      inputs_.push_back(output_);
      sum_input_ = static_cast<int>(inputs_.size() - 1);
    }
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& /*temps*/) const override {
    Step step;
    const GemvShape s = s_;
    const PanelFn fn = s.rows_form ? FindRowsFn(isa_) : FindPanelFn(isa_, s.width);
    step.host = [s, fn](const std::vector<void*>& p) { RunGemv(s, fn, p); };
    step.label = label_ + ": gemv (" + SimdIsaName(isa_) + ")";
    step.op = "dense";
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (static_cast<int>(k) != sum_input_) step.args.emplace_back(static_cast<int>(k), inputs[k]);
    }
    step.args.emplace_back(static_cast<int>(inputs.size()), output);
    std::vector<Step> steps{std::move(step)};
    if (act_) {
      Step act;
      act.pd = *act_;
      act.args = {{DNNL_ARG_SRC, output}, {DNNL_ARG_DST, output}};
      act.label = label_ + ": " + act_name_ + " after the gemv";
      act.op = "dense";
      steps.push_back(std::move(act));
    }
    return steps;
  }

 private:
  std::string label_;
  GemvShape s_;
  SimdIsa isa_;
  std::optional<dnnl::eltwise_forward::primitive_desc> act_;
  std::string act_name_;
};

/*! \brief The panels of \p want, when it is BA<kb>a<W>b of [k, n] f32 (W a multiple of kChunk up to kMaxPanel, any
 *         kb: each panel of W columns one contiguous row-major [K padded to kb, W] block), as {W, kb}; else {0, 0}.
 *         oneDNN 3.2's matmul on AVX-512 gives BA16a64b; its AVX2 inner product AB8b24a over [n, k], the same bytes. */
std::pair<int64_t, int64_t> PanelLayout(const memory::desc& want, int64_t k, int64_t n) {
  if (want.get_format_kind() != memory::format_kind::blocked || want.get_data_type() != memory::data_type::f32 ||
      want.get_dims() != memory::dims{k, n} || want.get_inner_nblks() != 2 ||
      want.get_inner_idxs() != memory::dims{0, 1} || want.get_submemory_offset() != 0) {
    return {0, 0};
  }
  const int64_t kb = want.get_inner_blks()[0], width = want.get_inner_blks()[1];
  if (width % kChunk != 0 || width > kMaxPanel || kb < 1) return {0, 0};
  const int64_t k_padded = (k + kb - 1) / kb * kb;
  if (want.get_strides() != memory::dims{kb * width, k_padded * width}) return {0, 0};
  return {width, kb};
}

}  // namespace

std::unique_ptr<Kernel> GemvDense(const KernelContext& ctx, int64_t m, int64_t k, int64_t n, bool nk,
                                  bool has_bias, const Epilogue& epilogue, const memory::desc& matmul_weights,
                                  const std::function<memory::desc()>& prefill_weights, bool rows_otherwise) {
  // one activation, applied after the sum: act(x @ W + bias), or post_act(x @ W + bias + residual); a gate
  // multiplies before the sum, so after no activation
  const bool one_activation = epilogue.scale == 1.f && (epilogue.act.none() || !epilogue.residual);
  const bool gate_first = epilogue.gate.empty() || epilogue.act.none();
  if (m < 1 || m > GemvMaxRows() || k < 1 || n < 1 || !one_activation || !gate_first) return nullptr;
  GemvShape s;
  memory::desc want = matmul_weights;
  std::tie(s.width, s.k_block) = PanelLayout(want, k, n);
  if (s.width == 0 && prefill_weights) {  // the matmul's copy is no panels: the prefill's, where it is panels
    want = prefill_weights();
    std::tie(s.width, s.k_block) = PanelLayout(want, k, n);
  }
  if (s.width == 0 && rows_otherwise) {  // [N, K] rows: oneDNN's sgemm's copy, or (an NK weight) the weight itself
    want = StridedDesc({k, n}, {1, k});
    s.width = kMaxPanel;
    s.rows_form = true;
  }
  if (s.width == 0) return nullptr;  // a layout the panels cannot read: the matmul keeps it
  s.m = m;
  s.k = k;
  s.n = n;
  s.has_bias = has_bias;
  s.gate = !epilogue.gate.empty();
  s.residual = epilogue.residual;
  s.threads = ctx.threads;
  const memory::desc wei_view = nk ? StridedDesc({k, n}, {1, k}) : PlainDesc({k, n});
  return std::make_unique<GemvDenseKernel>(ctx, s, wei_view, want, ActivationAfter(epilogue));
}

}  // namespace byoc_hetero
