/*!
 * \file kernels/take_wq.cc
 * \brief take_wq: rows of a weight-only quantized table by int64 / int32 indices (an embedding
 *        lookup on codes), dequantizing only the rows the indices name; a host kernel beside dense_wq.
 *
 * Inputs: indices (int64 or int32, any shape), weight (constant codes as dense_wq reads them: uint8
 * [V, K / 2] for bits 4, two a byte with the even k in the low nibble; uint8 or int8 [V, K] for
 * bits 8), scales (constant float32 or float16, [V, K / block] or [V, K / block, 1]), zero points
 * (constant uint8 of the scales' shape, with has_zero_point), offsets (constant float32 of the
 * scales' shape, with has_offset).  Attrs: bits, block, has_zero_point, has_offset (as dense_wq).
 * Output: float32 [indices..., K] (or the same rows under another leading shape):
 *   out[i, k] = (q[id_i, k] - z[id_i, k / block]) * s[id_i, k / block] (+ o[id_i, k / block])
 * in the float arithmetic of byoc_hetero.quant.weight_only.dequantize_codes (the difference exact,
 * one rounding for the product, one for the offset's sum): numpy's dequantize-then-take to the bit.
 *
 * The constants are read in place, in the layout the region stores them (no packed copy): a table
 * tied to the LM head is the region's one constant of codes, which the head's dense_wq also reads
 * (it repacks its own tiles from it at __init_).  Before any row is read, every index is checked (an
 * InputError naming it, as take) and the scales of every row looked up (finite and nonzero, else a
 * ValueError naming the element).  Constants read in place from a file's read-only mapping (a weights
 * file) are read a few rows at a time, their pages handed back after each few (weights.h LookupPages).
 *
 * Portable C++ only, no per-ISA micro-kernels: a lookup dequantizes (indices x K) weights, the work
 * of copying as many float rows, while the step's LM head alone multiplies all V x K of them: at a
 * decode step (one index) the lookup is 1 / V of the head's work (1 / 49152 at SmolLM's vocabulary).
 */
#include <tvm/ffi/error.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../weights.h"
#include "dense_wq.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief What the attrs and the table's shapes say. */
struct TableShape {
  int64_t rows = 0, k = 0, block = 0, count = 0;  // count: indices
  int bits = 8;
  bool signed_codes = false, has_zero_point = false, has_offset = false, f16_scales = false, wide = true;
  int64_t blocks() const { return k / block; }
  int64_t row_bytes() const { return k * bits / 8; }
  int32_t implicit_zero() const { return signed_codes || has_offset ? 0 : 1 << (bits - 1); }
};

/*! \brief The constants of one call, in place. */
struct TableData {
  const uint8_t* codes;
  const void* scales;
  const uint8_t* zeros;  // or null
  const float* offsets;  // or null
};

/*! \brief wq::ExpectPerBlock for \p s's rows and blocks. */
void ExpectPerBlock(const KernelContext& ctx, size_t k, const char* name, const TableShape& s) {
  wq::ExpectPerBlock(ctx, k, name, s.rows, s.blocks());
}

/*! \brief The weight's codes: rows, K and signedness, checked against bits. */
void ReadCodes(const KernelContext& ctx, TableShape* s) {
  ctx.ExpectRank(1, "weight", 2);
  const TensorInfo& w = ctx.input(1);
  s->rows = w.shape[0];
  s->signed_codes = w.dtype == DType::kInt8;
  if (!IsInt8(w.dtype) || (s->signed_codes && (s->bits != 8 || s->has_zero_point))) {
    ctx.Fail(std::string("weight must be uint8 codes (or int8 for bits 8 without zero points), got ") +
             DTypeName(w.dtype));
  }
  s->k = w.shape[1] * 8 / s->bits;
  const bool power_of_two = s->block >= 16 && (s->block & (s->block - 1)) == 0;
  if (s->block < 1 || s->k % s->block != 0 || (s->block != s->k && !power_of_two)) {
    ctx.Fail("block " + std::to_string(s->block) + " must be K = " + std::to_string(s->k) +
             " or a power of two >= 16 dividing K");
  }
}

/*! \brief Scales, zero points and offsets: dtypes and shapes. */
void ReadPerBlock(const KernelContext& ctx, TableShape* s) {
  const TensorInfo& scales = ctx.input(2);
  s->f16_scales = scales.dtype == DType::kFloat16;
  if (scales.dtype != DType::kFloat32 && !s->f16_scales) {
    ctx.Fail(std::string("scales must be float32 or float16, got ") + DTypeName(scales.dtype));
  }
  ExpectPerBlock(ctx, 2, "scales", *s);
  size_t next = 3;
  if (s->has_zero_point) {
    if (ctx.input(next).dtype != DType::kUInt8) {
      ctx.Fail(std::string("zero_points must be uint8, got ") + DTypeName(ctx.input(next).dtype));
    }
    ExpectPerBlock(ctx, next++, "zero_points", *s);
  }
  if (s->has_offset) {
    if (ctx.input(next).dtype != DType::kFloat32) {
      ctx.Fail(std::string("offsets must be float32, got ") + DTypeName(ctx.input(next).dtype));
    }
    ExpectPerBlock(ctx, next, "offsets", *s);
  }
}

/*! \brief Attrs and input shapes, checked; failures name the attr or input. */
TableShape ReadTableShape(const KernelContext& ctx, AttrReader& attrs) {
  TableShape s;
  wq::ReadCodeAttrs(attrs, &s);
  attrs.CheckNoUnknown();
  const size_t count = 3 + (s.has_zero_point ? 1 : 0) + (s.has_offset ? 1 : 0);
  ctx.ExpectInputCount(count, std::string("indices, weight, scales") + (s.has_zero_point ? ", zero_points" : "") +
                                  (s.has_offset ? ", offsets" : ""));
  const TensorInfo& ids = ctx.input(0);
  if (ids.dtype != DType::kInt64 && ids.dtype != DType::kInt32) {
    ctx.Fail(std::string("indices must be int64 or int32, got ") + DTypeName(ids.dtype));
  }
  s.wide = ids.dtype == DType::kInt64;
  s.count = ids.numel();
  ReadCodes(ctx, &s);
  ReadPerBlock(ctx, &s);
  for (size_t i = 1; i < count; ++i) {
    if (ctx.input_constant.size() <= i || !ctx.input_constant[i]) {
      ctx.Fail("input " + std::to_string(i) + " (weight, scales, zero points, offsets) must be a constant");
    }
  }
  const auto& out = ctx.output().shape;
  if (ctx.output().dtype != DType::kFloat32 || out.empty() || out.back() != s.k ||
      ctx.output().numel() != s.count * s.k) {
    std::vector<int64_t> expected(ids.shape.begin(), ids.shape.end());
    expected.push_back(s.k);
    ctx.Fail("the output must be float32 " + ShapeToString(expected) + " (or the same rows under another leading "
             "shape), got " + DTypeName(ctx.output().dtype) + " " + ShapeToString(out));
  }
  return s;
}

/*! \brief Scale \p i (row-major [V, K / block]) as float32. */
float ScaleAt(const TableShape& s, const TableData& t, int64_t i) {
  return s.f16_scales ? wq::HalfToFloat(static_cast<const uint16_t*>(t.scales)[i])
                      : static_cast<const float*>(t.scales)[i];
}

/*! \brief Every index in [0, rows), else an InputError naming it, and the scales of every row looked up
 *         finite and nonzero, else a ValueError naming the element: before any row is read, on the
 *         calling thread (never a throw inside the parallel loop). */
template <typename Index>
void CheckRows(const Index* ids, const TableShape& s, const TableData& t, const std::string& where) {
  for (int64_t i = 0; i < s.count; ++i) {
    if (ids[i] < 0 || ids[i] >= s.rows) {
      TVM_FFI_THROW(InputError) << where << ": index " << static_cast<int64_t>(ids[i]) << " at position " << i
                                << " of the indices is out of range for a table of " << s.rows
                                << " rows (expected 0 <= index < " << s.rows << ")";
    }
  }
  for (int64_t i = 0; i < s.count; ++i) {
    const int64_t r = static_cast<int64_t>(ids[i]);
    for (int64_t b = 0; b < s.blocks(); ++b) {
      const float scale = ScaleAt(s, t, r * s.blocks() + b);
      if (!std::isfinite(scale) || scale == 0.f) {
        std::ostringstream os;
        os << where << ": scales[" << r << ", " << b << "] is " << scale << ": expected a finite, nonzero scale";
        TVM_FFI_THROW(ValueError) << os.str();
      }
    }
  }
}

/*! \brief Row \p r of the table, dequantized into \p out (K floats). */
void DequantizeRow(const TableShape& s, const TableData& t, int64_t r, float* out) {
  const uint8_t* q = t.codes + r * s.row_bytes();
  for (int64_t b = 0; b < s.blocks(); ++b) {
    const int64_t i = r * s.blocks() + b;
    const float scale = ScaleAt(s, t, i);
    const int32_t zero = t.zeros != nullptr ? static_cast<int32_t>(t.zeros[i]) : s.implicit_zero();
    float* dst = out + b * s.block;
    for (int64_t j = 0, k = b * s.block; j < s.block; ++j, ++k) {
      int32_t code;
      if (s.bits == 4) {
        code = (q[k / 2] >> (4 * (k % 2))) & 0x0F;
      } else {
        code = s.signed_codes ? static_cast<int32_t>(static_cast<int8_t>(q[k])) : static_cast<int32_t>(q[k]);
      }
      dst[j] = static_cast<float>(code - zero) * scale;
    }
    if (t.offsets != nullptr) {  // a second rounding, as dequantize_codes' ``w += offsets``
      for (int64_t j = 0; j < s.block; ++j) dst[j] += t.offsets[i];
    }
  }
}

/*! \brief The constants' byte sizes, in TableData's order (codes, scales, zero points, offsets; 0: absent). */
std::array<size_t, 4> TableBytes(const TableShape& s) {
  const size_t per_block = static_cast<size_t>(s.rows * s.blocks());
  return {static_cast<size_t>(s.rows * s.row_bytes()), per_block * (s.f16_scales ? 2 : 4),
          s.has_zero_point ? per_block : 0, s.has_offset ? per_block * 4 : 0};
}

/*! \brief The pages of each constant that lies in a file's read-only mapping (weights.h LookupPages). */
using TablePages = std::array<LookupPages, 4>;

/*! \brief One call: the indices checked, then each looked-up row dequantized (rows across threads); constants
 *         mapped from a file are read kRows rows at a time, their pages handed back after each (LookupPages). */
template <typename Index>
void TakeRows(const TableShape& s, const Index* ids, const TableData& t, float* out, const std::string& where,
              TablePages& pages) {
  CheckRows(ids, s, t, where);
  const std::array<const void*, 4> data{t.codes, t.scales, t.zeros, t.offsets};
  const std::array<size_t, 4> bytes = TableBytes(s);
  std::array<bool, 4> mapped{};
  bool any = false;
  for (size_t k = 0; k < data.size(); ++k) any = (mapped[k] = pages[k].Releases(data[k], bytes[k])) || any;
  if (!any) {
#pragma omp parallel for schedule(static) if (s.count * s.k >= (1 << 16))
    for (int64_t i = 0; i < s.count; ++i) DequantizeRow(s, t, static_cast<int64_t>(ids[i]), out + i * s.k);
    return;
  }
  for (size_t k = 0; k < data.size(); ++k) {  // what CheckRows read
    if (mapped[k]) LookupPages::Release(data[k], bytes[k]);
  }
  for (int64_t i0 = 0; i0 < s.count; i0 += LookupPages::kRows) {
    for (int64_t i = i0; i < std::min(s.count, i0 + LookupPages::kRows); ++i) {
      DequantizeRow(s, t, static_cast<int64_t>(ids[i]), out + i * s.k);
    }
    for (size_t k = 0; k < data.size(); ++k) {
      if (mapped[k]) LookupPages::Release(data[k], bytes[k]);
    }
  }
}

std::unique_ptr<Kernel> BuildTakeWq(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const TableShape s = ReadTableShape(ctx, attrs);
  const std::string where = ctx.where();
  auto pages = std::make_shared<TablePages>();  // the constants' pages, when they are mapped from a file
  HostFn fn = [s, where, pages](const std::vector<void*>& p) {
    size_t next = 3;
    const uint8_t* zeros = s.has_zero_point ? static_cast<const uint8_t*>(p[next++]) : nullptr;
    const float* offsets = s.has_offset ? static_cast<const float*>(p[next++]) : nullptr;
    const TableData t{static_cast<const uint8_t*>(p[1]), p[2], zeros, offsets};
    float* out = static_cast<float*>(p[next]);
    if (s.wide) {
      TakeRows(s, static_cast<const int64_t*>(p[0]), t, out, where, *pages);
    } else {
      TakeRows(s, static_cast<const int32_t*>(p[0]), t, out, where, *pages);
    }
  };
  std::vector<memory::desc> inputs;
  for (size_t k = 0; k < ctx.node().inputs.size(); ++k) inputs.push_back(PlainDescOf(ctx.input(k)));
  const std::string label = std::to_string(s.bits) + "-bit table rows (portable C++)";
  return std::make_unique<HostKernel>(where + ": " + label, "take_wq", std::move(fn), std::move(inputs),
                                      PlainDescOf(ctx.output()));
}

/*! \brief Reads 8-bit codes and zero points and float16 scales. */
KernelTraits TakeWqTraits() {
  KernelTraits traits;
  traits.accepts_int8 = true;
  traits.accepts_float16 = true;
  return traits;
}

}  // namespace

BYOC_HETERO_REGISTER_KERNEL("take_wq", BuildTakeWq, TakeWqTraits());

}  // namespace byoc_hetero
