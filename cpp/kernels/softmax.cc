/*!
 * \file kernels/softmax.cc
 * \brief softmax along one axis (one oneDNN softmax_forward, accurate algorithm).
 *
 * Attrs: axis (default -1; negative counts from the end); safe (0/1/2, default 0).  Any rank; runs
 * on plain data.
 *
 * safe=1 is torch's _safe_softmax (what torch.export writes for scaled_dot_product_attention with a
 * mask): a row (the elements along `axis` for fixed other indices) whose inputs are all -inf gives
 * zeros instead of NaN.  oneDNN computes exp(x - max) with max = -inf there, so the row comes out
 * NaN; a host step after the primitive finds those rows in the input and writes them zero.  Every
 * other row is oneDNN's result unchanged (-inf elements of a partly masked row are exactly 0 in it,
 * tests/test_ops_norm.py), so a row with a NaN or +inf input stays NaN as in torch.  The step reads
 * each row only up to its first element that is not -inf: one read per row for attention masks,
 * which mask the end of a row (padding) or its future (causal), never its first key unless the
 * whole row is masked.
 *
 * safe=2 is the ONNX form torch's default (dynamo) exporter writes for the same step,
 * where(isnan(softmax(x)), 0, softmax(x)): every NaN element of oneDNN's result is written 0 (one
 * pass over the output).  For finite inputs with -inf masks the two modes give the same values; with
 * a NaN or +inf input, mode 2 gives 0 wherever the plain softmax gives NaN, as the ONNX graph does.
 */
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief Every NaN of the \p count floats at y written +0 (safe=2). */
HostFn ZeroNans(int64_t count) {
  return [count](const std::vector<void*>& ptrs) {
    float* y = static_cast<float*>(ptrs[1]);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      if (std::isnan(y[i])) y[i] = 0.f;
    }
  };
}

/*! \brief The rows (along the axis) whose inputs are all -inf written +0 (safe=1). */
HostFn ZeroMaskedRows(int64_t outer, int64_t length, int64_t inner) {
  return [outer, length, inner](const std::vector<void*>& ptrs) {
    const float* x = static_cast<const float*>(ptrs[0]);
    float* y = static_cast<float*>(ptrs[1]);
    const float minus_inf = -std::numeric_limits<float>::infinity();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t base = o * length * inner + i;
        int64_t k = 0;
        while (k < length && x[base + k * inner] == minus_inf) ++k;
        if (k < length) continue;  // some input is not -inf: oneDNN's row stands
        for (k = 0; k < length; ++k) y[base + k * inner] = 0.f;
      }
    }
  };
}

/*! \brief softmax, then a host step that writes zeros where the safe mode says (file comment). */
class SafeSoftmaxKernel : public Kernel {
 public:
  SafeSoftmaxKernel(std::string label, dnnl::softmax_forward::primitive_desc pd, memory::desc plain,
                    HostFn fix, std::string fix_label)
      : label_(std::move(label)), pd_(std::move(pd)), fix_(std::move(fix)), fix_label_(std::move(fix_label)) {
    inputs_.push_back({plain, plain});
    output_ = {plain, pd_.dst_desc()};
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& /*temps*/) const override {
    Step softmax;
    softmax.pd = pd_;
    softmax.label = label_;
    softmax.op = "softmax";
    softmax.args = {{DNNL_ARG_SRC, inputs[0]}, {DNNL_ARG_DST, output}};
    Step zero;
    zero.label = label_ + " " + fix_label_;
    zero.op = "softmax";
    zero.args = {{0, inputs[0]}, {1, output}};
    zero.host = fix_;
    std::vector<Step> steps;
    steps.push_back(std::move(softmax));
    steps.push_back(std::move(zero));
    return steps;
  }

 private:
  std::string label_;
  dnnl::softmax_forward::primitive_desc pd_;
  HostFn fix_;
  std::string fix_label_;
};

}  // namespace

static std::unique_ptr<Kernel> BuildSoftmax(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  int64_t axis = attrs.Int("axis", -1);
  const int64_t safe = attrs.Int("safe", 0);
  if (safe < 0 || safe > 2) {
    attrs.Fail("safe", "expected 0 (plain), 1 (rows all -inf -> 0) or 2 (NaN -> 0), got " + std::to_string(safe));
  }
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  const auto& shape = ctx.input(0).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (axis < -rank || axis >= rank) {
    attrs.Fail("axis", "out of range for data of rank " + std::to_string(rank) + ": " + std::to_string(axis));
  }
  if (axis < 0) axis += rank;
  ctx.ExpectOutputShape(shape);
  const memory::desc plain = PlainDesc(memory::dims(shape.begin(), shape.end()));
  // Written f32 even in a bf16 region whose P @ V matmul rounds it anyway: oneDNN 3.2's jit softmax
  // with a bf16 destination is off by up to 2^-7 relative (1-2 bf16 ulps) from the rounded f32
  // result (measured on attention probabilities, tests/test_bf16.py), so the matmul's reorder
  // rounds it instead (to nearest even).  The safe variant's host step relies on it too.
  dnnl::softmax_forward::primitive_desc pd(ctx.engine, dnnl::prop_kind::forward_inference,
                                           dnnl::algorithm::softmax_accurate, plain, plain,
                                           static_cast<int>(axis), ctx.MakeAttr());
  if (safe != 0) {
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
    if (safe == 1) {
      return std::make_unique<SafeSoftmaxKernel>(ctx.where(), std::move(pd), plain,
                                                 ZeroMaskedRows(outer, shape[axis], inner), "rows all -inf -> 0");
    }
    return std::make_unique<SafeSoftmaxKernel>(ctx.where(), std::move(pd), plain,
                                               ZeroNans(outer * shape[axis] * inner), "NaN -> 0");
  }
  const memory::desc dst = pd.dst_desc();
  return std::make_unique<PrimitiveKernel>(ctx.where(), "softmax", std::move(pd),
                                           std::vector<int>{DNNL_ARG_SRC},
                                           std::vector<OperandLayout>{{plain, plain}},
                                           OperandLayout{plain, dst});
}

BYOC_HETERO_REGISTER_KERNEL("softmax", BuildSoftmax);

}  // namespace byoc_hetero
