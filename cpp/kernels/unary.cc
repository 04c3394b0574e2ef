/*!
 * \file kernels/unary.cc
 * \brief unary: elementwise functions oneDNN 3.2 has no eltwise algorithm for, host kernels.
 *
 * Attrs: algorithm "erf" (required).  float32, any rank, plain layout.  (sqrt, exp, log, abs,
 * negative, rsqrt, square have oneDNN eltwise algorithms: they are activation names, run by
 * eltwise.cc or fused as post-ops.)
 */
#include <cmath>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildUnary(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  attrs.Choice("algorithm", {"erf"}, "");
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  ctx.ExpectOutputShape(ctx.input(0).shape);
  if (ctx.input(0).dtype != DType::kFloat32 || ctx.output().dtype != DType::kFloat32) {
    ctx.Fail("erf runs on float32 only");
  }
  const int64_t n = ctx.input(0).numel();
  HostFn fn = [n](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    float* y = static_cast<float*>(p[1]);
#pragma omp parallel for schedule(static) if (n > 4096)
    for (int64_t i = 0; i < n; ++i) y[i] = std::erf(x[i]);
  };
  const memory::desc md = PlainDescOf(ctx.input(0));
  return std::make_unique<HostKernel>(ctx.where(), "unary", std::move(fn), std::vector<memory::desc>{md}, md);
}

BYOC_HETERO_REGISTER_KERNEL("unary", BuildUnary);

}  // namespace byoc_hetero
