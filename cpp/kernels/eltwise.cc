/*!
 * \file kernels/eltwise.cc
 * \brief eltwise: an activation on its own (one oneDNN eltwise_forward), for activations that do
 *        not follow a conv2d / dense / matmul / binary they could be fused into.
 *
 * Attrs: algorithm "relu" | "clip" | "sigmoid" | "tanh" | "gelu_erf" | "gelu_tanh" | "silu"
 * (required), clip [min, max] (with "clip").  Any rank; reads and writes the producer's layout.
 */
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildEltwise(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  if (!attrs.Has("algorithm")) {
    std::string list;
    for (const auto& n : ActivationNames()) {
      if (n != "none") list += (list.empty() ? "\"" : ", \"") + n + "\"";
    }
    attrs.Fail("algorithm", "missing (required, one of " + list + ")");
  }
  const Activation act = ctx.ReadActivation(attrs, "algorithm", "clip");
  if (act.none()) attrs.Fail("algorithm", "\"none\" is not an eltwise algorithm");
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  ctx.ExpectOutputShape(ctx.input(0).shape);

  const memory::desc src = ctx.InputLayout(0);
  auto make = [&](const memory::desc& dst) {
    return dnnl::eltwise_forward::primitive_desc(ctx.engine, dnnl::prop_kind::forward_inference, act.alg, src, dst,
                                                 act.alpha, act.beta, ctx.MakeAttr());
  };
  // bf16 region: a bf16-stored input (its producer stores it so only when this output qualifies,
  // OutputOnlyFeedsBf16Convs: a transformer MLP's gelu read by the second dense) is computed in f32
  // and written bf16; oneDNN 3.2 has no f32 -> bf16 eltwise, so the rounding moves before it.
  const memory::desc pd_dst = AnyDesc(src.get_dims(), src.get_data_type());
  dnnl::eltwise_forward::primitive_desc pd = make(pd_dst);
  std::vector<OperandLayout> inputs{{PlainDesc(src.get_dims()), pd.src_desc()}};
  OperandLayout output{PlainDesc(src.get_dims()), pd.dst_desc()};
  return std::make_unique<PrimitiveKernel>(ctx.where(), "eltwise", std::move(pd),
                                           std::vector<int>{DNNL_ARG_SRC}, std::move(inputs),
                                           std::move(output));
}

/*!
 * \brief bf16 region: the input is stored bf16 when the output is (a transformer MLP's gelu read by
 *        the second dense): the rounding moves before the activation, as oneDNN 3.2 has no
 *        f32 -> bf16 eltwise (BuildEltwise computes in the input's type).
 */
static KernelTraits EltwiseTraits() {
  KernelTraits traits;
  traits.bf16_input = Bf16ReadLikeOutput;
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("eltwise", BuildEltwise, EltwiseTraits());

}  // namespace byoc_hetero
