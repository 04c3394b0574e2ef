/*!
 * \file kernels/take.cc
 * \brief take: gather rows of a float32 table by int64 / int32 indices (embeddings), a host kernel.
 *
 * Inputs: table (float32, rank >= 1, [V, ...]), indices (int64 or int32, any shape).  Attrs: axis
 * (default 0; only 0).  The output holds one table row per index, in the indices' row-major order:
 * shape indices.shape + table.shape[1:], or any shape of as many rows ending in table.shape[1:]
 * (the codegen reads the indices through a reshape, which only renames them).
 *
 * Every index is checked before any row is copied: an index outside [0, V) raises an InputError
 * naming it, its position and V (never a read outside the table); negative indices are not wrapped
 * (Relax's take in its default "fast" mode does not define them).
 */
#include <tvm/ffi/error.h>

#include <cstring>
#include <string>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

template <typename Index>
void Take(const float* table, const Index* ids, float* out, int64_t count, int64_t rows, int64_t row_size,
          const std::string& where) {
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= rows) {
      TVM_FFI_THROW(InputError) << where << ": index " << static_cast<int64_t>(ids[i]) << " at position " << i
                                << " of the indices is out of range for a table of " << rows
                                << " rows (expected 0 <= index < " << rows << ")";
    }
  }
  const size_t bytes = sizeof(float) * static_cast<size_t>(row_size);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) std::memcpy(out + i * row_size, table + ids[i] * row_size, bytes);
}

}  // namespace

static std::unique_ptr<Kernel> BuildTake(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const int64_t axis = attrs.Int("axis", 0);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(2, "table, indices");
  if (axis != 0) attrs.Fail("axis", "only 0 is supported (rows of the table), got " + std::to_string(axis));
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
  const std::vector<int64_t> row(table.shape.begin() + 1, table.shape.end());
  int64_t row_size = 1;
  for (int64_t d : row) row_size *= d;
  const auto& out = ctx.output().shape;
  const bool ends_in_row =
      out.size() >= row.size() && std::equal(row.begin(), row.end(), out.end() - static_cast<ptrdiff_t>(row.size()));
  if (!ends_in_row || ctx.output().numel() != ids.numel() * row_size) {
    std::vector<int64_t> expected = ids.shape;
    expected.insert(expected.end(), row.begin(), row.end());
    ctx.Fail("output tensor " + std::to_string(ctx.node().output) + " is declared with shape " +
             ShapeToString(out) + " but the op produces " + ShapeToString(expected) +
             " (or the same rows under another leading shape)");
  }
  const int64_t rows = table.shape[0], count = ids.numel();
  const std::string where = ctx.where();
  const bool wide = ids.dtype == DType::kInt64;
  HostFn fn = [=](const std::vector<void*>& p) {
    const float* t = static_cast<const float*>(p[0]);
    float* o = static_cast<float*>(p[2]);
    if (wide) {
      Take(t, static_cast<const int64_t*>(p[1]), o, count, rows, row_size, where);
    } else {
      Take(t, static_cast<const int32_t*>(p[1]), o, count, rows, row_size, where);
    }
  };
  return std::make_unique<HostKernel>(ctx.where(), "take", std::move(fn),
                                      std::vector<memory::desc>{PlainDescOf(table), PlainDescOf(ids)},
                                      PlainDescOf(ctx.output()));
}

BYOC_HETERO_REGISTER_KERNEL("take", BuildTake);

}  // namespace byoc_hetero
