/*!
 * \file kernels/dense_wq_int8.cc
 * \brief The int8-activation micro-kernels of dense_wq (dense_wq.h): the data rows quantized per
 *        block of 32 along K, integer dot products with the weight codes in the quad layout, one
 *        float multiply per 32 k and column.  AVX-512 VNNI (VPDPBUSD), AVX-512BW and AVX2
 *        (VPMADDUBSW + VPMADDWD) and portable C++, each with its own target attribute; the choice is
 *        made at run time (SelectIntDot).
 */
#include <immintrin.h>

// GCC 12's "'__Y' may be used uninitialized" inside avx512fintrin.h: a false positive of the headers
// (as in dense_wq_micro.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dense_wq.h"

namespace byoc_hetero {
namespace wq {

namespace {

constexpr int64_t kQuadBytes = 64;  // one quad of a tile: 16 columns x 4 bytes

/*! \brief 4 activation codes as one 32-bit lane value. */
inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// ---- AVX-512BW, with or without VNNI: one 16-lane int32 accumulator per row ---------------------
// One target for both (VNNI's instruction is used only where Vnni is true; the BW kernels are
// checked for it by tests/test_weight_only.py running them on a CPU without VNNI).

#define WQ_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

/*! \brief acc[r] += sum over one activation block (32 k) of x * (code - bias), 8-bit codes: the BW form
 *         computes w * x with w = code - 128 (|w| unsigned times x with w's sign), the VNNI one code * x. */
template <int R, bool Vnni>
WQ_AVX512_TARGET inline const uint8_t* Dot512x8(const uint8_t* q, const int8_t* x, int64_t ldx, __m512i* acc) {
  const __m512i ones = _mm512_set1_epi16(1), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int g = 0; g < kActBlock / 4; ++g, q += kQuadBytes) {
    const __m512i w = _mm512_loadu_si512(q);
    if constexpr (Vnni) {
      const __m512i u = _mm512_xor_si512(w, flip);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_dpbusd_epi32(acc[r], u, _mm512_set1_epi32(Load4(x + r * ldx + 4 * g)));
    } else {
      const __m512i aw = _mm512_abs_epi8(w);
      const __mmask64 neg = _mm512_movepi8_mask(w);
      for (int r = 0; r < R; ++r) {
        const __m512i xb = _mm512_set1_epi32(Load4(x + r * ldx + 4 * g));
        const __m512i sx = _mm512_mask_sub_epi8(xb, neg, _mm512_setzero_si512(), xb);
        acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), ones));
      }
    }
  }
  return q;
}

/*! \brief The same for 4-bit codes (unsigned, 0..15): the BW form sums the block's 8 pair products
 *         per 16-bit lane first (at most 8 * 2 * 15 * 127 < 2^15), then widens once. */
template <int R, bool Vnni>
WQ_AVX512_TARGET inline const uint8_t* Dot512x4(const uint8_t* q, const int8_t* x, int64_t ldx, __m512i* acc) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i p16[R];
  for (int r = 0; r < R; ++r) p16[r] = _mm512_setzero_si512();
  for (int g = 0; g < kActBlock / 8; ++g, q += kQuadBytes) {
    const __m512i w = _mm512_loadu_si512(q);
    const __m512i lo = _mm512_and_si512(w, low), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    for (int r = 0; r < R; ++r) {
      const __m512i x0 = _mm512_set1_epi32(Load4(x + r * ldx + 8 * g));
      const __m512i x1 = _mm512_set1_epi32(Load4(x + r * ldx + 8 * g + 4));
      if constexpr (Vnni) {
        acc[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[r], lo, x0), hi, x1);
      } else {
        p16[r] = _mm512_add_epi16(p16[r], _mm512_add_epi16(_mm512_maddubs_epi16(lo, x0), _mm512_maddubs_epi16(hi, x1)));
      }
    }
  }
  if constexpr (!Vnni) {
    for (int r = 0; r < R; ++r) acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(p16[r], _mm512_set1_epi16(1)));
  }
  return q;
}

/*! \brief Block b's 16 column scales: float16 widened in the register, or float32. */
WQ_AVX512_TARGET inline __m512 Scales512(const QTileJob& j, int64_t b) {
  if (j.half_scales != nullptr) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(j.half_scales + b * kTile)));
  }
  return _mm512_loadu_ps(j.scales + b * kTile);
}

template <int Bits, int R, bool Vnni>
WQ_AVX512_TARGET void Tile512Q(const QTileJob& j) {
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t per = j.block / kActBlock, xblocks = j.k / kActBlock;
  const float bias = Bits == 8 && !Vnni ? 128.f : 0.f;  // the BW form's codes are code - 128
  for (int64_t b = 0; b < j.k / j.block; ++b) {
    const __m512 z = _mm512_sub_ps(j.zeros != nullptr ? _mm512_loadu_ps(j.zeros + b * kTile) : _mm512_set1_ps(j.zero),
                                   _mm512_set1_ps(bias));
    const __m512 s = Scales512(j, b);
    for (int64_t a = b * per; a < (b + 1) * per; ++a) {
      __m512i acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
      q = Bits == 8 ? Dot512x8<R, Vnni>(q, j.xq + a * kActBlock, j.k, acc)
                    : Dot512x4<R, Vnni>(q, j.xq + a * kActBlock, j.k, acc);
      for (int r = 0; r < R; ++r) {  // total += s * sx * (acc - z * sum q_x)
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_set1_ps(j.xs[r * xblocks + a]));
        total[r] = _mm512_fmadd_ps(_mm512_fnmadd_ps(z, _mm512_set1_ps(j.xss[r * xblocks + a]), v), s, total[r]);
        if (j.offsets != nullptr) {  // + o * sum x (the block's activations as quantized)
          total[r] = _mm512_fmadd_ps(_mm512_loadu_ps(j.offsets + b * kTile), _mm512_set1_ps(j.xss[r * xblocks + a]),
                                     total[r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(j.out + r * kTile, total[r]);
}

// ---- AVX2: two 8-lane int32 accumulators per row (columns 0-7, 8-15) ----------------------------

#define WQ_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))  // every AVX2 CPU has F16C

/*! \brief Columns 8h..8h+7 of block b's scales: float16 widened in the register, or float32. */
WQ_AVX2_TARGET inline __m256 Scales256(const QTileJob& j, int64_t b, int h) {
  if (j.half_scales != nullptr) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(j.half_scales + b * kTile + 8 * h)));
  }
  return _mm256_loadu_ps(j.scales + b * kTile + 8 * h);
}

template <int R>
WQ_AVX2_TARGET inline const uint8_t* Dot256x8(const uint8_t* q, const int8_t* x, int64_t ldx, __m256i (*acc)[2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int g = 0; g < kActBlock / 4; ++g, q += kQuadBytes) {
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * h));
      const __m256i aw = _mm256_abs_epi8(w);
      for (int r = 0; r < R; ++r) {
        const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(Load4(x + r * ldx + 4 * g)), w);
        acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
      }
    }
  }
  return q;
}

template <int R>
WQ_AVX2_TARGET inline const uint8_t* Dot256x4(const uint8_t* q, const int8_t* x, int64_t ldx, __m256i (*acc)[2]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i p16[R][2];
  for (int r = 0; r < R; ++r) p16[r][0] = p16[r][1] = _mm256_setzero_si256();
  for (int g = 0; g < kActBlock / 8; ++g, q += kQuadBytes) {
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * h));
      const __m256i lo = _mm256_and_si256(w, low), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
      for (int r = 0; r < R; ++r) {
        const __m256i x0 = _mm256_set1_epi32(Load4(x + r * ldx + 8 * g));
        const __m256i x1 = _mm256_set1_epi32(Load4(x + r * ldx + 8 * g + 4));
        p16[r][h] = _mm256_add_epi16(p16[r][h],
                                     _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1)));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) acc[r][h] = _mm256_madd_epi16(p16[r][h], _mm256_set1_epi16(1));
  return q;
}

template <int Bits, int R>
WQ_AVX2_TARGET void Tile256Q(const QTileJob& j) {
  __m256 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm256_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t per = j.block / kActBlock, xblocks = j.k / kActBlock;
  const __m256 bias = _mm256_set1_ps(Bits == 8 ? 128.f : 0.f);  // 8-bit codes are code - 128
  for (int64_t b = 0; b < j.k / j.block; ++b) {
    __m256 z[2], s[2];
    for (int h = 0; h < 2; ++h) {
      z[h] = _mm256_sub_ps(j.zeros != nullptr ? _mm256_loadu_ps(j.zeros + b * kTile + 8 * h) : _mm256_set1_ps(j.zero), bias);
      s[h] = Scales256(j, b, h);
    }
    for (int64_t a = b * per; a < (b + 1) * per; ++a) {
      __m256i acc[R][2];
      for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      q = Bits == 8 ? Dot256x8<R>(q, j.xq + a * kActBlock, j.k, acc) : Dot256x4<R>(q, j.xq + a * kActBlock, j.k, acc);
      for (int r = 0; r < R; ++r) {
        const __m256 sx = _mm256_set1_ps(j.xs[r * xblocks + a]), sxs = _mm256_set1_ps(j.xss[r * xblocks + a]);
        for (int h = 0; h < 2; ++h) {
          const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][h]), sx);
          total[r][h] = _mm256_fmadd_ps(_mm256_fnmadd_ps(z[h], sxs, v), s[h], total[r][h]);
          if (j.offsets != nullptr) {
            total[r][h] = _mm256_fmadd_ps(_mm256_loadu_ps(j.offsets + b * kTile + 8 * h), sxs, total[r][h]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(j.out + r * kTile, total[r][0]);
    _mm256_storeu_ps(j.out + r * kTile + 8, total[r][1]);
  }
}

// ---- portable C++: the quad layout read code by code --------------------------------------------

/*! \brief The unsigned code of column c at k (0 <= k < K) in a tile of the quad layout. */
template <int Bits>
int QuadCode(const uint8_t* tile, int64_t k, int c) {
  if constexpr (Bits == 8) return tile[(k / 4) * kQuadBytes + c * 4 + k % 4] ^ 0x80;
  return (tile[(k / 8) * kQuadBytes + c * 4 + k % 4] >> (4 * ((k % 8) / 4))) & 0x0F;
}

template <int Bits>
void TileGenericQ(const QTileJob& j) {
  const int64_t xblocks = j.k / kActBlock;
  for (int64_t r = 0; r < j.rows; ++r) {
    float total[kTile] = {};
    for (int64_t a = 0; a < xblocks; ++a) {
      const int64_t b = a * kActBlock / j.block;
      int32_t acc[kTile] = {};
      for (int64_t k = a * kActBlock; k < (a + 1) * kActBlock; ++k)
        for (int c = 0; c < kTile; ++c) acc[c] += j.xq[r * j.k + k] * QuadCode<Bits>(j.codes, k, c);
      for (int c = 0; c < kTile; ++c) {
        const float z = j.zeros != nullptr ? j.zeros[b * kTile + c] : j.zero;
        const float s = j.half_scales != nullptr ? HalfToFloat(j.half_scales[b * kTile + c]) : j.scales[b * kTile + c];
        total[c] += s * (static_cast<float>(acc[c]) * j.xs[r * xblocks + a] - z * j.xss[r * xblocks + a]);
        if (j.offsets != nullptr) total[c] += j.offsets[b * kTile + c] * j.xss[r * xblocks + a];
      }
    }
    std::copy(total, total + kTile, j.out + r * kTile);
  }
}

/*! \brief Dispatches a job's row count (1..kMaxRows) to the kernel instantiated for it. */
template <int Bits, bool Vnni>
void ByRows512(const QTileJob& j) {
  switch (j.rows) {
    case 1: return Tile512Q<Bits, 1, Vnni>(j);
    case 2: return Tile512Q<Bits, 2, Vnni>(j);
    case 3: return Tile512Q<Bits, 3, Vnni>(j);
    default: return Tile512Q<Bits, 4, Vnni>(j);
  }
}
template <int Bits>
void ByRows256(const QTileJob& j) {
  switch (j.rows) {
    case 1: return Tile256Q<Bits, 1>(j);
    case 2: return Tile256Q<Bits, 2>(j);
    case 3: return Tile256Q<Bits, 3>(j);
    default: return Tile256Q<Bits, 4>(j);
  }
}

bool CpuHas(const char* feature) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (std::strcmp(feature, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
  if (std::strcmp(feature, "avx512vnni") == 0) return __builtin_cpu_supports("avx512vnni");
#endif
  return false;
}

}  // namespace

const char* IntDotName(IntDot dot) {
  switch (dot) {
    case IntDot::kAvx512Vnni: return "avx512 vnni";
    case IntDot::kAvx512Bw: return "avx512bw";
    case IntDot::kAvx2: return "avx2";
    case IntDot::kGeneric: return "generic";
    default: return "none";
  }
}

IntDot SelectIntDot(Isa isa, int64_t block) {
  const char* env = std::getenv(kActVariable);
  const std::string mode = env == nullptr || *env == '\0' ? "auto" : env;
  if (mode != "auto" && mode != "int8" && mode != "f32") {
    TVM_FFI_THROW(ValueError) << kActVariable << " must be auto, int8 or f32, got '" << mode << "'";
  }
  const char* vnni_env = std::getenv(kVnniVariable);
  const std::string vnni = vnni_env == nullptr || *vnni_env == '\0' ? "auto" : vnni_env;
  if (vnni != "auto" && vnni != "0") {
    TVM_FFI_THROW(ValueError) << kVnniVariable << " must be auto or 0, got '" << vnni << "'";
  }
  if (mode == "f32" || block % kActBlock != 0) return IntDot::kNone;
  if (isa == Isa::kAvx512 && CpuHas("avx512bw")) {
    return vnni == "auto" && CpuHas("avx512vnni") ? IntDot::kAvx512Vnni : IntDot::kAvx512Bw;
  }
  if (isa == Isa::kAvx512 || isa == Isa::kAvx2) return IntDot::kAvx2;  // every AVX-512F CPU has AVX2
  return IntDot::kGeneric;
}

PanelForm PanelsAsked() {
  const char* env = std::getenv(kPanelVariable);
  const std::string form = env == nullptr ? "" : env;
  PanelForm asked = PanelForm::kNone;
  if (form == "1" || form == "float") {
    asked = PanelForm::kFloat;
  } else if (form == "int") {
    asked = PanelForm::kInt;
  } else if (!form.empty() && form != "0") {
    TVM_FFI_THROW(ValueError) << kPanelVariable << " must be 0, 1 (or float) or int, got '" << form << "'";
  }
  const char* act = std::getenv(kActVariable);
  const bool act_auto = act == nullptr || *act == '\0' || std::string(act) == "auto";
  return act_auto ? asked : PanelForm::kNone;
}

QTileFn FindQTileFn(IntDot dot, int bits) {
  switch (dot) {
    case IntDot::kAvx512Vnni: return bits == 8 ? ByRows512<8, true> : ByRows512<4, true>;
    case IntDot::kAvx512Bw: return bits == 8 ? ByRows512<8, false> : ByRows512<4, false>;
    case IntDot::kAvx2: return bits == 8 ? ByRows256<8> : ByRows256<4>;
    default: return bits == 8 ? TileGenericQ<8> : TileGenericQ<4>;
  }
}

void QuantizeRows(const float* x, int64_t rows, int64_t k, int8_t* xq, float* xs, float* xss) {
  // round half to even without a libm call: adding and subtracting 1.5 * 2^23 rounds |v| < 2^22 to an
  // integer in the default rounding mode (the loops vectorize; the file is built without fast-math)
  constexpr float kMagic = 12582912.f;
  const int64_t xblocks = k / kActBlock;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t a = 0; a < xblocks; ++a) {
      const float* src = x + r * k + a * kActBlock;
      int8_t* dst = xq + r * k + a * kActBlock;
      float amax = 0.f, probe = 0.f;  // probe: NaN when the block holds a NaN or an infinity
      for (int64_t i = 0; i < kActBlock; ++i) {
        amax = std::max(amax, std::fabs(src[i]));
        probe += src[i] * 0.f;
      }
      const bool finite = probe == 0.f;
      const float inv = amax > 0.f && finite ? 127.f / amax : 0.f;
      int32_t sum = 0;
      for (int64_t i = 0; i < kActBlock; ++i) {
        const int32_t v = static_cast<int32_t>((src[i] * inv + kMagic) - kMagic);
        dst[i] = static_cast<int8_t>(v);
        sum += v;
      }
      const float scale = finite ? amax / 127.f : NAN;  // a NaN or infinite input gives NaN outputs, as the float path's do
      xs[r * xblocks + a] = scale;
      xss[r * xblocks + a] = scale * static_cast<float>(sum);
    }
  }
}

}  // namespace wq
}  // namespace byoc_hetero
