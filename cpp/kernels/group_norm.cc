/*!
 * \file kernels/group_norm.cc
 * \brief group_norm: normalization over groups of channels (channels on axis 1, statistics over
 *        the group's channels and every axis after them).
 *
 *   y[n, c, ...] = (x - mean_g) / sqrt(var_g + epsilon) * gamma[c] + beta[c],  g = c / (C / groups)
 *
 * oneDNN 3.2 (the wheel's version) has no group normalization primitive (it arrived in 3.3), so
 * this runs as two oneDNN steps over plain data:
 *   1. layer_normalization_forward without scale/shift over the data read as [N * groups,
 *      C / groups * prod(spatial)] (each row is one group of one sample: the same statistics),
 *      written into the output;
 *   2. with gamma/beta: one binary primitive on the output in place, [N, C, S] * gamma[1, C, 1]
 *      with beta added by a binary post-op (per-channel, which layer norm's scale cannot be).
 * Inputs: data (rank >= 2), gamma (with has_scale), beta (with has_shift), C elements each.
 * Attrs: groups (required, divides C), epsilon (required, finite, >= 0), has_scale / has_shift
 * (default: 2 / 3 inputs).
 */
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

class GroupNormKernel : public Kernel {
 public:
  GroupNormKernel(std::string label, dnnl::layer_normalization_forward::primitive_desc norm,
                  dnnl::binary::primitive_desc affine, bool has_scale, bool has_shift,
                  memory::desc rows, memory::desc full, memory::desc channel, memory::desc data_view)
      : label_(std::move(label)),
        norm_(std::move(norm)),
        affine_(std::move(affine)),
        has_scale_(has_scale),
        has_shift_(has_shift),
        rows_(std::move(rows)),
        full_(std::move(full)) {
    inputs_.push_back({rows_, rows_});
    if (has_scale) inputs_.push_back({channel, channel});
    if (has_shift) inputs_.push_back({channel, channel});
    output_ = {data_view, data_view};
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& /*temps*/) const override {
    std::vector<Step> steps;
    Step norm;
    norm.pd = norm_;
    norm.label = label_ + " normalize";
    norm.op = "group_norm";
    norm.args = {{DNNL_ARG_SRC, inputs[0]}, {DNNL_ARG_DST, MemRef{rows_, output.slot}}};
    steps.push_back(std::move(norm));
    if (has_scale_ || has_shift_) {
      // in place on the output, read as [N, C, S]
      const MemRef full{full_, output.slot};
      Step affine;
      affine.pd = affine_;
      affine.label = label_ + " scale/shift";
      affine.op = "group_norm";
      affine.args = {{DNNL_ARG_SRC_0, full}, {DNNL_ARG_SRC_1, inputs[1]}, {DNNL_ARG_DST, full}};
      if (has_scale_ && has_shift_) {
        affine.args.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, inputs[2]);
      }
      steps.push_back(std::move(affine));
    }
    return steps;
  }

 private:
  std::string label_;
  dnnl::layer_normalization_forward::primitive_desc norm_;
  dnnl::binary::primitive_desc affine_;
  bool has_scale_, has_shift_;
  memory::desc rows_, full_;
};

}  // namespace

static std::unique_ptr<Kernel> BuildGroupNorm(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  if (!attrs.Has("groups")) attrs.Fail("groups", "missing (required)");
  const int64_t groups = attrs.Int("groups", 1);
  const double eps = ReadEpsilon(attrs);
  const size_t n_in = ctx.node().inputs.size();
  const bool has_scale = attrs.Flag("has_scale", n_in >= 2);
  const bool has_shift = attrs.Flag("has_shift", n_in >= 3);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1 + has_scale + has_shift,
                       std::string("data") + (has_scale ? ", gamma" : "") + (has_shift ? ", beta" : ""));
  const auto& shape = ctx.input(0).shape;
  if (shape.size() < 2) ctx.Fail("data must have rank >= 2 (channels on axis 1), got " + ShapeToString(shape));
  ctx.ExpectOutputShape(shape);
  const int64_t n = shape[0], channels = shape[1];
  if (groups < 1 || channels % groups != 0) {
    attrs.Fail("groups", "must be >= 1 and divide the " + std::to_string(channels) + " channels, got " +
                             std::to_string(groups));
  }
  int64_t spatial = 1;
  for (size_t i = 2; i < shape.size(); ++i) spatial *= shape[i];
  for (size_t k = 1; k < n_in; ++k) {
    if (ctx.input(k).numel() != channels) {
      ctx.Fail(std::string(k == 1 && has_scale ? "gamma" : "beta") + " must have " + std::to_string(channels) +
               " elements (one per channel), got shape " + ShapeToString(ctx.input(k).shape));
    }
  }
  const memory::desc rows = PlainDesc({n * groups, channels / groups * spatial});
  dnnl::layer_normalization_forward::primitive_desc norm(ctx.engine, dnnl::prop_kind::forward_inference, rows,
                                                         rows, static_cast<float>(eps),
                                                         dnnl::normalization_flags::none, ctx.MakeAttr());
  // Without spatial dims the data is read as [N, C]: oneDNN 3.2's jit binary applies a [1, C, 1]
  // post-op operand wrongly to a [N, C, 1] destination when N > 1 (measured: group_norm of a
  // [3, 6] tensor was off by up to 1.0 with a shift, exact without), while [1, C] over [N, C] is
  // its plain per-channel broadcast.
  const memory::desc full = spatial == 1 ? PlainDesc({n, channels}) : PlainDesc({n, channels, spatial});
  const memory::desc per_channel = spatial == 1 ? PlainDesc({1, channels}) : PlainDesc({1, channels, 1});
  dnnl::binary::primitive_desc affine;
  if (has_scale || has_shift) {
    dnnl::primitive_attr attr = ctx.MakeAttr();
    if (has_scale && has_shift) {
      dnnl::post_ops ops;
      ops.append_binary(dnnl::algorithm::binary_add, per_channel);
      attr.set_post_ops(ops);
    }
    affine = dnnl::binary::primitive_desc(ctx.engine,
                                          has_scale ? dnnl::algorithm::binary_mul : dnnl::algorithm::binary_add,
                                          full, per_channel, full, attr);
  }
  return std::make_unique<GroupNormKernel>(ctx.where(), std::move(norm), std::move(affine), has_scale, has_shift,
                                           rows, full, per_channel,
                                           PlainDesc(memory::dims(shape.begin(), shape.end())));
}

BYOC_HETERO_REGISTER_KERNEL("group_norm", BuildGroupNorm);

}  // namespace byoc_hetero
