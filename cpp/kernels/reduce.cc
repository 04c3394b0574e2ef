/*!
 * \file kernels/reduce.cc
 * \brief reduce: mean / sum / max / min over some axes (one oneDNN reduction primitive).
 *
 * Attrs: algorithm "mean" | "sum" | "max" | "min" (required).  The reduced axes are those where
 * the output tensor (same rank as the data) has 1 and the data does not, as in oneDNN: every
 * output dim equals the data's or is 1 (reducing an axis of size 1 changes nothing).  A reduction
 * that drops its axes (keepdims=False) is this node followed by a `reshape`.  The data is read in
 * its producer's layout; the output is plain.
 */
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {
const std::vector<std::pair<std::string, dnnl::algorithm>>& ReduceAlgorithms() {
  static const std::vector<std::pair<std::string, dnnl::algorithm>> algs{
      {"mean", dnnl::algorithm::reduction_mean},
      {"sum", dnnl::algorithm::reduction_sum},
      {"max", dnnl::algorithm::reduction_max},
      {"min", dnnl::algorithm::reduction_min},
  };
  return algs;
}
}  // namespace

static std::unique_ptr<Kernel> BuildReduce(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  std::vector<std::string> names;
  for (const auto& a : ReduceAlgorithms()) names.push_back(a.first);
  const std::string alg_name = attrs.Choice("algorithm", names, "");
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  const auto& in = ctx.input(0).shape;
  const auto& out = ctx.output().shape;
  if (in.empty()) ctx.Fail("data must have rank >= 1, got a scalar");
  bool ok = out.size() == in.size();
  for (size_t i = 0; ok && i < in.size(); ++i) ok = out[i] == in[i] || out[i] == 1;
  if (!ok) {
    ctx.Fail("output tensor " + std::to_string(ctx.node().output) + " has shape " + ShapeToString(out) +
             "; a reduction of " + ShapeToString(in) +
             " keeps the rank, each dim the data's or 1 (the reduced axes)");
  }
  dnnl::algorithm alg = dnnl::algorithm::undef;
  for (const auto& a : ReduceAlgorithms()) {
    if (a.first == alg_name) alg = a.second;
  }
  const memory::dims dst_dims(out.begin(), out.end());
  const memory::desc dst = PlainDesc(dst_dims);
  if (in == out) {
    // nothing is reduced (every reduced axis has size 1): the output is the input's bytes
    return std::make_unique<AliasKernel>(PlainDesc(memory::dims(in.begin(), in.end())), dst);
  }
  const memory::desc src = ctx.InputLayout(0);
  dnnl::reduction::primitive_desc pd(ctx.engine, alg, src, dst, 0.f, 0.f, ctx.MakeAttr());
  return std::make_unique<PrimitiveKernel>(ctx.where(), "reduce", std::move(pd), std::vector<int>{DNNL_ARG_SRC},
                                           std::vector<OperandLayout>{{PlainDesc(src.get_dims()), pd.src_desc()}},
                                           OperandLayout{dst, dst});
}

BYOC_HETERO_REGISTER_KERNEL("reduce", BuildReduce);

}  // namespace byoc_hetero
