/*!
 * \file kernels/rope.cc
 * \brief rope: rotary position embedding y = x * cos + rotate_half(x) * sin, rotate_half(x) =
 *        concat(-x[..., D/2:], x[..., :D/2]) (host kernel), the eight region steps transformers'
 *        RoPE lowers to (region pass fuse_rotary_embeddings, ops/rotary.py) as one step.
 *
 * Inputs: x, cos, sin (float32).  Attr axes (optional, default identity): the node reads x
 * permuted by axes (y's dim i is x's dim axes[i]), the last axis staying last: the head permute
 * [B, S, H, D] -> [B, H, S, D] before RoPE read as strides instead of a copy.  cos and sin have
 * one shape that broadcasts (numpy rules) to y's without growing it, last dim D (even).  Per
 * row of D: y[j] = x[j] * c[j] + (-x[j + D/2]) * s[j] for j < D/2, x[j] * c[j] + x[j - D/2] * s[j]
 * after, times attr scale (default 1: a multiply by a constant after RoPE, folded by the pass):
 * the products, sum and product the separate steps computed, so NaN / inf come out where they did.
 * Rows split across the call's threads from ParallelMinimum() elements on (SmolLM's [1, 9, 128,
 * 64] stays on one thread: the fork / join is what this kernel saves).
 */
#include <algorithm>
#include <cmath>
#include <numeric>
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

/*! \brief Row-major element strides of a shape. */
std::vector<int64_t> PlainStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

/*! \brief Where the rows of y read x and cos / sin: per leading dim of y, its size and strides. */
struct RowWalk {
  std::vector<int64_t> dims, x_strides, cs_strides;

  /*! \brief The offsets of row r into x and into cos / sin. */
  void Offsets(int64_t r, int64_t* xo, int64_t* co) const {
    *xo = 0;
    *co = 0;
    for (size_t i = dims.size(); i-- > 0;) {
      const int64_t k = r % dims[i];
      r /= dims[i];
      *xo += k * x_strides[i];
      *co += k * cs_strides[i];
    }
  }
};

/*! \brief One row of D = 2h: the same products and sum as the unfused steps (no fused multiply-add). */
void RotateRow(const float* __restrict x, const float* __restrict c, const float* __restrict s,
               float* __restrict y, int64_t h, float scale) {
  for (int64_t j = 0; j < h; ++j) y[j] = (x[j] * c[j] + (-x[j + h]) * s[j]) * scale;
  for (int64_t j = h; j < 2 * h; ++j) y[j] = (x[j] * c[j] + x[j - h] * s[j]) * scale;
}

#if defined(__x86_64__)
/*! \brief RotateRow, 16 lanes a step, the tail masked: GCC at -O2 left the scalar loop above as
 *         SSE scalar code (51 us per SmolLM q rotation of [9, 128, 64] at 1 thread). */
__attribute__((target("avx512f"))) void RotateRowAvx512(const float* x, const float* c, const float* s, float* y,
                                                         int64_t h, float scale) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (int64_t j = 0; j < h; j += 16) {
    const __mmask16 m = j + 16 <= h ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (h - j)) - 1);
    const __m512 lo = _mm512_maskz_loadu_ps(m, x + j), hi = _mm512_maskz_loadu_ps(m, x + j + h);
    const __m512 neg_hi = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(hi), sign));  // -x, as negate
    const __m512 first = _mm512_add_ps(_mm512_mul_ps(lo, _mm512_maskz_loadu_ps(m, c + j)),
                                       _mm512_mul_ps(neg_hi, _mm512_maskz_loadu_ps(m, s + j)));
    const __m512 second = _mm512_add_ps(_mm512_mul_ps(hi, _mm512_maskz_loadu_ps(m, c + j + h)),
                                        _mm512_mul_ps(lo, _mm512_maskz_loadu_ps(m, s + j + h)));
    _mm512_mask_storeu_ps(y + j, m, _mm512_mul_ps(first, vscale));
    _mm512_mask_storeu_ps(y + j + h, m, _mm512_mul_ps(second, vscale));
  }
}
#endif

using RowFn = void (*)(const float*, const float*, const float*, float*, int64_t, float);

RowFn PickRowFn() {
#if defined(__x86_64__)
  if (IsaHasAvx512()) return RotateRowAvx512;
#endif
  return RotateRow;
}

RowWalk MakeWalk(const KernelContext& ctx, const std::vector<int64_t>& axes) {
  const auto& x = ctx.input(0).shape;
  const auto& cs = ctx.input(1).shape;
  const size_t rank = x.size();
  const std::vector<int64_t> xs = PlainStrides(x), css = PlainStrides(cs);
  RowWalk walk;
  for (size_t i = 0; i + 1 < rank; ++i) {
    walk.dims.push_back(x[axes[i]]);
    walk.x_strides.push_back(xs[axes[i]]);
    const size_t lead = rank - cs.size();  // cos / sin are right-aligned to y
    walk.cs_strides.push_back(i < lead || cs[i - lead] == 1 ? 0 : css[i - lead]);
  }
  return walk;
}

void CheckShapes(const KernelContext& ctx, const std::vector<int64_t>& axes, std::vector<int64_t>* out) {
  const auto& x = ctx.input(0).shape;
  const auto& cs = ctx.input(1).shape;
  const size_t rank = x.size();
  for (size_t k = 0; k < 3; ++k) {
    if (ctx.input(k).dtype != DType::kFloat32) {
      ctx.Fail("input " + std::to_string(k) + " is " + DTypeName(ctx.input(k).dtype) + "; rope runs float32 only");
    }
  }
  if (ctx.input(2).shape != cs) {
    ctx.Fail("cos " + ShapeToString(cs) + " and sin " + ShapeToString(ctx.input(2).shape) + " differ in shape");
  }
  std::vector<int64_t> sorted(axes);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < rank; ++i) {
    if (sorted[i] != static_cast<int64_t>(i)) {
      ctx.Fail("attr axes " + ShapeToString(axes) + " is no permutation of the " + std::to_string(rank) + " axes of x");
    }
  }
  if (axes[rank - 1] != static_cast<int64_t>(rank - 1)) ctx.Fail("attr axes moves the last axis; rope rotates it");
  for (size_t i = 0; i < rank; ++i) out->push_back(x[axes[i]]);
  const int64_t d = x[rank - 1];
  bool ok = cs.size() <= rank && !cs.empty() && cs.back() == d;
  for (size_t i = 0; ok && i < cs.size(); ++i) ok = cs[i] == 1 || cs[i] == (*out)[rank - cs.size() + i];
  if (!ok) {
    ctx.Fail("cos / sin " + ShapeToString(cs) + " do not broadcast to " + ShapeToString(*out) +
             " with the last dim whole");
  }
  if (d % 2 != 0) ctx.Fail("the last dim of x is " + std::to_string(d) + "; rotate_half needs it even");
}

}  // namespace

static std::unique_ptr<Kernel> BuildRope(const KernelContext& ctx) {
  ctx.ExpectInputCount(3, "x, cos, sin");
  const size_t rank = ctx.input(0).shape.size();
  if (rank < 1) ctx.Fail("x must have rank >= 1, got a scalar");
  AttrReader attrs(ctx.graph, ctx.node_index);
  std::vector<int64_t> identity(rank);
  std::iota(identity.begin(), identity.end(), 0);
  const std::vector<int64_t> axes = attrs.Ints("axes", rank, identity);
  const double scale_attr = attrs.Float("scale", 1.0);
  attrs.CheckNoUnknown();
  if (!std::isfinite(scale_attr)) attrs.Fail("scale", "expected a finite number");
  const float scale = static_cast<float>(scale_attr);
  std::vector<int64_t> out;
  CheckShapes(ctx, axes, &out);
  ctx.ExpectOutputShape(out);
  const int64_t d = out.back(), rows = d == 0 ? 0 : ctx.output().numel() / d;
  const RowWalk walk = MakeWalk(ctx, axes);
  const bool parallel = rows * d >= ParallelMinimum();
  const RowFn row_fn = PickRowFn();
  HostFn fn = [walk, rows, d, parallel, scale, row_fn](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    const float* c = static_cast<const float*>(p[1]);
    const float* s = static_cast<const float*>(p[2]);
    float* y = static_cast<float*>(p[3]);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t xo = 0, co = 0;
      walk.Offsets(r, &xo, &co);
      row_fn(x + xo, c + co, s + co, y + r * d, d / 2, scale);
    }
  };
  std::vector<memory::desc> inputs;
  for (size_t k = 0; k < 3; ++k) inputs.push_back(PlainDescOf(ctx.input(k)));
  return std::make_unique<HostKernel>(ctx.where(), "rope", std::move(fn), std::move(inputs), PlainDescOf(ctx.output()));
}

BYOC_HETERO_REGISTER_KERNEL("rope", BuildRope);

}  // namespace byoc_hetero
