/*!
 * \file kernels/unary.cc
 * \brief unary: elementwise functions oneDNN 3.2 has no eltwise algorithm for, host kernels.
 *
 * Attrs: algorithm "erf" (required).  float32, any rank, plain layout.  (sqrt, exp, log, abs,
 * negative, rsqrt, square have oneDNN eltwise algorithms: they are activation names, run by
 * eltwise.cc or fused as post-ops.)
 */
#include "unary.h"

#include <algorithm>
#include <cmath>
#include <utility>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernel.h"

namespace byoc_hetero {

namespace {

#if defined(__x86_64__)
/*! \brief exp(y) of 8 floats for y in [-16, 0]: y = n ln2 + r, |r| <= ln2 / 2, a degree-7 Taylor
 *         polynomial of exp(r) (truncation 6e-9 relative), times 2^n built in the exponent bits. */
__attribute__((target("avx2,fma"))) inline __m256 ExpNegEight(__m256 y) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), y);  // ln2 in two parts (Cody-Waite)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040);
  for (float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/*!
 * \brief erf of 8 floats, absolute error below 2e-7 (1.5e-7 of Abramowitz & Stegun 7.1.26 for
 *        |x| >= 0.5, plus rounding), relative error 1e-7 below 0.5 (Taylor series of degree 11).
 *        std::erf is a libm call per element: the erf of GELU's [197, 3072] ran 6-9 ms a call, 18%
 *        of a 2-layer int8 ViT at 1 thread (session 2 of issue 24).  NaN stays NaN.
 */
__attribute__((target("avx2,fma"))) inline __m256 ErfEight(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.f));
  const __m256 a = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), x), _mm256_set1_ps(4.f));  // NaN -> 4
  const __m256 z = _mm256_mul_ps(a, a);
  // |x| < 0.5: 2/sqrt(pi) x (1 - z/3 + z^2/10 - z^3/42 + z^4/216 - z^5/1320)
  __m256 s = _mm256_set1_ps(-1.f / 1320);
  for (float c : {1.f / 216, -1.f / 42, 1.f / 10, -1.f / 3, 1.f}) s = _mm256_fmadd_ps(s, z, _mm256_set1_ps(c));
  s = _mm256_mul_ps(_mm256_mul_ps(s, a), _mm256_set1_ps(1.12837917f));
  // |x| >= 0.5: 1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-x^2), t = 1 / (1 + p |x|)
  const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_fmadd_ps(a, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.f)));
  __m256 q = _mm256_set1_ps(1.061405429f);
  for (float c : {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f}) q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(c));
  const __m256 l = _mm256_fnmadd_ps(_mm256_mul_ps(q, t), ExpNegEight(_mm256_sub_ps(_mm256_setzero_ps(), z)),
                                    _mm256_set1_ps(1.f));
  __m256 v = _mm256_blendv_ps(l, s, _mm256_cmp_ps(a, _mm256_set1_ps(0.5f), _CMP_LT_OQ));
  v = _mm256_or_ps(v, sign);
  return _mm256_blendv_ps(v, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN in, NaN out
}

__attribute__((target("avx2,fma"))) int64_t ErfAvx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, ErfEight(_mm256_loadu_ps(x + i)));
  return i;
}

bool HaveAvx2Fma() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have;
}
#endif

}  // namespace

void ErfRun(const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HaveAvx2Fma()) i = ErfAvx2(x, y, n);
#endif
  for (; i < n; ++i) y[i] = std::erf(x[i]);
}

static std::unique_ptr<Kernel> BuildUnary(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  attrs.Choice("algorithm", {"erf"}, "");
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  ctx.ExpectOutputShape(ctx.input(0).shape);
  if (ctx.input(0).dtype != DType::kFloat32 || ctx.output().dtype != DType::kFloat32) {
    ctx.Fail("erf runs on float32 only");
  }
  const int64_t n = ctx.input(0).numel();
  HostFn fn = [n](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    float* y = static_cast<float*>(p[1]);
    constexpr int64_t kBlock = 16384;  // one OpenMP team only for large tensors (see quantize.cc)
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t b = 0; b < blocks; ++b) ErfRun(x + b * kBlock, y + b * kBlock, std::min(kBlock, n - b * kBlock));
  };
  const memory::desc md = PlainDescOf(ctx.input(0));
  return std::make_unique<HostKernel>(ctx.where(), "unary", std::move(fn), std::vector<memory::desc>{md}, md);
}

BYOC_HETERO_REGISTER_KERNEL("unary", BuildUnary);

}  // namespace byoc_hetero
