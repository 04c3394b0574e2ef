/*!
 * \file kernels/dense_wq_qpanel.cc
 * \brief dense_wq's integer panel GEMM for many rows (dense_wq.h, PanelForm::kInt and kIntFused): the int8 activations and
 *        the quad layout of the tile kernels (dense_wq_int8.cc), multiplied as a register tile of kPanelTiles
 *        tiles (32 columns) x kQPanelRows rows.  Per 4 k (8-bit) one weight vector of each tile and one
 *        broadcast activation word of each row feed 12 VPDPBUSD (AVX-512 VNNI) in 12 independent chains; the
 *        tile kernels feed 4 from one weight vector in 4 chains, what a prefill's rows then wait on.  Per
 *        activation block (32 k) each accumulator is scaled into its float32 total by the tile kernels' own
 *        float operations, in their order, so the results are theirs bit for bit; per-channel weights (one
 *        block, no offsets) take Folded512 instead: the scale once after the sum over K.  The AVX-512BW form
 *        (VPMADDUBSW + VPMADDWD, CPUs without VNNI) is the same tile.  Own target attributes: the extension
 *        builds for any x86-64; dense_wq.cc asks for it only where the integer kernel is an AVX-512 one.
 *        With QPanelJob::direct the kernel writes the node's epilogue (bias, gate, residual) into the output itself.
 */
#include <immintrin.h>

// GCC 12's "'__Y' may be used uninitialized" inside avx512fintrin.h: a false positive of the headers
// (as in dense_wq_micro.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstdint>
#include <cstring>

#include "dense_wq.h"

namespace byoc_hetero {
namespace wq {

namespace {

#define WQ_QPANEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,prfchw")))

constexpr int kT = static_cast<int>(kPanelTiles);
constexpr int64_t kQuadBytes = 64;  // one quad of a tile: 16 columns x 4 bytes

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

/*! \brief acc[r][t] = sum over one activation block (32 k) of x_r * code_t, 8-bit codes stored - 128: VNNI flips
 *         them back to the unsigned code; BW multiplies |w| by x with w's sign (w = code - 128). */
template <int R, bool Vnni>
WQ_QPANEL_TARGET inline void Block8(const uint8_t* const* q, const int8_t* x, int64_t ldx, __m512i (*acc)[kT]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80)), ones = _mm512_set1_epi16(1);
  for (int g = 0; g < kActBlock / 4; ++g) {
    __m512i w[kT];
    for (int t = 0; t < kT; ++t) w[t] = _mm512_loadu_si512(q[t] + g * kQuadBytes);
    if constexpr (Vnni) {
      for (int t = 0; t < kT; ++t) w[t] = _mm512_xor_si512(w[t], flip);
      for (int r = 0; r < R; ++r) {
        const __m512i xb = _mm512_set1_epi32(Load4(x + r * ldx + 4 * g));
        for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], w[t], xb);
      }
    } else {
      __mmask64 neg[kT];
      for (int t = 0; t < kT; ++t) {
        neg[t] = _mm512_movepi8_mask(w[t]);
        w[t] = _mm512_abs_epi8(w[t]);
      }
      for (int r = 0; r < R; ++r) {
        const __m512i xb = _mm512_set1_epi32(Load4(x + r * ldx + 4 * g));
        for (int t = 0; t < kT; ++t) {
          const __m512i sx = _mm512_mask_sub_epi8(xb, neg[t], _mm512_setzero_si512(), xb);
          acc[r][t] = _mm512_add_epi32(acc[r][t], _mm512_madd_epi16(_mm512_maddubs_epi16(w[t], sx), ones));
        }
      }
    }
  }
}

/*! \brief The same for 4-bit codes (0..15; per 8 k, k + i in the low nibble, k + 4 + i in the high one): BW
 *         sums the block's pair products per 16-bit lane first (at most 8 * 2 * 15 * 127 < 2^15). */
template <int R, bool Vnni>
WQ_QPANEL_TARGET inline void Block4(const uint8_t* const* q, const int8_t* x, int64_t ldx, __m512i (*acc)[kT]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int g = 0; g < kActBlock / 8; ++g) {
    __m512i lo[kT], hi[kT];
    for (int t = 0; t < kT; ++t) {
      const __m512i w = _mm512_loadu_si512(q[t] + g * kQuadBytes);
      lo[t] = _mm512_and_si512(w, low);
      hi[t] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    }
    for (int r = 0; r < R; ++r) {
      const __m512i x0 = _mm512_set1_epi32(Load4(x + r * ldx + 8 * g));
      const __m512i x1 = _mm512_set1_epi32(Load4(x + r * ldx + 8 * g + 4));
      for (int t = 0; t < kT; ++t) {
        if constexpr (Vnni) {
          acc[r][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[r][t], lo[t], x0), hi[t], x1);
        } else {  // acc holds 16-bit pair sums here, widened by the caller
          acc[r][t] = _mm512_add_epi16(acc[r][t],
                                       _mm512_add_epi16(_mm512_maddubs_epi16(lo[t], x0), _mm512_maddubs_epi16(hi[t], x1)));
        }
      }
    }
  }
  if constexpr (!Vnni) {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_madd_epi16(acc[r][t], _mm512_set1_epi16(1));
  }
}

/*! \brief acc = the products of one activation block (kActBlock k) of R rows with both tiles' codes at q. */
template <int Bits, int R, bool Vnni>
WQ_QPANEL_TARGET inline void BlockProducts(const uint8_t* const* q, const int8_t* x, int64_t ldx, __m512i (*acc)[kT]) {
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_si512();
  if constexpr (Bits == 8) {
    Block8<R, Vnni>(q, x, ldx, acc);
  } else {
    Block4<R, Vnni>(q, x, ldx, acc);
  }
}

/*! \brief Block b's 16 column scales of tile t (per-block arrays \p stride apart): float16 widened, or float32. */
WQ_QPANEL_TARGET inline __m512 Scales(const QPanelJob& j, int64_t at) {
  if (j.half_scales != nullptr) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(j.half_scales + at)));
  }
  return _mm512_loadu_ps(j.scales + at);
}

/*! \brief The mask of the first \p n of 16 lanes (n <= 0: none). */
inline __mmask16 FirstLanes(int64_t n) {
  if (n >= 16) return static_cast<__mmask16>(0xFFFF);
  return n > 0 ? static_cast<__mmask16>((1u << n) - 1u) : static_cast<__mmask16>(0);
}

/*! \brief Put's last, partial tile: the loads and the store masked to the first columns (\p m).  (Full tiles take
 *         plain loads and stores.) */
WQ_QPANEL_TARGET inline void PutMasked(__m512 v, __mmask16 m, const float* bias, const float* gate, bool residual,
                                       float* y) {
  v = _mm512_add_ps(v, bias != nullptr ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps());
  if (gate != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, gate));
  if (residual) {
    __asm__("" : "+v"(v));
    v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y), v);
  }
  _mm512_mask_storeu_ps(y, m, v);
}

/*! \brief Row r of tile t's products v: into out, or with QPanelOut, ((v + bias) * gate) + residual into the output
 *         (columns past the panel's masked), each as the scalar epilogue rounds it (the compiler may not fuse the
 *         gate's multiply and the residual's add into one FMA: the asm barrier). */
WQ_QPANEL_TARGET inline void Put(const QPanelJob& j, int t, int r, __m512 v) {
  if (j.direct == nullptr) {
    _mm512_storeu_ps(j.out + (t * kQPanelRows + r) * kTile, v);
    return;
  }
  const QPanelOut& o = *j.direct;
  const int64_t cols = o.cols - t * kTile;
  if (cols <= 0) return;
  float* y = o.y + r * o.ldy + t * kTile;
  const float* gate = o.gate != nullptr ? o.gate + r * o.ldy + t * kTile : nullptr;
  const float* bias = o.bias != nullptr ? o.bias + t * kTile : nullptr;
  if (cols < kTile) return PutMasked(v, FirstLanes(cols), bias, gate, o.residual, y);
  v = _mm512_add_ps(v, bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps());
  if (gate != nullptr) v = _mm512_mul_ps(v, _mm512_loadu_ps(gate));
  if (o.residual) {
    __asm__("" : "+v"(v));
    v = _mm512_add_ps(_mm512_loadu_ps(y), v);
  }
  _mm512_storeu_ps(y, v);
}

/*! \brief Asks for the output lines the job's epilogue writes (QPanelOut), for writing, and its gate's lines, before
 *         its sums (the output's, loaded, 1 thread, M = 1024: 1.03-1.07x without). */
template <int R>
WQ_QPANEL_TARGET inline void Announce(const QPanelJob& j) {
  if (j.direct == nullptr) return;
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < kT && t * kTile < j.direct->cols; ++t) {
      __builtin_prefetch(j.direct->y + r * j.direct->ldy + t * kTile, 1, 3);
      if (j.direct->gate != nullptr) __builtin_prefetch(j.direct->gate + r * j.direct->ldy + t * kTile, 0, 3);
    }
  }
}

/*! \brief One weight block (per output channel) and no offsets: s and z are the same for every k, so each activation
 *         block adds sx * acc to the total (one FMA) and the scale and zero point apply once at the end,
 *         total = s * (sum_a sx_a acc_a - z * sum_a sx_a sum q_x): the same sums, rounded in another order. */
template <int Bits, int R, bool Vnni>
WQ_QPANEL_TARGET void Folded512(const QPanelJob& j) {
  __m512 total[R][kT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < kT; ++t) total[r][t] = _mm512_setzero_ps();
  float sums[R] = {};
  Announce<R>(j);
  const int64_t xblocks = j.k / kActBlock, stride = j.second * kTile;
  const uint8_t* q[kT] = {j.codes, j.codes + j.second * j.k * 2 * Bits};
  for (int64_t a = 0; a < xblocks; ++a) {
    __m512i acc[R][kT];
    BlockProducts<Bits, R, Vnni>(q, j.xq + a * kActBlock, j.k, acc);
    for (int t = 0; t < kT; ++t) q[t] += kActBlock * Bits * 2;
    for (int r = 0; r < R; ++r) {
      const __m512 sx = _mm512_set1_ps(j.xs[r * xblocks + a]);
      sums[r] += j.xss[r * xblocks + a];
      for (int t = 0; t < kT; ++t) total[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][t]), sx, total[r][t]);
    }
  }
  const float bias = Bits == 8 && !Vnni ? 128.f : 0.f;
  __m512 z[kT], s[kT];
  for (int t = 0; t < kT; ++t) {
    z[t] = _mm512_sub_ps(j.zeros != nullptr ? _mm512_loadu_ps(j.zeros + t * stride) : _mm512_set1_ps(j.zero),
                         _mm512_set1_ps(bias));
    s[t] = Scales(j, t * stride);
  }
  for (int r = 0; r < R; ++r) {  // row by row: a row's two tiles are one 128-byte run of the output (t-major: 0.88x)
    const __m512 sum = _mm512_set1_ps(sums[r]);
    for (int t = 0; t < kT; ++t) Put(j, t, r, _mm512_mul_ps(_mm512_fnmadd_ps(z[t], sum, total[r][t]), s[t]));
  }
}

/*! \brief The unfolded panel: per weight block its zero points and scales, per activation block the products.
 *         \p Inline: 8-bit codes of blocks of kActBlock in the inline layout (dense_wq.h), each pair of blocks' scale
 *         line read from the codes' stream (the same floats, so the same results). */
template <int Bits, int R, bool Vnni, bool Inline = false>
WQ_QPANEL_TARGET void Panel512(const QPanelJob& j) {
  __m512 total[R][kT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < kT; ++t) total[r][t] = _mm512_setzero_ps();
  Announce<R>(j);
  const int64_t per = j.block / kActBlock, xblocks = j.k / kActBlock, blocks = j.k / j.block;
  const int64_t stride = j.second * blocks * kTile;  // tile t0 + 1's per-block values (0: t0 again)
  const uint8_t* q[kT] = {j.codes, j.codes + j.second * (Inline ? InlineTileBytes(j.k, Bits) : j.k * 2 * Bits)};
  const float bias = Bits == 8 && !Vnni ? 128.f : 0.f;  // the BW form's codes are code - 128
  const uint16_t* line[kT] = {nullptr, nullptr};
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 z[kT], s[kT];
    for (int t = 0; t < kT; ++t) {
      const int64_t at = t * stride + b * kTile;
      if constexpr (Inline) {
        if (b % 2 == 0) {
          line[t] = reinterpret_cast<const uint16_t*>(q[t]);
          q[t] += kInlineLineBytes;
        }
        z[t] = _mm512_set1_ps(j.zero - bias);  // small integers: exact, as the subtraction below
        s[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(line[t] + (b % 2) * kTile)));
        continue;
      }
      z[t] = _mm512_sub_ps(j.zeros != nullptr ? _mm512_loadu_ps(j.zeros + at) : _mm512_set1_ps(j.zero),
                           _mm512_set1_ps(bias));
      s[t] = Scales(j, at);
    }
    for (int64_t a = b * per; a < (b + 1) * per; ++a) {
      __m512i acc[R][kT];
      BlockProducts<Bits, R, Vnni>(q, j.xq + a * kActBlock, j.k, acc);
      for (int t = 0; t < kT; ++t) q[t] += kActBlock * Bits * 2;  // 16 columns x 32 k x Bits / 8
      for (int r = 0; r < R; ++r) {  // total += s * (sx * acc - z * sx * sum q_x) (+ o * sx * sum q_x), as Tile512Q
        const __m512 sx = _mm512_set1_ps(j.xs[r * xblocks + a]), sxs = _mm512_set1_ps(j.xss[r * xblocks + a]);
        for (int t = 0; t < kT; ++t) {
          const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][t]), sx);
          total[r][t] = _mm512_fmadd_ps(_mm512_fnmadd_ps(z[t], sxs, v), s[t], total[r][t]);
          if (j.offsets != nullptr) {
            total[r][t] = _mm512_fmadd_ps(_mm512_loadu_ps(j.offsets + t * stride + b * kTile), sxs, total[r][t]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < kT; ++t) Put(j, t, r, total[r][t]);
}

/*! \brief Dispatches a job's row count (1..kQPanelRows) to the kernel instantiated for it (Folded512 with \p Fold). */
template <int Bits, bool Vnni, bool Fold>
void ByRows(const QPanelJob& j) {
  static_assert(kQPanelRows == 6, "one case per row count");
  switch (j.rows) {
    case 1: return Fold ? Folded512<Bits, 1, Vnni>(j) : Panel512<Bits, 1, Vnni>(j);
    case 2: return Fold ? Folded512<Bits, 2, Vnni>(j) : Panel512<Bits, 2, Vnni>(j);
    case 3: return Fold ? Folded512<Bits, 3, Vnni>(j) : Panel512<Bits, 3, Vnni>(j);
    case 4: return Fold ? Folded512<Bits, 4, Vnni>(j) : Panel512<Bits, 4, Vnni>(j);
    case 5: return Fold ? Folded512<Bits, 5, Vnni>(j) : Panel512<Bits, 5, Vnni>(j);
    default: return Fold ? Folded512<Bits, 6, Vnni>(j) : Panel512<Bits, 6, Vnni>(j);
  }
}

template <bool Vnni, bool Fold>
QPanelFn ForBits(int bits) {
  return bits == 8 ? ByRows<8, Vnni, Fold> : ByRows<4, Vnni, Fold>;
}

/*! \brief Panel512 on the inline layout, by row count. */
template <int Bits, bool Vnni>
void InlineByRows(const QPanelJob& j) {
  switch (j.rows) {
    case 1: return Panel512<Bits, 1, Vnni, true>(j);
    case 2: return Panel512<Bits, 2, Vnni, true>(j);
    case 3: return Panel512<Bits, 3, Vnni, true>(j);
    case 4: return Panel512<Bits, 4, Vnni, true>(j);
    case 5: return Panel512<Bits, 5, Vnni, true>(j);
    default: return Panel512<Bits, 6, Vnni, true>(j);
  }
}

}  // namespace

QPanelFn FindInlineQPanelFn(IntDot dot, int bits) {
  switch (dot) {
    case IntDot::kAvx512Vnni: return bits == 8 ? InlineByRows<8, true> : InlineByRows<4, true>;
    case IntDot::kAvx512Bw: return bits == 8 ? InlineByRows<8, false> : InlineByRows<4, false>;
    default: return nullptr;
  }
}

QPanelFn FindQPanelFn(IntDot dot, int bits, bool fold) {
  static_assert(kPanelTiles == 2, "the panel kernel's register tile holds two tiles");
  switch (dot) {
    case IntDot::kAvx512Vnni: return fold ? ForBits<true, true>(bits) : ForBits<true, false>(bits);
    case IntDot::kAvx512Bw: return fold ? ForBits<false, true>(bits) : ForBits<false, false>(bits);
    default: return nullptr;
  }
}

}  // namespace wq
}  // namespace byoc_hetero
