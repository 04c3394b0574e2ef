/*!
 * \file kernels/quantize.cc
 * \brief quantize / dequantize as ONNX QuantizeLinear / DequantizeLinear define them (host kernels).
 *
 *   quantize:   y = saturate(round_half_to_even(x / scale) + zero_point)   float32 -> uint8 / int8
 *   dequantize: y = (x - zero_point) * scale                                uint8 / int8 / int32 -> float32
 *
 * Inputs: data, scale (float32, 1 element or one per index of `axis`), zero_point (optional; as
 * many elements as scale; the quantized type, or int32 for dequantize of an int32 bias).  Attr
 * `axis` (default 1, ignored for a one-element scale): the axis a per-axis scale runs along.
 * The division (not a multiply by 1/scale) and the rounding follow ONNX exactly, so the result
 * equals numpy's `clip(round(x / s) + z, lo, hi)` bit for bit; NaN quantizes to the zero point.
 * These run where no int8 primitive absorbed them (docs/int8.md): at region edges, around ops
 * computed in float32, and for constants (a bias, a weight that stays float32) once at __init_.
 */
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <limits>
#include <utility>

#include "int8.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief The data seen as [outer, channels, inner] around the scale's axis (channels 1: per tensor). */
struct AxisSplit {
  int64_t outer = 1, channels = 1, inner = 1;
};

AxisSplit SplitAt(const KernelContext& ctx, int64_t scale_count, AttrReader& attrs) {
  const auto& shape = ctx.input(0).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  int64_t axis = attrs.Int("axis", 1);
  AxisSplit split;
  split.inner = ctx.input(0).numel();
  if (scale_count == 1) return split;
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) attrs.Fail("axis", "must be in [-rank, rank) for shape " + ShapeToString(shape));
  if (shape[axis] != scale_count) {
    ctx.Fail("scale has " + std::to_string(scale_count) + " elements but data " + ShapeToString(shape) +
             " has " + std::to_string(shape[axis]) + " along axis " + std::to_string(axis));
  }
  split.outer = 1;
  for (int64_t d = 0; d < axis; ++d) split.outer *= shape[d];
  split.channels = shape[axis];
  split.inner = 1;
  for (int64_t d = axis + 1; d < rank; ++d) split.inner *= shape[d];
  return split;
}

/*!
 * \brief Calls f(c, begin, end) for every run [begin, end) of elements of one channel c of the data
 *        seen as [outer, channels, inner], in blocks of at most 16K elements spread over the
 *        threads (a per-tensor scale is one channel: its elements still split across threads).
 *        Tensors under 256K elements (about 50 us on one core with the AVX2 loops) run on the
 *        calling thread: an OpenMP team costs a few us on a quiet machine, but on a loaded one each
 *        team waits at its barrier for a descheduled thread (milliseconds; a 2-layer int8 BERT
 *        ran 3-25x slower at 2 threads than at 1 with 130 such small steps a call, session 2).
 */
template <typename F>
void ForChannelBlocks(const AxisSplit& s, const F& f) {
  constexpr int64_t kBlock = 16384;
  const int64_t blocks = (s.inner + kBlock - 1) / kBlock;
  const int64_t total = s.outer * s.channels * blocks;
#pragma omp parallel for schedule(static) if (s.outer * s.channels * s.inner >= ParallelMinimum())
  for (int64_t t = 0; t < total; ++t) {
    const int64_t row = t / blocks, c = row % s.channels;
    const int64_t begin = row * s.inner + (t % blocks) * kBlock;
    f(c, begin, std::min(begin + kBlock, (row + 1) * s.inner));
  }
}

#if defined(__x86_64__)
/*!
 * \brief The AVX2 loops (8 floats a step).  Same arithmetic as QuantizeOne / the scalar dequantize,
 *        so the results are the same bits: an IEEE division (vdivps), rounding to nearest even
 *        (vroundps), NaN to 0 before the zero point is added, then saturation; dequantize converts the
 *        integer difference exactly and multiplies once.  GCC does not vectorize the scalar loops
 *        (the selects on floats stay branches under -ftrapping-math): they ran 1 to 12 ns per element
 *        on BERT's activations, 60% of an int8 BERT call (bench/INT8.md, session 2).
 */
/*! \brief saturate(round_half_to_even(v) + zero) of 8 floats already divided by the scale (NaN -> 0),
 *         as floats (integral values). */
template <typename Q>
__attribute__((target("avx2"))) inline __m256 RoundSaturateEight(__m256 v, __m256 vz) {
  const __m256 lo = _mm256_set1_ps(std::numeric_limits<Q>::min()), hi = _mm256_set1_ps(std::numeric_limits<Q>::max());
  v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> 0
  v = _mm256_add_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
  return _mm256_min_ps(_mm256_max_ps(v, lo), hi);
}

/*! \brief saturate(round_half_to_even(x / scale) + zero) of 8 floats, as floats (integral values). */
template <typename Q>
__attribute__((target("avx2"))) inline __m256 QuantizeEight(const float* x, __m256 vs, __m256 vz) {
  return RoundSaturateEight<Q>(_mm256_div_ps(_mm256_loadu_ps(x), vs), vz);
}

/*! \brief Stores 8 floats that are integral and within Q's range as Q (exact). */
template <typename Q>
__attribute__((target("avx2"))) inline void StoreEight(Q* y, __m256 v) {
  const __m256i w = _mm256_cvtps_epi32(v);
  const __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
  const __m128i b = std::is_same_v<Q, uint8_t> ? _mm_packus_epi16(h, h) : _mm_packs_epi16(h, h);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(y), b);
}

/*! \brief (x - zero) * scale of 8 8-bit values, exact integer difference, one multiply. */
template <typename Q>
__attribute__((target("avx2"))) inline __m256 DequantizeEight(const Q* x, __m256 vs, __m256i vz) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x));
  const __m256i w = std::is_same_v<Q, uint8_t> ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(w, vz)), vs);
}

template <typename Q>
__attribute__((target("avx2"))) int64_t QuantizeAvx2(const float* x, Q* y, int64_t n, float sc, float z) {
  const __m256 vs = _mm256_set1_ps(sc), vz = _mm256_set1_ps(z);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) StoreEight(y + i, QuantizeEight<Q>(x + i, vs, vz));
  return i;
}

/*! \brief dequantize(quantize(x)) in one pass: (q - zero) is an exact small integer in float32. */
template <typename Q>
__attribute__((target("avx2"))) int64_t RoundTripAvx2(const float* x, float* y, int64_t n, float sc, float z) {
  const __m256 vs = _mm256_set1_ps(sc), vz = _mm256_set1_ps(z);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_sub_ps(QuantizeEight<Q>(x + i, vs, vz), vz), vs));
  }
  return i;
}

template <typename Q>
__attribute__((target("avx2"))) int64_t DequantizeAvx2(const Q* x, float* y, int64_t n, float sc, int32_t z) {
  const __m256 vs = _mm256_set1_ps(sc);
  const __m256i vz = _mm256_set1_epi32(z);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, DequantizeEight(x + i, vs, vz));
  return i;
}

/*! \brief 8 floats to bf16 rounded to nearest even (finite values: the dequantized integers). */
__attribute__((target("avx2"))) inline __m128i ToBf16Eight(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);  // 0 <= r < 2^16: exact
  return _mm256_castsi256_si128(packed);
}

/*! \brief dequantize of 8-bit values written as bf16: the float32 result of DequantizeAvx2, rounded once. */
template <typename Q>
__attribute__((target("avx2"))) int64_t DequantizeBf16Avx2(const Q* x, uint16_t* y, int64_t n, float sc, int32_t z) {
  const __m256 vs = _mm256_set1_ps(sc);
  const __m256i vz = _mm256_set1_epi32(z);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), ToBf16Eight(DequantizeEight(x + i, vs, vz)));
  }
  return i;
}

/*! \brief quantize of bf16 values: widened exactly to float32, then multiplied by 1 / scale (the
 *         input was rounded to bf16 already, so ONNX's division buys no exactness here; the divide
 *         bounded the float32 loop at about 0.3 ns an element, ResNet-50's 800K-element tensors). */
template <typename Q>
__attribute__((target("avx2"))) int64_t QuantizeBf16Avx2(const uint16_t* x, Q* y, int64_t n, float sc, float z) {
  const __m256 vr = _mm256_set1_ps(1.f / sc), vz = _mm256_set1_ps(z);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    StoreEight(y + i, RoundSaturateEight<Q>(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), vr), vz));
  }
  return i;
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

/*! \brief min / max / any-NaN of x[0, i) for the largest i that is a multiple of 8 (DynamicUInt8Params):
 *         _mm256_min_ps(a, b) is exactly a < b ? a : b, so a NaN never wins, as in the scalar loop. */
__attribute__((target("avx2"))) int64_t MinMaxAvx2(const float* x, int64_t n, float* lo, float* hi, int32_t* nan) {
  __m256 vlo = _mm256_set1_ps(*lo), vhi = _mm256_set1_ps(*hi), vnan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    vlo = _mm256_min_ps(v, vlo);
    vhi = _mm256_max_ps(v, vhi);
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float l[8], h[8];
  _mm256_store_ps(l, vlo);
  _mm256_store_ps(h, vhi);
  for (int k = 0; k < 8; ++k) {
    *lo = l[k] < *lo ? l[k] : *lo;
    *hi = h[k] > *hi ? h[k] : *hi;
  }
  *nan |= _mm256_movemask_ps(vnan) != 0;
  return i;
}
#endif

/*! \brief float32 -> bf16 rounded to nearest even, NaN kept a quiet NaN (the scalar tail). */
inline uint16_t Bf16Bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  if (v != v) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

inline float Bf16Value(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

/*! \brief y[0, n) = quantize(x[0, n)) with one scale and zero point: AVX2 where the CPU has it.
 *         In = float: ONNX's division; In = uint16_t (bf16 bits): widened, times 1 / scale. */
template <typename Q, typename In>
void QuantizeRun(const In* x, Q* y, int64_t n, float sc, float z) {
  constexpr float lo = std::numeric_limits<Q>::min(), hi = std::numeric_limits<Q>::max();
  constexpr bool f32 = std::is_same_v<In, float>;
  int64_t i = 0;
#if defined(__x86_64__)
  if (HaveAvx2()) {
    if constexpr (f32) {
      i = QuantizeAvx2(x, y, n, sc, z);
    } else {
      i = QuantizeBf16Avx2(x, y, n, sc, z);
    }
  }
#endif
  const float r = 1.f / sc;
  for (; i < n; ++i) {
    if constexpr (f32) {
      y[i] = static_cast<Q>(QuantizeOne(x[i], sc, z, lo, hi));
    } else {
      y[i] = static_cast<Q>(QuantizeOne(Bf16Value(x[i]) * r, 1.f, z, lo, hi));
    }
  }
}

/*! \brief y = dequantize(x) as float32 (Out = float) or as bf16 (Out = uint16_t, the bf16 bits). */
template <typename Q, typename Out>
void DequantizeRun(const Q* x, Out* y, int64_t n, float sc, int64_t z) {
  int64_t i = 0;
#if defined(__x86_64__)
  if constexpr (sizeof(Q) == 1) {
    if (HaveAvx2()) {
      if constexpr (std::is_same_v<Out, float>) {
        i = DequantizeAvx2(x, y, n, sc, static_cast<int32_t>(z));
      } else {
        i = DequantizeBf16Avx2(x, y, n, sc, static_cast<int32_t>(z));
      }
    }
  }
#endif
  for (; i < n; ++i) {
    const float v = static_cast<float>(static_cast<int64_t>(x[i]) - z) * sc;
    if constexpr (std::is_same_v<Out, float>) {
      y[i] = v;
    } else {
      y[i] = Bf16Bits(v);
    }
  }
}

template <typename Q>
void RoundTripRun(const float* x, float* y, int64_t n, float sc, float z) {
  constexpr float lo = std::numeric_limits<Q>::min(), hi = std::numeric_limits<Q>::max();
  int64_t i = 0;
#if defined(__x86_64__)
  if (HaveAvx2()) i = RoundTripAvx2<Q>(x, y, n, sc, z);
#endif
  for (; i < n; ++i) y[i] = (QuantizeOne(x[i], sc, z, lo, hi) - z) * sc;
}


/*! \brief quantize (In = float) or its bf16 reading (In = uint16_t, the bf16 bits). */
template <typename Q, typename In>
HostFn QuantizeFromFn(AxisSplit s, bool has_zp) {
  return [s, has_zp](const std::vector<void*>& p) {
    const In* x = static_cast<const In*>(p[0]);
    const float* scale = static_cast<const float*>(p[1]);
    const Q* zp = has_zp ? static_cast<const Q*>(p[2]) : nullptr;
    Q* y = static_cast<Q*>(p[has_zp ? 3 : 2]);
    ForChannelBlocks(s, [&](int64_t c, int64_t begin, int64_t end) {
      QuantizeRun(x + begin, y + begin, end - begin, scale[c], zp ? static_cast<float>(zp[c]) : 0.f);
    });
  };
}

/*! \brief dequantize into float32 (Out = float) or into bf16 (Out = uint16_t, the bf16 bits). */
template <typename Q, typename Out>
HostFn DequantizeToFn(AxisSplit s, bool has_zp) {
  return [s, has_zp](const std::vector<void*>& p) {
    const Q* x = static_cast<const Q*>(p[0]);
    const float* scale = static_cast<const float*>(p[1]);
    const Q* zp = has_zp ? static_cast<const Q*>(p[2]) : nullptr;
    Out* y = static_cast<Out*>(p[has_zp ? 3 : 2]);
    ForChannelBlocks(s, [&](int64_t c, int64_t begin, int64_t end) {
      DequantizeRun(x + begin, y + begin, end - begin, scale[c], zp ? static_cast<int64_t>(zp[c]) : 0);
    });
  };
}

template <typename Q>
HostFn RoundTripFn(AxisSplit s) {
  return [s](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    const float* scale = static_cast<const float*>(p[1]);
    const Q* zp = static_cast<const Q*>(p[2]);
    float* y = static_cast<float*>(p[3]);
    ForChannelBlocks(s, [&](int64_t c, int64_t begin, int64_t end) {
      RoundTripRun<Q>(x + begin, y + begin, end - begin, scale[c], static_cast<float>(zp[c]));
    });
  };
}

/*! \brief Checks shared by both directions: inputs, scale and zero point types and sizes. */
AxisSplit CheckQuantOperands(const KernelContext& ctx, AttrReader& attrs, DType quantized) {
  const size_t count = ctx.node().inputs.size();
  if (count != 2 && count != 3) ctx.Fail("expected inputs data, scale[, zero_point], got " + std::to_string(count));
  if (ctx.input(1).dtype != DType::kFloat32) ctx.Fail("scale must be float32");
  const int64_t scales = ctx.input(1).numel();
  if (count == 3 && (ctx.input(2).numel() != scales || ctx.input(2).dtype != quantized)) {
    ctx.Fail(std::string("zero_point must be ") + DTypeName(quantized) + " with " + std::to_string(scales) +
             " element(s) (as the scale), got " + DTypeName(ctx.input(2).dtype) + " " +
             ShapeToString(ctx.input(2).shape));
  }
  ctx.ExpectOutputShape(ctx.input(0).shape);
  return SplitAt(ctx, scales, attrs);
}

/*!
 * \brief With one scale the step is element-wise: it reads its data in the layout the producer
 *        stored it in (the int8 convs' NHWC) and writes its output in the same strides, so that a
 *        float32 op between int8 convs (MobileNetV3's hardswish, squeeze-excitation) costs no
 *        relayout on either side (47 reorders, 25% of an int8 MobileNetV3-L call, before).  Only
 *        strided layouts without blocks or padding: the loop runs over the buffer's numel elements.
 *        \p in_type / \p out_type: the element types read and written (bf16 at a bf16 edge).
 */
void FollowInputLayout(const KernelContext& ctx, const AxisSplit& split, HostKernel& kernel,
                       memory::data_type in_type, memory::data_type out_type) {
  if (split.channels != 1) return;
  const memory::desc in = ctx.InputLayout(0);
  if (in.get_format_kind() != dnnl::memory::format_kind::blocked || in.get_inner_nblks() != 0 ||
      in.get_padded_dims() != in.get_dims() || in.get_data_type() != in_type ||
      in.get_size() != static_cast<size_t>(ctx.input(0).numel()) * memory::data_type_size(in_type)) {
    return;
  }
  kernel.FollowLayout(in, memory::desc(in.get_dims(), out_type, in.get_strides()));
}

std::vector<memory::desc> PlainInputs(const KernelContext& ctx) {
  std::vector<memory::desc> mds;
  for (size_t k = 0; k < ctx.node().inputs.size(); ++k) mds.push_back(PlainDescOf(ctx.input(k)));
  return mds;
}

}  // namespace

void QuantizeSpan(const float* x, void* y, int64_t n, float scale, int32_t zero, DType q) {
  if (q == DType::kUInt8) {
    QuantizeRun(x, static_cast<uint8_t*>(y), n, scale, static_cast<float>(zero));
  } else {
    QuantizeRun(x, static_cast<int8_t*>(y), n, scale, static_cast<float>(zero));
  }
}

void DequantizeSpan(const void* x, float* y, int64_t n, float scale, int32_t zero, DType q) {
  if (q == DType::kUInt8) {
    DequantizeRun(static_cast<const uint8_t*>(x), y, n, scale, zero);
  } else {
    DequantizeRun(static_cast<const int8_t*>(x), y, n, scale, zero);
  }
}

void RoundTripSpan(const float* x, float* y, int64_t n, float scale, int32_t zero, DType q) {
  if (q == DType::kUInt8) {
    RoundTripRun<uint8_t>(x, y, n, scale, static_cast<float>(zero));
  } else {
    RoundTripRun<int8_t>(x, y, n, scale, static_cast<float>(zero));
  }
}

DynamicQParams DynamicUInt8Params(const float* x, int64_t n) {
  // one vectorized pass (selects only: a comparison with NaN is false, so NaN never wins the min / max;
  // it is counted instead)
  float lo = 0.f, hi = 0.f;  // min(min(x), 0) and max(max(x), 0) directly
  int32_t nan = 0;
  int64_t start = 0;
#if defined(__x86_64__)
  if (HaveAvx2()) start = MinMaxAvx2(x, n, &lo, &hi, &nan);
#endif
  for (int64_t i = start; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
    nan |= x[i] != x[i];
  }
  DynamicQParams q;
  if (nan) {
    // ONNX leaves DynamicQuantizeLinear of NaN undefined (ONNX Runtime and TVM's llvm code give
    // different finite numbers): a NaN scale makes every value dequantized with it NaN, never a
    // finite number that looks right
    q.scale = std::numeric_limits<float>::quiet_NaN();
    return q;
  }
  const float range = hi - lo;
  q.scale = range == 0.f ? 1.f : range / 255.f;  // float32 arithmetic, as ONNX Runtime's and the import's
  const float zero = std::nearbyint(0.f - lo / q.scale);  // default rounding mode: half to even
  // -lo / scale is in [0, 255] up to float error, which the rounding takes back; inf / inf is NaN -> 0
  q.zero = std::isfinite(zero) ? static_cast<int32_t>(std::min(255.f, std::max(0.f, zero))) : 0;
  return q;
}

/*!
 * \brief dynamic_quantize_dequantize: ONNX's DynamicQuantizeLinear followed by the DequantizeLinear
 *        of its own outputs (ops/qdq_dynamic.py), float32 in and out: the uint8 scale and zero point
 *        of the whole tensor computed per call (DynamicUInt8Params), then the round trip in one pass.
 *        Where an int8 dense reads it, fuse_dynamic_int8_sources folds it into the dense instead.
 */
static std::unique_ptr<Kernel> BuildDynamicQuantizeDequantize(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  if (ctx.input(0).dtype != DType::kFloat32 || ctx.output().dtype != DType::kFloat32) {
    ctx.Fail("data and output must be float32");
  }
  ctx.ExpectOutputShape(ctx.input(0).shape);
  const int64_t n = ctx.input(0).numel();
  HostFn fn = [n](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    const DynamicQParams q = DynamicUInt8Params(x, n);
    RoundTripSpan(x, static_cast<float*>(p[1]), n, q.scale, q.zero, DType::kUInt8);
  };
  return std::make_unique<HostKernel>(ctx.where(), "dynamic_quantize_dequantize", std::move(fn), PlainInputs(ctx),
                                      PlainDescOf(ctx.output()));
}

/*!
 * \brief The int8 / bf16 edges of a bf16 region (a tuner's int8 + bf16 mix): a quantize reads its
 *        data bf16 where the producer stored it so (its trait: it rounds the data, to 8 bits, anyway),
 *        and a dequantize writes bf16 where every reader rounds its output to bf16 (a bf16 conv's
 *        data).  Each edge is then one pass over the tensor, 2 bytes an element on the float side,
 *        where it was a float32 write, a float32 read and a float32 -> bf16 reorder (bench/TUNE.md,
 *        session 5: 27 such reorders, 26% of a ResNet-50 mix's non-conv time, were gone).
 */
static std::unique_ptr<Kernel> BuildQuantize(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const DType q = ctx.output().dtype;
  if (!IsInt8(q)) ctx.Fail(std::string("the output must be uint8 or int8, got ") + DTypeName(q));
  if (ctx.input(0).dtype != DType::kFloat32) ctx.Fail("data must be float32");
  const AxisSplit split = CheckQuantOperands(ctx, attrs, q);
  attrs.CheckNoUnknown();
  const bool zp = ctx.node().inputs.size() == 3;
  const bool bf16 = ctx.bf16 && ctx.InputLayout(0).get_data_type() == memory::data_type::bf16;
  HostFn fn = bf16 ? (q == DType::kUInt8 ? QuantizeFromFn<uint8_t, uint16_t>(split, zp)
                                         : QuantizeFromFn<int8_t, uint16_t>(split, zp))
                   : (q == DType::kUInt8 ? QuantizeFromFn<uint8_t, float>(split, zp)
                                         : QuantizeFromFn<int8_t, float>(split, zp));
  const memory::data_type in_type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  auto kernel = std::make_unique<HostKernel>(ctx.where(), "quantize", std::move(fn), PlainInputs(ctx),
                                             PlainDescOf(ctx.output()));
  // the views stay the tensors' own dtypes (the planner checks them); what is stored may be bf16
  if (bf16) kernel->FollowLayout(WithType(PlainDescOf(ctx.input(0)), in_type), PlainDescOf(ctx.output()));
  FollowInputLayout(ctx, split, *kernel, in_type, DnnlType(q));
  return kernel;
}

template <typename Out>
HostFn DequantizeFnOf(DType q, const AxisSplit& split, bool zp) {
  return q == DType::kUInt8  ? DequantizeToFn<uint8_t, Out>(split, zp)
         : q == DType::kInt8 ? DequantizeToFn<int8_t, Out>(split, zp)
                             : DequantizeToFn<int32_t, Out>(split, zp);
}

static std::unique_ptr<Kernel> BuildDequantize(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const DType q = ctx.input(0).dtype;
  if (!IsInt8(q) && q != DType::kInt32) ctx.Fail(std::string("data must be uint8, int8 or int32, got ") + DTypeName(q));
  if (ctx.output().dtype != DType::kFloat32) ctx.Fail("the output must be float32");
  const AxisSplit split = CheckQuantOperands(ctx, attrs, q);
  attrs.CheckNoUnknown();
  const bool zp = ctx.node().inputs.size() == 3;
  const bool bf16 = OutputOnlyFeedsBf16Convs(ctx);
  HostFn fn = bf16 ? DequantizeFnOf<uint16_t>(q, split, zp) : DequantizeFnOf<float>(q, split, zp);
  const memory::data_type out_type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  auto kernel = std::make_unique<HostKernel>(ctx.where(), "dequantize", std::move(fn), PlainInputs(ctx),
                                             PlainDescOf(ctx.output()));
  if (bf16) kernel->FollowLayout(PlainDescOf(ctx.input(0)), WithType(PlainDescOf(ctx.output()), out_type));
  FollowInputLayout(ctx, split, *kernel, DnnlType(q), out_type);
  return kernel;
}

/*!
 * \brief quantize_dequantize: a quantize whose only readers were dequantizes of the same scale and
 *        zero point (pass fuse_quantize_dequantize, ops/qdq.py), float32 in and out; the 8-bit
 *        type is the zero point's.  Same bits as the two steps, in one pass over the data.
 */
static std::unique_ptr<Kernel> BuildQuantizeDequantize(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  if (ctx.node().inputs.size() != 3) {
    ctx.Fail("expected inputs data, scale, zero_point, got " + std::to_string(ctx.node().inputs.size()));
  }
  const DType q = ctx.input(2).dtype;
  if (!IsInt8(q)) ctx.Fail(std::string("the zero point must be uint8 or int8, got ") + DTypeName(q));
  if (ctx.input(0).dtype != DType::kFloat32 || ctx.output().dtype != DType::kFloat32) {
    ctx.Fail("data and output must be float32");
  }
  const AxisSplit split = CheckQuantOperands(ctx, attrs, q);
  attrs.CheckNoUnknown();
  HostFn fn = q == DType::kUInt8 ? RoundTripFn<uint8_t>(split) : RoundTripFn<int8_t>(split);
  auto kernel = std::make_unique<HostKernel>(ctx.where(), "quantize_dequantize", std::move(fn), PlainInputs(ctx),
                                             PlainDescOf(ctx.output()));
  FollowInputLayout(ctx, split, *kernel, memory::data_type::f32, memory::data_type::f32);
  return kernel;
}

// they write (quantize) or read (dequantize) 8-bit values, or an 8-bit zero point
/*! \brief quantize's data (input 0) may be stored bf16 in a bf16 region: it is rounded to 8 bits
 *         next, and bf16 carries 8 significant bits, so a value moves by at most one quantization
 *         step, and only where f32 sat within bf16's rounding of a step boundary (the tests bound it). */
static Bf16Read QuantizeBf16Input(const NodeInfo& /*node*/, size_t k) {
  return k == 0 ? Bf16Read::kRounds : Bf16Read::kF32;
}

static KernelTraits QuantizeTraits() {
  KernelTraits traits = Int8HostTraits();
  traits.bf16_input = QuantizeBf16Input;
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("quantize", BuildQuantize, QuantizeTraits());
BYOC_HETERO_REGISTER_KERNEL("dequantize", BuildDequantize, Int8HostTraits());
BYOC_HETERO_REGISTER_KERNEL("quantize_dequantize", BuildQuantizeDequantize, Int8HostTraits());
BYOC_HETERO_REGISTER_KERNEL("dynamic_quantize_dequantize", BuildDynamicQuantizeDequantize);

}  // namespace byoc_hetero
