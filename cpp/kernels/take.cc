/*!
 * \file kernels/take.cc
 * \brief take: gather slices of a float32 table along one axis by int64 / int32 indices (embedding
 *        rows; ViT's class token x[:, 0] along axis 1), a host kernel.
 *
 * Inputs: table (float32, rank >= 1, [..., V, ...] with V on `axis`), indices (int64 or int32, any
 * shape).  Attrs: axis (default 0, in [0, rank)).  With the table read as [outer, V, inner], the
 * output is [outer, indices..., inner]: shape table.shape[:axis] + indices.shape +
 * table.shape[axis+1:], or any shape of as many elements ending in table.shape[axis+1:] (the codegen
 * reads the indices through a reshape, which only renames them).
 *
 * Every index is checked before any row is copied: an index outside [0, V) raises an InputError
 * naming it, its position and V (never a read outside the table); negative indices are not wrapped
 * (Relax's take in its default "fast" mode does not define them).
 *
 * A table read in place from a file's read-only mapping (an embedding in a weights file) is read a few
 * rows at a time, its pages handed back after each few (weights.h LookupPages: a row's fault maps its
 * whole page-cache folio, up to 2 MiB).
 */
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "../weights.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

template <typename Index>
void Take(const float* table, const Index* ids, float* out, int64_t outer, int64_t count, int64_t rows,
          int64_t row_size, const std::string& where, LookupPages* pages) {
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= rows) {
      TVM_FFI_THROW(InputError) << where << ": index " << static_cast<int64_t>(ids[i]) << " at position " << i
                                << " of the indices is out of range for a table of " << rows
                                << " rows (expected 0 <= index < " << rows << ")";
    }
  }
  if (row_size == 1) {
    // single elements (a gather of scalars: DeBERTa's relative-position scores, 12 x 16384 per call):
    // a plain load / store per element, not a memcpy call each; blocks of the indices so that one
    // table (outer == 1) is still shared among the threads
    constexpr int64_t kBlock = 4096;
    const int64_t blocks = (count + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t b = 0; b < blocks; ++b) {
        const float* src = table + o * rows;
        float* dst = out + o * count;
        const int64_t end = std::min(count, (b + 1) * kBlock);
        for (int64_t i = b * kBlock; i < end; ++i) dst[i] = src[ids[i]];
      }
    }
    return;
  }
  const size_t bytes = sizeof(float) * static_cast<size_t>(row_size);
  const size_t table_bytes = bytes * static_cast<size_t>(outer * rows);
  if (pages->Releases(table, table_bytes)) {
    // a table mapped from a file: a few rows at a time, its pages handed back after each few (weights.h LookupPages)
    for (int64_t i0 = 0; i0 < count; i0 += LookupPages::kRows) {
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = i0; i < std::min(count, i0 + LookupPages::kRows); ++i) {
          std::memcpy(out + (o * count + i) * row_size, table + (o * rows + ids[i]) * row_size, bytes);
        }
      }
      LookupPages::Release(table, table_bytes);
    }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(out + (o * count + i) * row_size, table + (o * rows + ids[i]) * row_size, bytes);
    }
  }
}

}  // namespace

static std::unique_ptr<Kernel> BuildTake(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const int64_t axis = attrs.Int("axis", 0);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(2, "table, indices");
  const TensorInfo& table = ctx.input(0);
  const TensorInfo& ids = ctx.input(1);
  if (table.dtype != DType::kFloat32 || table.shape.empty()) {
    ctx.Fail(std::string("table must be a float32 tensor of rank >= 1, got ") + DTypeName(table.dtype) + " " +
             ShapeToString(table.shape));
  }
  if (ids.dtype != DType::kInt64 && ids.dtype != DType::kInt32) {
    ctx.Fail(std::string("indices must be int64 or int32, got ") + DTypeName(ids.dtype));
  }
  if (ctx.output().dtype != DType::kFloat32) ctx.Fail("the output must be float32");
  const int64_t rank = static_cast<int64_t>(table.shape.size());
  if (axis < 0 || axis >= rank) {
    attrs.Fail("axis", "must be in [0, " + std::to_string(rank) + ") for a table of shape " +
                           ShapeToString(table.shape) + ", got " + std::to_string(axis));
  }
  const std::vector<int64_t> row(table.shape.begin() + axis + 1, table.shape.end());
  int64_t row_size = 1, outer = 1;
  for (int64_t d : row) row_size *= d;
  for (int64_t a = 0; a < axis; ++a) outer *= table.shape[a];
  const auto& out = ctx.output().shape;
  const bool ends_in_row =
      out.size() >= row.size() && std::equal(row.begin(), row.end(), out.end() - static_cast<ptrdiff_t>(row.size()));
  if (!ends_in_row || ctx.output().numel() != outer * ids.numel() * row_size) {
    std::vector<int64_t> expected(table.shape.begin(), table.shape.begin() + axis);
    expected.insert(expected.end(), ids.shape.begin(), ids.shape.end());
    expected.insert(expected.end(), row.begin(), row.end());
    ctx.Fail("output tensor " + std::to_string(ctx.node().output) + " is declared with shape " +
             ShapeToString(out) + " but the op produces " + ShapeToString(expected) +
             " (or the same rows under another leading shape)");
  }
  const int64_t rows = table.shape[axis], count = ids.numel();
  const std::string where = ctx.where();
  const bool wide = ids.dtype == DType::kInt64;
  auto pages = std::make_shared<LookupPages>();  // the table's pages, when it is mapped from a file
  HostFn fn = [=](const std::vector<void*>& p) {
    const float* t = static_cast<const float*>(p[0]);
    float* o = static_cast<float*>(p[2]);
    if (wide) {
      Take(t, static_cast<const int64_t*>(p[1]), o, outer, count, rows, row_size, where, pages.get());
    } else {
      Take(t, static_cast<const int32_t*>(p[1]), o, outer, count, rows, row_size, where, pages.get());
    }
  };
  return std::make_unique<HostKernel>(ctx.where(), "take", std::move(fn),
                                      std::vector<memory::desc>{PlainDescOf(table), PlainDescOf(ids)},
                                      PlainDescOf(ctx.output()));
}

BYOC_HETERO_REGISTER_KERNEL("take", BuildTake);

}  // namespace byoc_hetero
