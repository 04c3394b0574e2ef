/*!
 * \file kernels/softmax.cc
 * \brief softmax along one axis (one oneDNN softmax_forward, accurate algorithm, then a host step
 *        that gives the rows holding NaN / +inf / only -inf the values IEEE arithmetic gives them).
 *
 * Attrs: axis (default -1; negative counts from the end); safe (0/1/2, default 0).  Any rank; runs
 * on plain data.
 *
 * Special values, as torch and TVM's llvm softmax (max, exp(x - max), sum, divide) have them: a row
 * (the elements along `axis` for fixed other indices) holding a NaN or a +inf is all NaN (exp(inf -
 * inf) and every term after a NaN are NaN); a row whose inputs are all -inf is NaN too (exp(-inf -
 * -inf)), except with safe=1, torch's _safe_softmax (what torch.export writes for
 * scaled_dot_product_attention with a mask), which writes such a row 0.  oneDNN 3.2 does not: its
 * jit max ignores a NaN (vmaxps keeps the other operand), so `[nan, 1, 2]` came out `[nan, 0, 0]` and
 * `[-inf, nan, 1]` `[0, nan, 0]` (issue 27) -- a NaN turned into confident probabilities.  The host
 * step after the primitive reads each row of the input once and rewrites only those rows; every
 * other row is oneDNN's result unchanged (-inf elements of a partly masked row are exactly 0 in it,
 * tests/test_ops_norm.py).
 *
 * safe=2 is the ONNX form torch's default (dynamo) exporter writes for the same step,
 * where(isnan(softmax(x)), 0, softmax(x)): every row the IEEE softmax makes NaN (a NaN or +inf in
 * it, or all -inf) is written 0, as the ONNX graph does; other rows are oneDNN's.
 */
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

/*!
 * \brief What a row of the input makes of the output: oneDNN's row (0), all NaN (1: a NaN or +inf
 *        in it, or all -inf without `safe`), all 0 (2: all -inf with `safe`).
 */
inline int SpecialRow(const float* x, int64_t length, int64_t stride, int safe) {
  const float inf = std::numeric_limits<float>::infinity();
  bool nan_or_inf = false, all_minus_inf = true;
  for (int64_t k = 0; k < length; ++k) {
    const float v = x[k * stride];
    nan_or_inf |= !(v < inf);  // true for NaN and +inf
    all_minus_inf &= v == -inf;
  }
  if (nan_or_inf) return 1;
  if (all_minus_inf) return safe ? 2 : 1;
  return 0;
}

/*!
 * \brief SpecialRow for a contiguous row, in integer operations only, which the compiler
 *        vectorizes: counts of the non-finite elements (exponent bits all ones) and of the -inf
 *        ones; a NaN or +inf is there exactly when the first count is larger.  A causal mask
 *        written with -inf (torch's sdpa decomposition: where(mask, 0, -inf)) makes the
 *        AnyNonFinite pass below true for every input, so every row is classified on every call:
 *        SpecialRow's per-element float loop cost 0.5 ms per [9, 128, 128] softmax, 15.8 of the
 *        ~480 ms of the SmolLM-135M decoder's from_torch call at 1 thread, on this step's one
 *        thread at any team size -- the whole gap to its from_onnx build, whose exporter writes
 *        the mask with float32's lowest finite value (per-step profile, bench/LLM.md session 4).
 */
inline int SpecialContiguousRow(const float* x, int64_t length, int safe) {
  uint32_t nonfinite = 0, minus_inf = 0;
  for (int64_t k = 0; k < length; ++k) {
    uint32_t bits;
    std::memcpy(&bits, x + k, sizeof bits);
    nonfinite += (bits & 0x7f800000u) == 0x7f800000u;
    minus_inf += bits == 0xff800000u;
  }
  if (nonfinite != minus_inf) return 1;  // a NaN or +inf
  if (static_cast<int64_t>(minus_inf) == length) return safe ? 2 : 1;
  return 0;
}

/*!
 * \brief Whether any of n contiguous floats is NaN or +-inf (exponent bits all ones), in integer
 *        operations only, which the compiler vectorizes: (bits & exponent) + one exponent step
 *        carries into the sign bit exactly for an all-ones exponent.  The row scan below reads
 *        floats with a compare per element and was 1.25 ns an element unvectorized: 7 ms of a
 *        ViT-B/16 call (12 softmaxes of 12x197x197), 6% of it (bench/AB.md).  Rows are scanned only
 *        when this finds a special value.
 */
inline bool AnyNonFinite(const float* x, int64_t n) {
  uint32_t acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    acc |= (bits & 0x7f800000u) + 0x00800000u;
  }
  return (acc & 0x80000000u) != 0;
}

/*! \brief softmax, then the rows with special inputs rewritten (see the file comment). */
class SoftmaxKernel : public Kernel {
 public:
  SoftmaxKernel(std::string label, dnnl::softmax_forward::primitive_desc pd, memory::desc plain, int safe,
                int64_t outer, int64_t length, int64_t inner)
      : label_(std::move(label)), pd_(std::move(pd)), safe_(safe), outer_(outer), length_(length), inner_(inner) {
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
    Step special;
    special.label = label_ + (safe_ == 2 ? " rows with NaN/inf or all -inf -> 0"
                              : safe_ ? " rows with NaN/+inf -> NaN, all -inf -> 0" : " rows with NaN/inf -> NaN");
    special.op = "softmax";
    special.args = {{0, inputs[0]}, {1, output}};
    const int64_t outer = outer_, length = length_, inner = inner_;
    const int safe = safe_;
    special.host = [outer, length, inner, safe](const std::vector<void*>& ptrs) {
      const float* x = static_cast<const float*>(ptrs[0]);
      float* y = static_cast<float*>(ptrs[1]);
      // by kind (SpecialRow): finite row (unused), NaN row, all -inf row; safe=2 zeroes every NaN
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const float fill[3] = {0.f, safe == 2 ? 0.f : nan, safe != 0 ? 0.f : nan};
      if (!AnyNonFinite(x, outer * length * inner)) return;  // no special value: oneDNN's rows stand
      // One thread: the scan is one read of the input, memory-bound and short next to the primitive;
      // an OpenMP team (and its barrier) cost as much as the whole softmax on a contended machine.
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t base = o * length * inner + i;
          const int kind = inner == 1 && length < (int64_t{1} << 32) ? SpecialContiguousRow(x + base, length, safe)
                                      : SpecialRow(x + base, length, inner, safe);
          if (kind == 0) continue;  // finite or partly -inf: oneDNN's row stands
          for (int64_t k = 0; k < length; ++k) y[base + k * inner] = fill[kind];
        }
      }
    };
    std::vector<Step> steps;
    steps.push_back(std::move(softmax));
    steps.push_back(std::move(special));
    return steps;
  }

 private:
  std::string label_;
  dnnl::softmax_forward::primitive_desc pd_;
  int safe_;
  int64_t outer_, length_, inner_;
};

}  // namespace

static std::unique_ptr<Kernel> BuildSoftmax(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  int64_t axis = attrs.Int("axis", -1);
  const int64_t safe_mode = attrs.Int("safe", 0);
  if (safe_mode < 0 || safe_mode > 2) {
    attrs.Fail("safe", "expected 0 (plain), 1 (rows all -inf -> 0) or 2 (NaN -> 0), got " + std::to_string(safe_mode));
  }
  const int safe = static_cast<int>(safe_mode);
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
  // rounds it instead (to nearest even).  The host step after it relies on it too (it reads f32 rows).
  dnnl::softmax_forward::primitive_desc pd(ctx.engine, dnnl::prop_kind::forward_inference,
                                           dnnl::algorithm::softmax_accurate, plain, plain,
                                           static_cast<int>(axis), ctx.MakeAttr());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
  return std::make_unique<SoftmaxKernel>(ctx.where(), std::move(pd), plain, safe, outer, shape[axis], inner);
}

BYOC_HETERO_REGISTER_KERNEL("softmax", BuildSoftmax);

}  // namespace byoc_hetero
