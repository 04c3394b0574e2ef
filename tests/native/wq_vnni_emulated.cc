// The integer micro-kernels of dense_wq (cpp/kernels/dense_wq_int8.cc) that the CPU running the tests does
// not select: the VNNI ones on a CPU without VNNI, the AVX-512BW ones on a CPU with it (SelectIntDot takes VNNI
// wherever the CPU has it), the AVX2 ones.  The file is compiled here with _mm512_dpbusd_epi32 replaced by an
// exact scalar emulation (u8 x s8, four products a 32-bit lane, summed without saturation), and each kernel
// (VNNI emulated, AVX-512BW, AVX2; bits 8 / 4, blocks 32 / 64 / 128, 1-4 rows, with and without zero points) is
// compared with the portable C++ kernel on the same quantized activations.  Built and run by
// tests/test_weight_only.py::test_vnni_kernels_with_emulated_vpdpbusd (on an AVX-512BW CPU); exit status 1 on a
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
#include "kernels/dense_wq_int8.cc"

#include <cmath>
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

int main() {
  std::mt19937 rng(1);
  int cases = 0, bad = 0;
  for (IntDot kernel : {IntDot::kAvx512Vnni, IntDot::kAvx512Bw, IntDot::kAvx2})
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
  std::printf("VNNI (emulated vpdpbusd), AVX-512BW and AVX2 kernels vs the portable ones: %d of %d cases differ\n",
              bad, cases);
  return bad != 0;
}
