/*!
 * \file kernels/dense_wq_micro.cc
 * \brief The micro-kernels of dense_wq (dense_wq.h): one tile of 16 columns times up to kMaxRows
 *        rows, codes unpacked to float32 in registers.  Each ISA's functions carry their own
 *        target attribute, so the extension is built for any x86-64 and SelectIsa picks at run time.
 */
#include <immintrin.h>

#include <cstdlib>
#include <string>

#include <tvm/ffi/error.h>
#include "dense_wq.h"

namespace byoc_hetero {
namespace wq {

namespace {

/*! \brief Bytes of codes per k in a tile. */
template <int Bits>
constexpr int64_t kStep = Bits == 8 ? kTile : kTile / 2;

// ---- AVX-512F: one 16-float vector per tile row ------------------------------------------------

template <int Bits>
__attribute__((target("avx512f"))) inline __m512 Codes512(const uint8_t* p) {
  if constexpr (Bits == 8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));  // columns 0..15 in order
  }
}

template <int Bits, int R>
__attribute__((target("avx512f"))) void Tile512(const TileJob& j) {
  constexpr int U = 4;  // k unrolled into independent accumulators (the FMA latency of one row)
  constexpr int64_t step = kStep<Bits>;
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t blocks = j.k / j.block;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 z = j.zeros != nullptr ? _mm512_loadu_ps(j.zeros + b * kTile) : _mm512_set1_ps(j.zero);
    __m512 acc[R][U];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
    const float* x = j.x + b * j.block;
    int64_t kk = 0;
    for (; kk + U <= j.block; kk += U, q += U * step) {
      __m512 w[U];
      for (int u = 0; u < U; ++u) w[u] = _mm512_sub_ps(Codes512<Bits>(q + u * step), z);
      for (int r = 0; r < R; ++r)
        for (int u = 0; u < U; ++u) acc[r][u] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * j.k + kk + u]), w[u], acc[r][u]);
    }
    for (; kk < j.block; ++kk, q += step) {
      const __m512 w = _mm512_sub_ps(Codes512<Bits>(q), z);
      for (int r = 0; r < R; ++r) acc[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * j.k + kk]), w, acc[r][0]);
    }
    const __m512 s = _mm512_loadu_ps(j.scales + b * kTile);
    for (int r = 0; r < R; ++r) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
      total[r] = _mm512_fmadd_ps(sum, s, total[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(j.out + r * kTile, total[r]);
}

// ---- AVX2 + FMA: two 8-float vectors per tile row -----------------------------------------------

template <int Bits>
__attribute__((target("avx2,fma"))) inline void Codes256(const uint8_t* p, __m256* lo8, __m256* hi8) {
  if constexpr (Bits == 8) {
    *lo8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    *hi8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))));
  } else {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(b, mask), _mm_and_si128(_mm_srli_epi16(b, 4), mask));
    *lo8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
    *hi8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8)));
  }
}

/*! \brief acc[r][u] += x[r * ldx] * (codes at q - z), the 16 columns as two halves. */
template <int Bits, int R>
__attribute__((target("avx2,fma"))) inline void OneK256(const uint8_t* q, const float* x, int64_t ldx, __m256 z0,
                                                      __m256 z1, __m256 (*acc)[2][2], int u) {
  __m256 w0, w1;
  Codes256<Bits>(q, &w0, &w1);
  w0 = _mm256_sub_ps(w0, z0);
  w1 = _mm256_sub_ps(w1, z1);
  for (int r = 0; r < R; ++r) {
    const __m256 xv = _mm256_set1_ps(x[r * ldx]);
    acc[r][u][0] = _mm256_fmadd_ps(xv, w0, acc[r][u][0]);
    acc[r][u][1] = _mm256_fmadd_ps(xv, w1, acc[r][u][1]);
  }
}

template <int Bits, int R>
__attribute__((target("avx2,fma"))) void Tile256(const TileJob& j) {
  constexpr int U = 2;  // 16 registers: R x U x 2 accumulators at most 16 with R <= 4
  constexpr int64_t step = kStep<Bits>;
  __m256 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm256_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t blocks = j.k / j.block;
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 z0 = _mm256_set1_ps(j.zero), z1 = z0;
    if (j.zeros != nullptr) {
      z0 = _mm256_loadu_ps(j.zeros + b * kTile);
      z1 = _mm256_loadu_ps(j.zeros + b * kTile + 8);
    }
    __m256 acc[R][U][2];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < U; ++u) acc[r][u][0] = acc[r][u][1] = _mm256_setzero_ps();
    const float* x = j.x + b * j.block;
    int64_t kk = 0;
    for (; kk + U <= j.block; kk += U, q += U * step) {
      for (int u = 0; u < U; ++u) OneK256<Bits, R>(q + u * step, x + kk + u, j.k, z0, z1, acc, u);
    }
    for (; kk < j.block; ++kk, q += step) OneK256<Bits, R>(q, x + kk, j.k, z0, z1, acc, 0);
    const __m256 s0 = _mm256_loadu_ps(j.scales + b * kTile), s1 = _mm256_loadu_ps(j.scales + b * kTile + 8);
    for (int r = 0; r < R; ++r) {
      total[r][0] = _mm256_fmadd_ps(_mm256_add_ps(acc[r][0][0], acc[r][1][0]), s0, total[r][0]);
      total[r][1] = _mm256_fmadd_ps(_mm256_add_ps(acc[r][0][1], acc[r][1][1]), s1, total[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(j.out + r * kTile, total[r][0]);
    _mm256_storeu_ps(j.out + r * kTile + 8, total[r][1]);
  }
}

// ---- portable C++ (any x86-64: SSE2 baseline, whatever the compiler vectorizes) -----------------

template <int Bits>
inline int Code(const uint8_t* p, int c) {
  if constexpr (Bits == 8) {
    return p[c];
  } else {
    return (p[c / 2] >> (4 * (c % 2))) & 0x0F;
  }
}

template <int Bits, int R>
void TileGeneric(const TileJob& j) {
  constexpr int64_t step = kStep<Bits>;
  float total[R][kTile] = {};
  const uint8_t* q = j.codes;
  for (int64_t b = 0; b < j.k / j.block; ++b) {
    float acc[R][kTile] = {};
    for (int64_t kk = 0; kk < j.block; ++kk, q += step) {
      float w[kTile];
      for (int c = 0; c < kTile; ++c) {
        w[c] = static_cast<float>(Code<Bits>(q, c)) - (j.zeros != nullptr ? j.zeros[b * kTile + c] : j.zero);
      }
      for (int r = 0; r < R; ++r) {
        const float xv = j.x[r * j.k + b * j.block + kk];
        for (int c = 0; c < kTile; ++c) acc[r][c] += xv * w[c];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kTile; ++c) total[r][c] += acc[r][c] * j.scales[b * kTile + c];
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile; ++c) j.out[r * kTile + c] = total[r][c];
}

/*! \brief Dispatches a job's row count (1..kMaxRows) to the kernel instantiated for it. */
template <template <int, int> class K, int Bits>
void ByRows(const TileJob& j) {
  switch (j.rows) {
    case 1:
      return K<Bits, 1>::Run(j);
    case 2:
      return K<Bits, 2>::Run(j);
    case 3:
      return K<Bits, 3>::Run(j);
    default:
      return K<Bits, 4>::Run(j);
  }
}
template <int Bits, int R>
struct Avx512K {
  static void Run(const TileJob& j) { Tile512<Bits, R>(j); }
};
template <int Bits, int R>
struct Avx2K {
  static void Run(const TileJob& j) { Tile256<Bits, R>(j); }
};
template <int Bits, int R>
struct GenericK {
  static void Run(const TileJob& j) { TileGeneric<Bits, R>(j); }
};

bool CpuHas(Isa isa) {
  __builtin_cpu_init();
  if (isa == Isa::kAvx512) return __builtin_cpu_supports("avx512f");
  if (isa == Isa::kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return true;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "generic";
  }
}

Isa SelectIsa() {
  const char* env = std::getenv("BYOC_HETERO_WQ_ISA");
  const std::string cap = env == nullptr || *env == '\0' ? "auto" : env;
  Isa limit = Isa::kAvx512;
  if (cap == "avx2") {
    limit = Isa::kAvx2;
  } else if (cap == "generic") {
    limit = Isa::kGeneric;
  } else if (cap != "auto" && cap != "avx512") {
    TVM_FFI_THROW(ValueError) << "BYOC_HETERO_WQ_ISA must be auto, avx512, avx2 or generic, got '" << cap << "'";
  }
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kGeneric}) {
    if (static_cast<int>(isa) >= static_cast<int>(limit) && CpuHas(isa)) return isa;
  }
  return Isa::kGeneric;
}

TileFn FindTileFn(Isa isa, int bits) {
  switch (isa) {
    case Isa::kAvx512:
      return bits == 8 ? ByRows<Avx512K, 8> : ByRows<Avx512K, 4>;
    case Isa::kAvx2:
      return bits == 8 ? ByRows<Avx2K, 8> : ByRows<Avx2K, 4>;
    default:
      return bits == 8 ? ByRows<GenericK, 8> : ByRows<GenericK, 4>;
  }
}

}  // namespace wq
}  // namespace byoc_hetero
