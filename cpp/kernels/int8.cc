/*!
 * \file kernels/int8.cc
 * \brief int8 conv2d / dense support (see int8.h): attrs, oneDNN attributes, the kernel.
 */
#include "int8.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace byoc_hetero {

memory::data_type DnnlType(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return memory::data_type::u8;
    case DType::kInt8:
      return memory::data_type::s8;
    default:
      return memory::data_type::f32;
  }
}

int64_t ParallelMinimum() {
  // 256K elements, about 50 us of the AVX2 quantize loop on one core: below it a call's OpenMP team
  // costs more than it saves on a loaded machine (session 2, bench/INT8.md); the crossover on a
  // quiet one was not measured (session 3 had no quiet machine)
  return int64_t{1} << 18;
}

memory::desc DenseProducerLayout(const KernelContext& ctx, size_t k) {
  const memory::desc in = ctx.InputLayout(k);
  if (in.get_format_kind() != dnnl::memory::format_kind::blocked || in.get_inner_nblks() != 0 ||
      in.get_padded_dims() != in.get_dims() || in.get_size() != PlainDescOf(ctx.input(k)).get_size()) {
    return memory::desc();
  }
  return in;
}

KernelTraits Int8HostTraits() {
  KernelTraits traits;
  traits.accepts_int8 = true;
  return traits;
}

float CheckedScale(AttrReader& attrs, const char* key, double value) {
  if (!std::isfinite(value) || value <= 0 || static_cast<float>(value) <= 0.f) {
    attrs.Fail(key, "a scale must be finite and > 0, got " + std::to_string(value));
  }
  return static_cast<float>(value);
}

int32_t CheckedZeroPoint(AttrReader& attrs, const char* key, int64_t value, DType dtype) {
  const int64_t lo = dtype == DType::kUInt8 ? 0 : -128, hi = dtype == DType::kUInt8 ? 255 : 127;
  if (value < lo || value > hi) {
    attrs.Fail(key, std::string("zero point ") + std::to_string(value) + " is outside " + DTypeName(dtype) +
                        " [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int32_t>(value);
}

namespace {

/*! \brief The int8 anchor: a host step filling the scale / zero-point buffers, then the primitive. */
class Int8AnchorKernel : public Kernel {
 public:
  Int8AnchorKernel(std::string label, std::string op, dnnl::primitive_desc_base pd, Int8Params q, bool has_bias)
      : label_(std::move(label)), op_(std::move(op)), pd_(std::move(pd)), q_(std::move(q)), has_bias_(has_bias) {
    const auto f32 = memory::data_type::f32, s32 = memory::data_type::s32;
    temps_ = {memory::desc({1}, f32, {1}), memory::desc({static_cast<int64_t>(q_.wei_scales.size())}, f32, {1}),
              memory::desc({1}, f32, {1}), memory::desc({1}, s32, {1}), memory::desc({1}, s32, {1})};
    if (q_.dynamic_src) temps_.push_back(pd_.src_desc(0));  // the source quantized per call (plain u8)
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override {
    Step fill;
    fill.label = label_ + " (int8 scales)";
    fill.op = op_;
    for (size_t k = 0; k < temps.size(); ++k) fill.args.emplace_back(static_cast<int>(k), temps[k]);
    const Int8Params q = q_;
    const int64_t n = q_.dynamic_src ? static_cast<int64_t>(inputs[0].md.get_size() / sizeof(float)) : 0;
    if (q_.dynamic_src) {
      fill.label = label_ + " (dynamic quantize)";
      fill.args.emplace_back(static_cast<int>(temps.size()), inputs[0]);
    }
    fill.host = [q, n](const std::vector<void*>& p) {
      float src_scale = q.src_scale;
      int32_t src_zp = q.src_zp;
      if (q.dynamic_src) {  // p[5]: the u8 source the primitive reads, p[6]: the float32 data
        const float* x = static_cast<const float*>(p[6]);
        const DynamicQParams d = DynamicUInt8Params(x, n);
        QuantizeSpan(x, p[5], n, d.scale, d.zero, DType::kUInt8);
        src_scale = d.scale;
        src_zp = d.zero;
      }
      *static_cast<float*>(p[0]) = src_scale;
      std::memcpy(p[1], q.wei_scales.data(), q.wei_scales.size() * sizeof(float));
      *static_cast<float*>(p[2]) = q.dst_scale;
      *static_cast<int32_t*>(p[3]) = src_zp;
      *static_cast<int32_t*>(p[4]) = q.dst_zp;
    };
    Step run;
    run.pd = pd_;
    run.label = label_;
    run.op = op_;
    run.args = {{DNNL_ARG_SRC, q_.dynamic_src ? temps[5] : inputs[0]}, {DNNL_ARG_WEIGHTS, inputs[1]}, {DNNL_ARG_DST, output},
                {DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, temps[0]}, {DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, temps[1]}};
    if (has_bias_) run.args.emplace_back(DNNL_ARG_BIAS, inputs[2]);
    if (q_.int8_dst) run.args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, temps[2]);
    if (q_.src_zp != 0 || q_.dynamic_src) run.args.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, temps[3]);
    if (q_.int8_dst && q_.dst_zp != 0) run.args.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, temps[4]);
    std::vector<Step> steps;
    steps.push_back(std::move(fill));
    steps.push_back(std::move(run));
    return steps;
  }

  void SetLayouts(std::vector<OperandLayout> inputs, OperandLayout output, int sum_input) {
    inputs_ = std::move(inputs);
    output_ = std::move(output);
    sum_input_ = sum_input;
  }

 private:
  std::string label_;
  std::string op_;
  dnnl::primitive_desc_base pd_;
  Int8Params q_;
  bool has_bias_;
};

}  // namespace

Int8Params ReadInt8Params(const KernelContext& ctx, AttrReader& attrs, int64_t out_channels) {
  Int8Params q;
  const DType data = ctx.input(0).dtype;
  q.dynamic_src = attrs.Flag("src_dynamic", false);
  if (q.dynamic_src && data != DType::kFloat32) {
    attrs.Fail("src_dynamic", std::string("a source quantized per call must be float32, got ") + DTypeName(data));
  }
  if (q.dynamic_src && attrs.Has("src_scale")) attrs.Fail("src_scale", "given with src_dynamic = 1 (computed per call)");
  q.enabled = IsInt8(data) || q.dynamic_src;
  const bool has_attrs = attrs.Has("src_scale") || q.dynamic_src;
  if (!q.enabled) {
    if (has_attrs) attrs.Fail("src_scale", "int8 attrs on a node whose data is " + std::string(DTypeName(data)));
    return q;
  }
  if (!has_attrs) ctx.Fail(std::string("data is ") + DTypeName(data) + " but attrs.src_scale is missing");
  if (ctx.input(1).dtype != DType::kInt8) {
    ctx.Fail(std::string("an int8 anchor needs int8 weights, got ") + DTypeName(ctx.input(1).dtype));
  }
  if (!q.dynamic_src) {
    q.src_scale = CheckedScale(attrs, "src_scale", attrs.Float("src_scale", 1.0));
    q.src_zp = CheckedZeroPoint(attrs, "src_zero_point", attrs.Int("src_zero_point", 0), data);
  }
  // one scale per output channel (the codegen repeats a per-tensor scale)
  const std::vector<double> scales = attrs.Floats("weight_scales", static_cast<size_t>(out_channels), {});
  if (scales.empty()) attrs.Fail("weight_scales", "required: " + std::to_string(out_channels) + " scales");
  for (double s : scales) q.wei_scales.push_back(CheckedScale(attrs, "weight_scales", s));
  const DType out = ctx.output().dtype;
  q.int8_dst = IsInt8(out);
  if (q.int8_dst) {
    q.dst_scale = CheckedScale(attrs, "dst_scale", attrs.Float("dst_scale", 0.0));
    q.dst_zp = CheckedZeroPoint(attrs, "dst_zero_point", attrs.Int("dst_zero_point", 0), out);
  } else if (out != DType::kFloat32) {
    ctx.Fail(std::string("the output must be uint8, int8 or float32, got ") + DTypeName(out));
  }
  if (attrs.Has("saturate_range")) {
    const std::vector<double> range = attrs.Floats("saturate_range", 2, {});
    if (!(range[0] < range[1])) attrs.Fail("saturate_range", "needs lo < hi");
    q.saturate = true;
    q.saturate_lo = static_cast<float>(range[0]);
    q.saturate_hi = static_cast<float>(range[1]);
  }
  if (attrs.Has("sum_scale")) {
    if (!q.int8_dst) attrs.Fail("sum_scale", "an int8 residual sum needs an 8-bit output");
    q.residual = true;
    q.sum_scale = CheckedScale(attrs, "sum_scale", attrs.Float("sum_scale", 1.0));
    q.sum_zp = CheckedZeroPoint(attrs, "sum_zero_point", attrs.Int("sum_zero_point", 0), out);
  }
  return q;
}

dnnl::primitive_attr MakeInt8Attr(const KernelContext& ctx, const Epilogue& e, const Int8Params& q, int wei_mask) {
  Epilogue without_sum = e;
  without_sum.residual = false;
  without_sum.post_act = Activation{};
  if (q.saturate) without_sum.act = Activation{};  // appended after the clamp below
  dnnl::primitive_attr made = ctx.MakeAttr(without_sum);
  dnnl::primitive_attr* attr = &made;
  if (e.residual || q.saturate) {
    dnnl::post_ops ops = made.get_post_ops();
    if (q.saturate) {
      ops.append_eltwise(dnnl::algorithm::eltwise_clip, q.saturate_lo, q.saturate_hi);
      if (!e.act.none()) ops.append_eltwise(e.act.alg, e.act.alpha, e.act.beta);
    }
    if (e.residual) ops.append_sum(q.sum_scale, q.sum_zp, DnnlType(ctx.output().dtype));
    if (e.residual && !e.post_act.none()) ops.append_eltwise(e.post_act.alg, e.post_act.alpha, e.post_act.beta);
    made.set_post_ops(ops);
  }
  attr->set_scales_mask(DNNL_ARG_SRC, 0);
  attr->set_scales_mask(DNNL_ARG_WEIGHTS, wei_mask);
  if (q.int8_dst) attr->set_scales_mask(DNNL_ARG_DST, 0);
  if (q.src_zp != 0 || q.dynamic_src) attr->set_zero_points_mask(DNNL_ARG_SRC, 0);  // dynamic: known per call
  if (q.int8_dst && q.dst_zp != 0) attr->set_zero_points_mask(DNNL_ARG_DST, 0);
  return made;
}

std::unique_ptr<Kernel> MakeInt8AnchorKernel(const KernelContext& ctx, const char* op, dnnl::primitive_desc_base pd,
                                             const memory::desc& src_view, const memory::desc& wei_view,
                                             const memory::desc& bias_view, const memory::desc& dst_view,
                                             const Int8Params& q) {
  const bool has_bias = !bias_view.is_zero();
  // a dynamic source is read as the float32 it is; the host step writes the u8 copy the primitive reads
  const memory::desc f32_src = WithType(src_view, memory::data_type::f32);
  std::vector<OperandLayout> inputs{q.dynamic_src ? OperandLayout{f32_src, f32_src} : OperandLayout{src_view, pd.src_desc(0)},
                                    {wei_view, pd.weights_desc(0)}};
  if (has_bias) inputs.push_back({bias_view, pd.weights_desc(1)});
  OperandLayout output{dst_view, pd.dst_desc(0)};
  if (q.residual) {
    if (ctx.input(inputs.size()).dtype != ctx.output().dtype) {
      ctx.Fail(std::string("the residual must have the output's dtype ") + DTypeName(ctx.output().dtype));
    }
    inputs.push_back(output);  // accumulated in place: the planner puts it in the destination
  }
  auto kernel = std::make_unique<Int8AnchorKernel>(ctx.where(), op, pd, q, has_bias);
  kernel->SetLayouts(std::move(inputs), std::move(output), q.residual ? static_cast<int>(2 + has_bias) : -1);
  return kernel;
}

}  // namespace byoc_hetero
