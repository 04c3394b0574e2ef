/*!
 * \file kernels/concat.cc
 * \brief concat: the inputs joined along one axis (one oneDNN concat primitive).
 *
 * Attrs: axis (required, 0 <= axis < rank).  All inputs have the output's rank and agree on every
 * other dim; the output is plain.  The primitive copies each input once; it runs only where no
 * producer wrote its input in place: in a batch-1 tensor the planner lets the producer of an input
 * that only the concat reads write straight into its slice of the concat's buffer, and then
 * reorders the other inputs into their sub-memories itself (plan/concat_in_place.h); the planner
 * knows this op joins its inputs from its traits (ConcatTraits).  Growing concats (DenseNet: each
 * one's inputs the leading inputs of the next) share the longest one's buffer, and none of them
 * runs this primitive (concat families, plan/concat_in_place.h).
 */
#include <optional>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildConcat(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const int64_t axis = attrs.Int("axis", -1);
  attrs.CheckNoUnknown();
  const size_t count = ctx.node().inputs.size();
  if (count == 0) ctx.Fail("expected at least one input");
  const std::vector<int64_t> first = ctx.input(0).shape;
  const int64_t rank = static_cast<int64_t>(first.size());
  if (axis < 0 || axis >= rank) {
    attrs.Fail("axis", "expected 0 <= axis < " + std::to_string(rank) + ", got " + std::to_string(axis));
  }
  std::vector<int64_t> out_shape = first;
  out_shape[axis] = 0;
  std::vector<memory::desc> srcs;
  std::vector<OperandLayout> inputs;
  std::vector<int> args;
  for (size_t k = 0; k < count; ++k) {
    const auto& s = ctx.input(k).shape;
    bool agrees = s.size() == first.size();
    for (int64_t d = 0; agrees && d < rank; ++d) agrees = d == axis || s[d] == first[d];
    if (!agrees) {
      ctx.Fail("input " + std::to_string(k) + " has shape " + ShapeToString(s) + "; expected rank " +
               std::to_string(rank) + " and the dims of " + ShapeToString(first) + " except axis " +
               std::to_string(axis));
    }
    out_shape[axis] += s[axis];
    const memory::desc md = PlainDesc(memory::dims(s.begin(), s.end()));
    srcs.push_back(md);
    inputs.push_back({md, md});
    args.push_back(DNNL_ARG_MULTIPLE_SRC + static_cast<int>(k));
  }
  ctx.ExpectOutputShape(out_shape);
  const memory::desc out = PlainDesc(memory::dims(out_shape.begin(), out_shape.end()));
  dnnl::concat::primitive_desc pd(ctx.engine, out, static_cast<int>(axis), srcs, ctx.MakeAttr());
  return std::make_unique<PrimitiveKernel>(ctx.where(), "concat", std::move(pd), std::move(args),
                                           std::move(inputs), OperandLayout{out, out});
}

/*! \brief The output is the inputs laid end to end along attr `axis` (in-place concat, planner). */
static KernelTraits ConcatTraits() {
  KernelTraits traits;
  traits.joins_inputs_along = [](const NodeInfo& node) -> std::optional<int64_t> {
    auto axis = node.attrs.find("axis");
    if (axis == node.attrs.end()) return std::nullopt;
    return axis->second.as<int64_t>();
  };
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("concat", BuildConcat, ConcatTraits());

}  // namespace byoc_hetero
