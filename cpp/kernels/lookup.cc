/*!
 * \file kernels/lookup.cc
 * \brief lookup: y = table[x] for 8-bit x and y (host kernel), an element-wise chain of one 8-bit
 *        tensor evaluated for its 256 possible values by pass fuse_int8_lookup_tables
 *        (ops/int8_lookup.py): EfficientNet's SiLU with its sigmoid's own quantization, an activation
 *        after a pool.  Input uint8 / int8; attr table: 256 integers in the output type's range, the
 *        result for input value lo + k at k (lo = 0 for uint8, -128 for int8).  Reads the layout the
 *        producer stored and writes its output in the same strides (element-wise).
 */
#include <algorithm>
#include <array>
#include <limits>
#include <type_traits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "int8.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief Elements a parallel unit takes. */
constexpr int64_t kLookupChunk = 16384;

#if defined(__x86_64__)
/*! \brief 64 bytes a step with AVX-512 VBMI: two 128-entry permutes (vpermi2b) and a blend on the
 *         index's top bit; the scalar loop ran 1-2 ns an element (EfficientNet-B0's 49 SiLU tables
 *         were 28% of a call at 1 thread, loaded machine). Returns how many elements it did. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t LookupVbmi(const uint8_t* x, uint8_t* y, int64_t n,
                                                                        const uint8_t* table, uint8_t flip) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  const __m512i vflip = _mm512_set1_epi8(static_cast<char>(flip));
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512i idx = _mm512_xor_si512(_mm512_loadu_si512(x + i), vflip);  // int8: x + 128
    const __m512i lo = _mm512_permutex2var_epi8(t0, idx, t1), hi = _mm512_permutex2var_epi8(t2, idx, t3);
    _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi));
  }
  return i;
}

bool CpuHasVbmi() {
  static const bool have = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw");
  return have;
}
#endif

template <typename X, typename Y>
HostFn LookupFn(std::array<Y, 256> table, int64_t n) {
  return [table, n](const std::vector<void*>& p) {
    const X* x = static_cast<const X*>(p[0]);
    Y* y = static_cast<Y*>(p[1]);
    constexpr int offset = std::is_same_v<X, uint8_t> ? 0 : 128;
    const int64_t units = (n + kLookupChunk - 1) / kLookupChunk;
#pragma omp parallel for schedule(static) if (n >= ParallelMinimum())
    for (int64_t u = 0; u < units; ++u) {
      const int64_t begin = u * kLookupChunk, end = std::min(n, (u + 1) * kLookupChunk);
      int64_t i = begin;
#if defined(__x86_64__)
      if (CpuHasVbmi()) {
        i += LookupVbmi(reinterpret_cast<const uint8_t*>(x + begin), reinterpret_cast<uint8_t*>(y + begin), end - begin,
                        reinterpret_cast<const uint8_t*>(table.data()), static_cast<uint8_t>(offset));
      }
#endif
      for (; i < end; ++i) y[i] = table[static_cast<int>(x[i]) + offset];
    }
  };
}

template <typename Y>
std::array<Y, 256> ReadTable(AttrReader& attrs) {
  const std::vector<int64_t> values = attrs.Ints("table", 256, {});
  if (values.size() != 256) attrs.Fail("table", "required: 256 integers");
  std::array<Y, 256> table{};
  for (size_t k = 0; k < 256; ++k) {
    if (values[k] < std::numeric_limits<Y>::min() || values[k] > std::numeric_limits<Y>::max()) {
      attrs.Fail("table", "entry " + std::to_string(k) + " = " + std::to_string(values[k]) +
                              " is outside the output type's range");
    }
    table[k] = static_cast<Y>(values[k]);
  }
  return table;
}

template <typename X>
HostFn LookupFnFor(AttrReader& attrs, DType out, int64_t n) {
  if (out == DType::kUInt8) return LookupFn<X, uint8_t>(ReadTable<uint8_t>(attrs), n);
  return LookupFn<X, int8_t>(ReadTable<int8_t>(attrs), n);
}

template <typename X, typename Y>
HostFn LookupFromBytes(const std::array<uint8_t, 256>& bytes, int64_t n) {
  std::array<Y, 256> table{};
  for (size_t k = 0; k < 256; ++k) table[k] = static_cast<Y>(bytes[k]);  // the output type's bits
  return LookupFn<X, Y>(table, n);
}

}  // namespace

HostFn TableLookupFn(DType in, DType out, const std::array<uint8_t, 256>& bytes, int64_t n) {
  if (in == DType::kUInt8) {
    return out == DType::kUInt8 ? LookupFromBytes<uint8_t, uint8_t>(bytes, n) : LookupFromBytes<uint8_t, int8_t>(bytes, n);
  }
  return out == DType::kUInt8 ? LookupFromBytes<int8_t, uint8_t>(bytes, n) : LookupFromBytes<int8_t, int8_t>(bytes, n);
}

static std::unique_ptr<Kernel> BuildLookup(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  ctx.ExpectInputCount(1, "data");
  const DType in = ctx.input(0).dtype, out = ctx.output().dtype;
  if (!IsInt8(in) || !IsInt8(out)) {
    ctx.Fail(std::string("data and output must be uint8 or int8, got ") + DTypeName(in) + " -> " + DTypeName(out));
  }
  ctx.ExpectOutputShape(ctx.input(0).shape);
  const int64_t n = ctx.input(0).numel();
  HostFn fn = in == DType::kUInt8 ? LookupFnFor<uint8_t>(attrs, out, n) : LookupFnFor<int8_t>(attrs, out, n);
  attrs.CheckNoUnknown();
  auto kernel = std::make_unique<HostKernel>(ctx.where(), "lookup", std::move(fn),
                                             std::vector<memory::desc>{PlainDescOf(ctx.input(0))},
                                             PlainDescOf(ctx.output()));
  const memory::desc layout = DenseProducerLayout(ctx, 0);
  if (!layout.is_zero()) {
    kernel->FollowLayout(layout, memory::desc(layout.get_dims(), DnnlType(out), layout.get_strides()));
  }
  return kernel;
}

BYOC_HETERO_REGISTER_KERNEL("lookup", BuildLookup, Int8HostTraits());  // 8-bit in and out

}  // namespace byoc_hetero
