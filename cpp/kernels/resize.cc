/*!
 * \file kernels/resize.cc
 * \brief resize: nearest or linear resampling of the spatial dims (NC + 1 to 3 spatial dims), one
 *        oneDNN resampling_forward.
 *
 * Attrs: algorithm "nearest" | "linear" (required).  The output tensor's shape gives the sizes; the
 * batch and channel dims must equal the input's.  oneDNN maps an output coordinate o of an axis
 * resized from I to O to x = (o + 0.5) * I / O - 0.5 (ONNX's half_pixel) and clamps at the edges;
 * linear interpolates between floor(x) and floor(x) + 1, nearest takes round(x) (halves away from
 * zero).  The codegen writes this node only for Relax resize2d attributes that compute exactly
 * that (ops/resize.py says which; torch's nearest on an integer upscale is one of them).
 */
#include <string>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

static std::unique_ptr<Kernel> BuildResize(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const std::string alg_name = attrs.Choice("algorithm", {"nearest", "linear"}, "");
  attrs.CheckNoUnknown();
  const dnnl::algorithm alg =
      alg_name == "nearest" ? dnnl::algorithm::resampling_nearest : dnnl::algorithm::resampling_linear;
  ctx.ExpectInputCount(1, "data");
  const auto& in = ctx.input(0).shape;
  const auto& out = ctx.output().shape;
  if (in.size() < 3 || in.size() > 5) {
    ctx.Fail("resize needs data [N, C, spatial...] with 1 to 3 spatial dims, got " + ShapeToString(in));
  }
  if (out.size() != in.size() || out[0] != in[0] || out[1] != in[1]) {
    ctx.Fail("output shape " + ShapeToString(out) + " must keep the batch and channels of the input " +
             ShapeToString(in));
  }
  const memory::dims src_dims(in.begin(), in.end()), dst_dims(out.begin(), out.end());
  memory::desc src = ctx.InputLayout(0);
  if (src.get_data_type() != memory::data_type::f32) src = PlainDesc(src_dims);
  dnnl::resampling_forward::primitive_desc pd(ctx.engine, dnnl::prop_kind::forward_inference, alg, src,
                                              AnyDesc(dst_dims), ctx.MakeAttr());
  std::vector<OperandLayout> inputs{{PlainDesc(src_dims), pd.src_desc()}};
  OperandLayout output{PlainDesc(dst_dims), pd.dst_desc()};
  return std::make_unique<PrimitiveKernel>(ctx.where(), "resize", std::move(pd), std::vector<int>{DNNL_ARG_SRC},
                                           std::move(inputs), std::move(output));
}

BYOC_HETERO_REGISTER_KERNEL("resize", BuildResize);

}  // namespace byoc_hetero
