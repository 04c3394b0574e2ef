/*!
 * \file kernels/quantized_binary.cc
 * \brief quantized_binary: add / mul of two 8-bit tensors into an 8-bit tensor (host kernel), what
 *        ONNX writes as DequantizeLinear(a), DequantizeLinear(b) -> Add | Mul -> QuantizeLinear with
 *        per-tensor scales (ONNX Runtime's QLinearAdd / QLinearMul).
 *
 *   y = saturate(round_half_to_even(op((a - za) * sa, (b - zb) * sb) / sy) + zy)
 *
 * in float32, in this order: the same bits as the dequantize, binary and quantize nodes it replaces
 * (pass fuse_int8_binaries, ops/int8_binary.py), in one pass over the 8-bit data instead of four
 * steps over float32 copies.  Inputs a (the output's shape) and b: a's shape, one element, or one
 * axis of a (a squeeze-excitation gate [N, C, 1, 1]); both uint8 / int8, the output uint8 / int8.
 * Attrs: algorithm "add" | "mul"; a_scale, a_zero_point, b_scale, b_zero_point, dst_scale,
 * dst_zero_point (numbers, checked as an int8 anchor's).
 * a is read in the layout its producer stored (an int8 conv's NHWC) and y written in the same.
 */
#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "int8.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief The quantization of a quantized_binary node, as the loops use it. */
struct QBinary {
  bool mul = true;
  float sa = 1.f, sb = 1.f, sy = 1.f;
  int32_t za = 0, zb = 0;
  float zy = 0.f;
};

/*! \brief How b lines up with a's buffer: element i of a reads b's value (i / stride) % channels
 *         (stride 0: one value), or b's element i when same_shape (b stored in a's layout). */
struct Broadcast {
  int64_t numel = 0;
  int64_t channels = 1;
  int64_t stride = 0;
  bool same_shape = false;
};

/*! \brief Elements a parallel unit takes when b does not split a's buffer into rows. */
constexpr int64_t kChunk = 4096;

template <typename Y>
inline Y QBinaryOne(float da, float b, const QBinary& q) {
  constexpr float lo = std::numeric_limits<Y>::min(), hi = std::numeric_limits<Y>::max();
  return static_cast<Y>(QuantizeOne(q.mul ? da * b : da + b, q.sy, q.zy, lo, hi));
}

#if defined(__x86_64__)
/*! \brief 8 elements a step: the scalar loop's arithmetic (vdivps, vroundps to nearest even). */
template <typename A, typename Y>
__attribute__((target("avx2"))) int64_t QBinaryAvx2(const A* a, const float* b, bool b_vector, Y* y, int64_t n,
                                                    const QBinary& q) {
  const __m256i vza = _mm256_set1_epi32(q.za);
  const __m256 vsa = _mm256_set1_ps(q.sa), vsy = _mm256_set1_ps(q.sy), vzy = _mm256_set1_ps(q.zy);
  const __m256 lo = _mm256_set1_ps(std::numeric_limits<Y>::min()), hi = _mm256_set1_ps(std::numeric_limits<Y>::max());
  const __m256 bconst = _mm256_set1_ps(b[0]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + i));
    const __m256i w = std::is_same_v<A, uint8_t> ? _mm256_cvtepu8_epi32(raw) : _mm256_cvtepi8_epi32(raw);
    const __m256 da = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(w, vza)), vsa);
    const __m256 bv = b_vector ? _mm256_loadu_ps(b + i) : bconst;
    __m256 v = _mm256_div_ps(q.mul ? _mm256_mul_ps(da, bv) : _mm256_add_ps(da, bv), vsy);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> 0, as QuantizeOne
    v = _mm256_add_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vzy);
    const __m256i r = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
    const __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    const __m128i bytes = std::is_same_v<Y, uint8_t> ? _mm_packus_epi16(h, h) : _mm_packs_epi16(h, h);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i), bytes);
  }
  return i;
}

bool CpuHasAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}
#endif

/*! \brief y[0, n) from a[0, n) and b's dequantized values (b[i], or b[0] for all when !b_vector). */
template <typename A, typename Y>
void QBinaryRun(const A* a, const float* b, bool b_vector, Y* y, int64_t n, const QBinary& q) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (CpuHasAvx2()) i = QBinaryAvx2(a, b, b_vector, y, n, q);
#endif
  for (; i < n; ++i) {
    const float da = static_cast<float>(static_cast<int32_t>(a[i]) - q.za) * q.sa;
    y[i] = QBinaryOne<Y>(da, b_vector ? b[i] : b[0], q);
  }
}

template <typename B>
void DequantizeTo(const B* b, float* out, int64_t n, const QBinary& q) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<int32_t>(b[i]) - q.zb) * q.sb;
}

/*! \brief Runs f(begin, end) over [0, units) in parallel when \p elements reach ParallelMinimum(). */
template <typename F>
void ForUnits(int64_t units, int64_t elements, const F& f) {
#pragma omp parallel for schedule(static) if (elements >= ParallelMinimum())
  for (int64_t u = 0; u < units; ++u) f(u);
}

template <typename A, typename B, typename Y>
HostFn QBinaryFn(QBinary q, Broadcast bc) {
  return [q, bc](const std::vector<void*>& p) {
    const A* a = static_cast<const A*>(p[0]);
    const B* b = static_cast<const B*>(p[1]);
    Y* y = static_cast<Y*>(p[2]);
    const int64_t n = bc.numel;
    if (bc.same_shape) {
      ForUnits((n + kChunk - 1) / kChunk, n, [&](int64_t u) {
        float values[kChunk];
        const int64_t begin = u * kChunk, len = std::min(kChunk, n - begin);
        DequantizeTo(b + begin, values, len, q);
        QBinaryRun(a + begin, values, true, y + begin, len, q);
      });
      return;
    }
    std::vector<float> gate(static_cast<size_t>(bc.channels));
    DequantizeTo(b, gate.data(), bc.channels, q);
    if (bc.stride == 1) {  // channels innermost (NHWC): one row of channels a unit
      ForUnits(n / bc.channels, n, [&](int64_t u) {
        QBinaryRun(a + u * bc.channels, gate.data(), true, y + u * bc.channels, bc.channels, q);
      });
    } else {  // runs of one channel (stride elements each), or one value for all (stride 0)
      const int64_t run = bc.stride == 0 ? std::min(kChunk, n) : bc.stride;
      ForUnits((n + run - 1) / run, n, [&](int64_t u) {
        const int64_t c = bc.stride == 0 ? 0 : u % bc.channels, len = std::min(run, n - u * run);
        QBinaryRun(a + u * run, gate.data() + c, false, y + u * run, len, q);
      });
    }
  };
}

template <typename A, typename B>
HostFn QBinaryFnFor(DType out, const QBinary& q, const Broadcast& bc) {
  return out == DType::kUInt8 ? QBinaryFn<A, B, uint8_t>(q, bc) : QBinaryFn<A, B, int8_t>(q, bc);
}

HostFn MakeQBinaryFn(DType a, DType b, DType out, const QBinary& q, const Broadcast& bc) {
  if (a == DType::kUInt8) {
    return b == DType::kUInt8 ? QBinaryFnFor<uint8_t, uint8_t>(out, q, bc) : QBinaryFnFor<uint8_t, int8_t>(out, q, bc);
  }
  return b == DType::kUInt8 ? QBinaryFnFor<int8_t, uint8_t>(out, q, bc) : QBinaryFnFor<int8_t, int8_t>(out, q, bc);
}

/*! \brief The one axis of a along which b varies (b's other dims 1, right-aligned), or -1 when
 *         b has one element; fails for any other shape. */
int64_t BroadcastAxis(const KernelContext& ctx) {
  const auto& a = ctx.input(0).shape;
  const auto& b = ctx.input(1).shape;
  const int64_t offset = static_cast<int64_t>(a.size()) - static_cast<int64_t>(b.size());
  int64_t axis = -1;
  for (int64_t k = 0; k < static_cast<int64_t>(b.size()) && offset >= 0; ++k) {
    if (b[k] == 1) continue;
    if (axis >= 0 || b[k] != a[k + offset]) axis = -2;
    if (axis == -2) break;
    axis = k + offset;
  }
  if (offset < 0 || axis == -2) {
    ctx.Fail("b " + ShapeToString(b) + " must have a's shape " + ShapeToString(a) +
             ", one element, or a's size along one axis and 1 elsewhere");
  }
  return axis;
}

QBinary ReadQBinary(const KernelContext& ctx, AttrReader& attrs) {
  QBinary q;
  q.mul = attrs.Choice("algorithm", {"add", "mul"}, "") == "mul";
  q.sa = CheckedScale(attrs, "a_scale", attrs.Float("a_scale", 0.0));
  q.sb = CheckedScale(attrs, "b_scale", attrs.Float("b_scale", 0.0));
  q.sy = CheckedScale(attrs, "dst_scale", attrs.Float("dst_scale", 0.0));
  q.za = CheckedZeroPoint(attrs, "a_zero_point", attrs.Int("a_zero_point", 0), ctx.input(0).dtype);
  q.zb = CheckedZeroPoint(attrs, "b_zero_point", attrs.Int("b_zero_point", 0), ctx.input(1).dtype);
  q.zy = static_cast<float>(CheckedZeroPoint(attrs, "dst_zero_point", attrs.Int("dst_zero_point", 0),
                                             ctx.output().dtype));
  return q;
}

}  // namespace

static std::unique_ptr<Kernel> BuildQuantizedBinary(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  ctx.ExpectInputCount(2, "a, b");
  for (size_t k = 0; k < 2; ++k) {
    if (!IsInt8(ctx.input(k).dtype)) {
      ctx.Fail(std::string(k == 0 ? "a" : "b") + " must be uint8 or int8, got " + DTypeName(ctx.input(k).dtype));
    }
  }
  if (!IsInt8(ctx.output().dtype)) ctx.Fail(std::string("the output must be uint8 or int8, got ") + DTypeName(ctx.output().dtype));
  ctx.ExpectOutputShape(ctx.input(0).shape);
  const QBinary q = ReadQBinary(ctx, attrs);
  attrs.CheckNoUnknown();
  Broadcast bc;
  bc.numel = ctx.input(0).numel();
  bc.same_shape = ctx.input(1).shape == ctx.input(0).shape;
  const int64_t axis = bc.same_shape ? -1 : BroadcastAxis(ctx);
  // a (and b of a's shape) in the producer's layout when it is dense and strided, as quantize.cc
  memory::desc a_layout = DenseProducerLayout(ctx, 0);
  const bool follow = !a_layout.is_zero();
  if (!follow) a_layout = PlainDescOf(ctx.input(0));
  if (axis >= 0) {
    bc.channels = ctx.input(0).shape[axis];
    bc.stride = a_layout.get_strides()[axis];
  }
  HostFn fn = MakeQBinaryFn(ctx.input(0).dtype, ctx.input(1).dtype, ctx.output().dtype, q, bc);
  auto kernel = std::make_unique<HostKernel>(
      ctx.where(), "quantized_binary", std::move(fn),
      std::vector<memory::desc>{PlainDescOf(ctx.input(0)), PlainDescOf(ctx.input(1))}, PlainDescOf(ctx.output()));
  if (follow) {
    const memory::dims strides = a_layout.get_strides();
    kernel->FollowLayout(a_layout, memory::desc(a_layout.get_dims(), DnnlType(ctx.output().dtype), strides));
    if (bc.same_shape) kernel->ReadInputIn(1, memory::desc(a_layout.get_dims(), DnnlType(ctx.input(1).dtype), strides));
  }
  return kernel;
}

BYOC_HETERO_REGISTER_KERNEL("quantized_binary", BuildQuantizedBinary, Int8HostTraits());  // 8-bit in and out

}  // namespace byoc_hetero
