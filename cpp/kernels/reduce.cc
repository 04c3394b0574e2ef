/*!
 * \file kernels/reduce.cc
 * \brief reduce: mean / sum / max / min / mean of squares over some axes (one oneDNN reduction
 *        primitive), with an optional shift and activation applied to the result as post-ops.
 *
 * Attrs: algorithm "mean" | "sum" | "max" | "min" | "mean_square" (required); shift (a number,
 * default 0: added to the result) and activation (+ clip), as in binary: act(reduce(x) + shift).
 * "mean_square" is oneDNN's norm_lp_power_p_sum with p = 2 (the sum of squares) times 1/n: with
 * shift eps and activation rsqrt it is RMSNorm's 1/sqrt(mean(x^2) + eps) in one pass over x
 * (region pass fuse_rms_statistics, ops/rms_statistic.py), where square, mean and add were three.  The reduced axes are those where
 * the output tensor (same rank as the data) has 1 and the data does not, as in oneDNN: every
 * output dim equals the data's or is 1 (reducing an axis of size 1 changes nothing).  A reduction
 * that drops its axes (keepdims=False) is this node followed by a `reshape`.  The data is read in
 * its producer's layout; the output is plain.
 */
#include <cmath>
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
      {"mean_square", dnnl::algorithm::reduction_norm_lp_power_p_sum},
  };
  return algs;
}
}  // namespace

static std::unique_ptr<Kernel> BuildReduce(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  std::vector<std::string> names;
  for (const auto& a : ReduceAlgorithms()) names.push_back(a.first);
  const std::string alg_name = attrs.Choice("algorithm", names, "");
  const double shift = attrs.Float("shift", 0.0);
  const Activation act = ctx.ReadActivation(attrs, "activation", "clip");
  attrs.CheckNoUnknown();
  if (!std::isfinite(shift)) attrs.Fail("shift", "expected a finite number");
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
  const bool square = alg_name == "mean_square";
  if (in == out && !square && shift == 0.0 && act.none()) {
    // nothing is reduced (every reduced axis has size 1): the output is the input's bytes
    return std::make_unique<AliasKernel>(PlainDesc(memory::dims(in.begin(), in.end())), dst);
  }
  int64_t n = 1;  // elements per output element
  for (size_t i = 0; i < in.size(); ++i) n *= in[i] / out[i];
  dnnl::primitive_attr attr = ctx.MakeAttr();
  dnnl::post_ops ops;
  const float scale = square ? static_cast<float>(1.0 / static_cast<double>(n)) : 1.f;
  if (scale != 1.f || shift != 0.0) ops.append_eltwise(dnnl::algorithm::eltwise_linear, scale, static_cast<float>(shift));
  if (!act.none()) ops.append_eltwise(act.alg, act.alpha, act.beta);
  if (ops.len() > 0) attr.set_post_ops(ops);
  const memory::desc src = ctx.InputLayout(0);
  // norm_lp_power_p_sum: sum(|x|^p) + eps, here p = 2 and eps = 0; the other algorithms ignore p, eps
  dnnl::reduction::primitive_desc pd(ctx.engine, alg, src, dst, square ? 2.f : 0.f, 0.f, attr);
  return std::make_unique<PrimitiveKernel>(ctx.where(), "reduce", std::move(pd), std::vector<int>{DNNL_ARG_SRC},
                                           std::vector<OperandLayout>{{PlainDesc(src.get_dims()), pd.src_desc()}},
                                           OperandLayout{dst, dst});
}

BYOC_HETERO_REGISTER_KERNEL("reduce", BuildReduce);

}  // namespace byoc_hetero
