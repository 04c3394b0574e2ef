/*!
 * \file kernels/matmul.cc
 * \brief matmul: batched A @ B with numpy-style broadcasting of the batch dims (one oneDNN matmul).
 *
 * Inputs: a [..., M, K], b [..., K, N] (or [..., N, K] with transpose_b = 1), [bias] (N elements),
 * [residual] (the output's shape).  Both a and b may be run-time values (attention-style
 * products) or constants.  Batch dims broadcast as in numpy: ranks are aligned by prepending 1s,
 * and a dim of 1 repeats.  Attrs: transpose_b 0/1 (default 0), has_bias, and the epilogue as for
 * conv2d.  The output is [broadcast batch..., M, N].
 */
#include <algorithm>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildMatmul(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const bool transpose_b = attrs.Flag("transpose_b", false);
  const Epilogue epilogue = ctx.ReadEpilogue(attrs);
  const size_t base = ctx.node().inputs.size() - (epilogue.residual ? 1 : 0);
  const bool has_bias = attrs.Flag("has_bias", base == 3);
  attrs.CheckNoUnknown();

  ctx.ExpectInputCount(2 + has_bias + epilogue.residual,
                       std::string(has_bias ? "a, b, bias" : "a, b") +
                           (epilogue.residual ? ", residual" : ""));
  const auto& a = ctx.input(0).shape;
  const auto& b = ctx.input(1).shape;
  if (a.size() < 2 || b.size() < 2) {
    ctx.Fail("a and b must have rank >= 2, got shapes " + ShapeToString(a) + " and " +
             ShapeToString(b));
  }
  const size_t rank = std::max(a.size(), b.size());
  if (rank > 12) ctx.Fail("rank " + std::to_string(rank) + " exceeds the 12 dims oneDNN supports");
  auto align = [&](const std::vector<int64_t>& s) {
    std::vector<int64_t> out(rank - s.size(), 1);
    out.insert(out.end(), s.begin(), s.end());
    return out;
  };
  const std::vector<int64_t> as = align(a), bs = align(b);
  const int64_t m = as[rank - 2], k = as[rank - 1];
  const int64_t bk = transpose_b ? bs[rank - 1] : bs[rank - 2];
  const int64_t n = transpose_b ? bs[rank - 2] : bs[rank - 1];
  if (bk != k) {
    ctx.Fail("a shape " + ShapeToString(a) + " has K=" + std::to_string(k) + " but b shape " +
             ShapeToString(b) + (transpose_b ? " (transposed)" : "") + " has K=" + std::to_string(bk));
  }
  std::vector<int64_t> out_shape(rank);
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (as[i] != bs[i] && as[i] != 1 && bs[i] != 1) {
      ctx.Fail("batch dims of " + ShapeToString(a) + " and " + ShapeToString(b) +
               " do not broadcast (dim " + std::to_string(i) + ")");
    }
    out_shape[i] = std::max(as[i], bs[i]);
  }
  out_shape[rank - 2] = m;
  out_shape[rank - 1] = n;
  ctx.ExpectOutputShape(out_shape);
  if (has_bias && ctx.input(2).numel() != n) {
    ctx.Fail("bias must have N=" + std::to_string(n) + " elements, got shape " +
             ShapeToString(ctx.input(2).shape));
  }
  const size_t residual_index = 2 + has_bias;
  if (epilogue.residual) ctx.ExpectInputShape(residual_index, "residual", out_shape);

  // b as the logical [..., K, N] matrix over its stored bytes.
  memory::dims b_dims(bs.begin(), bs.end());
  memory::dims b_strides = PlainDesc(b_dims).get_strides();
  if (transpose_b) {
    std::swap(b_dims[rank - 2], b_dims[rank - 1]);
    std::swap(b_strides[rank - 2], b_strides[rank - 1]);
  }
  const memory::desc b_view = StridedDesc(b_dims, b_strides);
  const bool b_constant = ctx.input_constant.size() > 1 && ctx.input_constant[1];
  const memory::dims a_dims(as.begin(), as.end()), dst_dims(out_shape.begin(), out_shape.end());
  memory::dims bias_dims(rank, 1);
  bias_dims[rank - 1] = n;

  // A constant b is reordered once into the layout matmul prefers; one that arrives at run time is
  // read where it lies.
  auto make = [&](const memory::desc& b) {
    return dnnl::matmul::primitive_desc(ctx.engine, PlainDesc(a_dims), b,
                                        has_bias ? PlainDesc(bias_dims) : memory::desc(), PlainDesc(dst_dims),
                                        ctx.MakeAttr(epilogue));
  };
  dnnl::matmul::primitive_desc pd = b_constant ? MatmulForConstantWeight(make, b_dims) : make(b_view);
  return MakeAnchorKernel(ctx, "matmul", std::move(pd), PlainDesc(a_dims), b_view, bias_dims,
                          has_bias, dst_dims, epilogue);
}

BYOC_HETERO_REGISTER_KERNEL("matmul", BuildMatmul);

}  // namespace byoc_hetero
