// The integer micro-kernels of dense_wq (cpp/kernels/dense_wq_int8.cc) that the CPU running the tests may not
// select: the VNNI ones on a CPU without VNNI (compiled here with _mm512_dpbusd_epi32 (AVX-512 VNNI) and
// _mm256_dpbusd_avx_epi32 (AVX-VNNI) replaced by an exact scalar emulation: u8 x s8, four products a 32-bit lane,
// summed without saturation), the AVX-512BW and AVX2 ones on a CPU with VNNI (SelectIntDot takes VNNI wherever the
// CPU has it). Each kernel (bits 8 / 4, blocks 32 / 64 / 128, 1-4 rows, with and without zero points) is compared
// with the portable C++ kernel on the same quantized activations.
// Built and run by tests/test_weight_only.py::test_vnni_kernels_with_emulated_vpdpbusd; exit status 1 on a
// mismatch.
#include <immintrin.h>

#include <cstdint>

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static inline __m512i EmulatedDpbusd(__m512i acc, __m512i u,
                                                                                          __m512i s) {
  alignas(64) uint8_t ub[64];
  alignas(64) int8_t sb[64];
  alignas(64) int32_t ab[16];
  _mm512_store_si512(ub, u);
  _mm512_store_si512(sb, s);
  _mm512_store_si512(ab, acc);
  for (int l = 0; l < 16; ++l)
    for (int i = 0; i < 4; ++i) ab[l] += static_cast<int32_t>(ub[4 * l + i]) * static_cast<int32_t>(sb[4 * l + i]);
  return _mm512_load_si512(ab);
}
#define _mm512_dpbusd_epi32 EmulatedDpbusd

// AVX-VNNI's 256-bit form, the same sums on 8 lanes
__attribute__((target("avx2,avxvnni"))) static inline __m256i EmulatedDpbusd256(__m256i acc, __m256i u, __m256i s) {
  alignas(32) uint8_t ub[32];
  alignas(32) int8_t sb[32];
  alignas(32) int32_t ab[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(ub), u);
  _mm256_store_si256(reinterpret_cast<__m256i*>(sb), s);
  _mm256_store_si256(reinterpret_cast<__m256i*>(ab), acc);
  for (int l = 0; l < 8; ++l)
    for (int i = 0; i < 4; ++i) ab[l] += static_cast<int32_t>(ub[4 * l + i]) * static_cast<int32_t>(sb[4 * l + i]);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(ab));
}
#define _mm256_dpbusd_avx_epi32 EmulatedDpbusd256
#include "kernels/dense_wq_int8.cc"

#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>
#include <vector>

using byoc_hetero::wq::FindQTileFn;
using byoc_hetero::wq::IntDot;
using byoc_hetero::wq::kActBlock;
using byoc_hetero::wq::QTileJob;

/*! \brief Max |kernel - generic| over the largest |generic| for one case (codes, scales, zero points random). */
static float Compare(std::mt19937& rng, IntDot kernel, int bits, int64_t block, int rows, bool zp) {
  const int64_t k = 256, xb = k / kActBlock, blocks = k / block;
  std::vector<uint8_t> codes(k * 16 * bits / 8);
  for (auto& c : codes) c = static_cast<uint8_t>(rng() & 0xFF);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * k), xs(rows * xb), xss(rows * xb), scales(blocks * 16), zeros(blocks * 16);
  std::vector<float> vnni(64), generic(64);
  for (auto& v : x) v = normal(rng);
  for (auto& v : scales) v = normal(rng);
  for (auto& v : zeros) v = static_cast<float>(rng() % (1u << bits));
  std::vector<int8_t> xq(rows * k);
  byoc_hetero::wq::QuantizeRows(x.data(), rows, k, xq.data(), xs.data(), xss.data());
  QTileJob job{xq.data(), xs.data(), xss.data(), codes.data(), scales.data(), zp ? zeros.data() : nullptr,
               bits == 8 ? 128.f : 8.f, k, block, rows, vnni.data()};
  FindQTileFn(kernel, bits)(job);
  job.out = generic.data();
  FindQTileFn(IntDot::kGeneric, bits)(job);
  float worst = 0.f, scale = 0.f;
  for (int i = 0; i < rows * 16; ++i) {
    worst = std::max(worst, std::fabs(vnni[i] - generic[i]));
    scale = std::max(scale, std::fabs(generic[i]));
  }
  return scale > 0.f ? worst / scale : 1.f;
}

/*! \brief Whether QuantizeRows in the registers of \p dot gives the portable loops' bytes and floats, bit for bit, on
 *         rows of normal values, ties (codes at exactly .5 before rounding), zeros, subnormals, a block with a NaN and
 *         one with an infinity. */
static bool SameQuantizedRows(std::mt19937& rng, IntDot dot) {
  const int64_t rows = 3, k = 256, xb = k / kActBlock;
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * k);
  for (auto& v : x) v = normal(rng) * 4.f;
  for (int64_t i = 0; i < kActBlock; ++i) x[kActBlock + i] = i == 0 ? 127.f : static_cast<float>(i - 16) + 0.5f;
  for (int64_t i = 0; i < kActBlock; ++i) x[2 * kActBlock + i] = 0.f;
  for (int64_t i = 0; i < kActBlock; ++i) x[4 * kActBlock + i] = 1e-39f * static_cast<float>(i % 5 - 2);  // 127 / max overflows
  x[3 * kActBlock + 5] = NAN;
  x[k + 7] = -INFINITY;
  std::vector<int8_t> q0(rows * k), q1(rows * k);
  std::vector<float> s0(rows * xb), s1(rows * xb), ss0(rows * xb), ss1(rows * xb);
  byoc_hetero::wq::QuantizeRows(x.data(), rows, k, q0.data(), s0.data(), ss0.data(), IntDot::kGeneric);
  byoc_hetero::wq::QuantizeRows(x.data(), rows, k, q1.data(), s1.data(), ss1.data(), dot);
  auto same = [](const auto& a, const auto& b) { return std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0; };
  return same(q0, q1) && same(s0, s1) && same(ss0, ss1);
}

int main() {
  std::mt19937 rng(1);
  int cases = 0, bad = 0;
  for (IntDot kernel : {IntDot::kAvx512Vnni, IntDot::kAvx2Vnni, IntDot::kAvx512Bw, IntDot::kAvx2})
    for (int bits : {8, 4})
      for (int64_t block : {32, 64, 128})
        for (int rows = 1; rows <= 4; ++rows)
          for (bool zp : {false, true}) {
            const float err = Compare(rng, kernel, bits, block, rows, zp);
            ++cases;
            if (err > 1e-5f) {
              ++bad;
              std::printf("%s bits %d block %ld rows %d zero points %d: relative error %g\n",
                          byoc_hetero::wq::IntDotName(kernel), bits, static_cast<long>(block), rows,
                          static_cast<int>(zp), err);
            }
          }
  std::printf("VNNI (emulated vpdpbusd), AVX-512BW and AVX2 kernels vs the portable ones: %d of %d cases differ\n", bad,
              cases);
  int rows_bad = 0;
  for (IntDot dot : {IntDot::kAvx512Bw, IntDot::kAvx2})
    for (int rep = 0; rep < 4; ++rep) rows_bad += SameQuantizedRows(rng, dot) ? 0 : 1;
  std::printf("quantized rows (AVX-512, AVX2) vs the portable loops: %d of 8 differ\n", rows_bad);
  return bad != 0 || rows_bad != 0;
}
