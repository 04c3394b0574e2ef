/*!
 * \file kernels/broadcast_to.cc
 * \brief broadcast_to: data (float32) -> the output shape, numpy broadcasting (the data's dims of
 *        size 1 repeated; leading dims added).  No attrs: the target is the output tensor's shape.
 *
 * Why a step of its own: a broadcast that repeats elements is how transformers write grouped-query
 * attention's repeat_kv (K and V of [B, kv, 1, S, D] broadcast to [B, kv, groups, S, D], then
 * reshaped to the query heads).  Left on llvm it cut every attention out of its region (a Llama
 * layer: two regions and two round trips of K and V through plain buffers per layer).  One copy per
 * call, rows of the last dim (contiguous blocks memcpy'd), in the planner's arena: the K/V copies of
 * a layer are S x D x heads floats, small next to the attention matmuls that read them.
 */
#include <utility>

#include "broadcast.h"
#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildBroadcastTo(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  if (ctx.input(0).dtype != DType::kFloat32) {
    ctx.Fail(std::string("data must be float32, got ") + DTypeName(ctx.input(0).dtype));
  }
  if (ctx.output().dtype != DType::kFloat32) ctx.Fail("the output must be float32");
  const std::vector<int64_t>& in = ctx.input(0).shape;
  const std::vector<int64_t>& out = ctx.output().shape;
  const std::optional<std::vector<int64_t>> joint = BroadcastShape({in, out});
  if (out.empty() || in.size() > out.size() || !joint.has_value() || *joint != out) {
    ctx.Fail("data of shape " + ShapeToString(in) + " does not broadcast to the output shape " + ShapeToString(out));
  }
  return std::make_unique<HostKernel>(ctx.where(), "broadcast_to", ExpandFn(in, out),
                                      std::vector<memory::desc>{PlainDescOf(ctx.input(0))},
                                      PlainDescOf(ctx.output()));
}

BYOC_HETERO_REGISTER_KERNEL("broadcast_to", BuildBroadcastTo);

}  // namespace byoc_hetero
