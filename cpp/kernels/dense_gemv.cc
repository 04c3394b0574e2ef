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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "simd_isa.h"

namespace byoc_hetero {

namespace {

constexpr int64_t kSlice = 16;   // columns of one AVX-512 vector; panels are 1..4 slices wide
constexpr int64_t kMaxPanel = 64;  // the widest panel (BA16a64b)
constexpr int kMaxRows = 4;        // rows one micro-kernel call keeps in registers
constexpr int64_t kPrefetchBytes = 2048;  // software prefetch distance along a panel

/*! \brief One micro-kernel call: rows [0, rows) of x times one panel of ldw columns, into out [rows][ldw]. */
struct PanelJob {
  const float* x;  // row stride k
  const float* w;  // the panel: k rows of ldw floats
  int64_t k, ldw, rows;
  float* out;      // row stride ldw
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

/*! \brief AVX2 + FMA: one 16-column slice of the panel (two vectors a row), two k at a time. */
template <int R>
__attribute__((target("avx2,fma"))) void Slice256(const PanelJob& j, int64_t c0) {
  __m256 acc[R][2][2];  // [row][k parity][half]: 16 registers at R = 4
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int u = 0; u < 2; ++u) acc[r][u][0] = acc[r][u][1] = _mm256_setzero_ps();
  const float* w0 = j.w + c0;
  int64_t kk = 0;
  for (; kk + 2 <= j.k; kk += 2) {
    __m256 w[2][2];
#pragma GCC unroll 2
    for (int u = 0; u < 2; ++u) {
      w[u][0] = _mm256_loadu_ps(w0 + (kk + u) * j.ldw);
      w[u][1] = _mm256_loadu_ps(w0 + (kk + u) * j.ldw + 8);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
      for (int u = 0; u < 2; ++u) {
        const __m256 xv = _mm256_set1_ps(j.x[r * j.k + kk + u]);
        acc[r][u][0] = _mm256_fmadd_ps(xv, w[u][0], acc[r][u][0]);
        acc[r][u][1] = _mm256_fmadd_ps(xv, w[u][1], acc[r][u][1]);
      }
    }
  }
  for (; kk < j.k; ++kk) {
    const __m256 wa = _mm256_loadu_ps(w0 + kk * j.ldw), wb = _mm256_loadu_ps(w0 + kk * j.ldw + 8);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_set1_ps(j.x[r * j.k + kk]);
      acc[r][0][0] = _mm256_fmadd_ps(xv, wa, acc[r][0][0]);
      acc[r][0][1] = _mm256_fmadd_ps(xv, wb, acc[r][0][1]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(j.out + r * j.ldw + c0, _mm256_add_ps(acc[r][0][0], acc[r][1][0]));
    _mm256_storeu_ps(j.out + r * j.ldw + c0 + 8, _mm256_add_ps(acc[r][0][1], acc[r][1][1]));
  }
}

/*! \brief Portable C++: one 16-column slice of the panel. */
template <int R>
void SliceGeneric(const PanelJob& j, int64_t c0) {
  float acc[R][kSlice] = {};
  for (int64_t kk = 0; kk < j.k; ++kk) {
    const float* w = j.w + kk * j.ldw + c0;
    for (int r = 0; r < R; ++r) {
      const float xv = j.x[r * j.k + kk];
      for (int c = 0; c < kSlice; ++c) acc[r][c] += xv * w[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kSlice; ++c) j.out[r * j.ldw + c0 + c] = acc[r][c];
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
/*! \brief AVX2 and generic C++: the panel's 16-column slices one after another. */
template <int R>
struct Avx2K {
  static void Run(const PanelJob& j) {
    for (int64_t c0 = 0; c0 < j.ldw; c0 += kSlice) Slice256<R>(j, c0);
  }
};
template <int R>
struct GenericK {
  static void Run(const PanelJob& j) {
    for (int64_t c0 = 0; c0 < j.ldw; c0 += kSlice) SliceGeneric<R>(j, c0);
  }
};

/*! \brief The micro-kernel of \p isa for panels of \p width columns (16, 32, 48 or 64). */
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
      return ByRows<Avx2K>;
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
  int64_t width = kMaxPanel;  // columns per panel: BA16a<width>b
  int64_t panels() const { return (n + width - 1) / width; }
  int64_t panel_floats() const { return (k + 15) / 16 * 16 * width; }  // K padded to the layout's 16
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
      fn(PanelJob{x + r0 * s.k, w + t * s.panel_floats(), s.k, s.width, rows, out});
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

/*! \brief The activation after the GEMV's sum (act without a residual, post_act after one), or none. */
const Activation& ActivationAfter(const Epilogue& e) { return e.residual ? e.post_act : e.act; }

class GemvDenseKernel : public Kernel {
 public:
  GemvDenseKernel(const KernelContext& ctx, const GemvShape& s, const memory::desc& wei_view,
                  const memory::desc& wei_want, const Activation& act)
      : label_(ctx.where()), s_(s), isa_(SelectSimdIsa("BYOC_HETERO_GEMV_ISA")) {
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
    const PanelFn fn = FindPanelFn(isa_, s.width);
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

/*! \brief The panel width of \p want when it is BA16a<16 | 32 | 48 | 64>b of [k, n] f32, else 0. */
int64_t PanelWidth(const memory::desc& want, int64_t k, int64_t n) {
  using tag = memory::format_tag;
  const std::pair<tag, int64_t> layouts[] = {{tag::BA16a64b, 64}, {tag::BA16a48b, 48}, {tag::BA16a32b, 32}, {tag::BA16a16b, 16}};
  for (const auto& [layout, width] : layouts) {
    if (want == memory::desc({k, n}, memory::data_type::f32, layout)) return width;
  }
  return 0;
}

}  // namespace

std::unique_ptr<Kernel> GemvDense(const KernelContext& ctx, int64_t m, int64_t k, int64_t n, bool nk,
                                  bool has_bias, const Epilogue& epilogue, const memory::desc& matmul_weights) {
  // one activation, applied after the sum: act(x @ W + bias), or post_act(x @ W + bias + residual); a gate
  // multiplies before the sum, so after no activation
  const bool one_activation = epilogue.scale == 1.f && (epilogue.act.none() || !epilogue.residual);
  const bool gate_first = epilogue.gate.empty() || epilogue.act.none();
  if (m < 1 || m > GemvMaxRows() || k < 1 || n < 1 || !one_activation || !gate_first) return nullptr;
  GemvShape s;
  s.width = PanelWidth(matmul_weights, k, n);
  if (s.width == 0) return nullptr;  // a layout the panels cannot read: the matmul keeps it
  s.m = m;
  s.k = k;
  s.n = n;
  s.has_bias = has_bias;
  s.gate = !epilogue.gate.empty();
  s.residual = epilogue.residual;
  s.threads = ctx.threads;
  const memory::desc wei_view = nk ? StridedDesc({k, n}, {1, k}) : PlainDesc({k, n});
  return std::make_unique<GemvDenseKernel>(ctx, s, wei_view, matmul_weights, ActivationAfter(epilogue));
}

}  // namespace byoc_hetero
