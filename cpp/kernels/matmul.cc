/*!
 * \file kernels/matmul.cc
 * \brief matmul: batched A @ B with numpy-style broadcasting of the batch dims (one oneDNN matmul).
 *
 * Inputs: a [..., M, K], b [..., K, N] (or [..., N, K] with transpose_b = 1), [bias] (N elements),
 * [residual] (the output's shape).  Both a and b may be run-time values (attention-style
 * products) or constants.  Batch dims broadcast as in numpy: ranks are aligned by prepending 1s,
 * and a dim of 1 repeats.  Attrs: transpose_b 0/1 (default 0), has_bias, and the epilogue as for
 * conv2d.  The output is [broadcast batch..., M, N].
 *
 * Strided operands (attention's Q, K, V read through permute_dims without a copy): with
 * a_shape + a_strides (likewise b_shape + b_strides; the output's rank, leading 1s as needed) the
 * operand is the input tensor's row-major bytes read as a_shape with those element strides (a permutation of a dense layout, covering
 * the tensor exactly); transpose_b then swaps b's last two dims of that view.  oneDNN 3.2's
 * matmul takes arbitrary src/weights strides; where only its reference implementation would run
 * on them, the operand is reordered to plain first instead (one reorder beats a ref matmul).
 * Or, with a_axes (likewise b_axes), the operand is permute_dims(input, a_axes), leading 1s to the
 * output's rank, with the strides computed from the input's shape when the plan is made: what
 * the codegen writes in a symbolic region, whose strides are known only once the dims are bound.
 * The output is plain, or in the planner's hint (KernelContext::output_hint) where a jit matmul
 * writes that: the layout under which a permute, alone reading the product (or alone reading a
 * reshape that alone reads it), is a plain view.  A hint of more dims than the output (its batch
 * dims split, as torchvision Swin's [windows * heads, N, d] reshaped [windows, heads, N, d]) is
 * written by the same matmul over a, b and the output with their batch dims split likewise.
 * Attr scale (default 1): the product is multiplied by it before the epilogue (eltwise_linear
 * post-op), e.g. attention's 1/sqrt(d).
 * Attr has_mask (default 0): an input after the bias, of any shape that broadcasts to the output
 * (ranks aligned by leading 1s), is added after the scale and before the activation (a binary_add
 * post-op reading it with broadcasting), e.g. attention's additive mask [1, 1, S, S] over
 * [1, heads, S, S] scores: the scores are written once instead of three times.
 * Where the primitive with the whole epilogue is only oneDNN's reference matmul but the one with the scale
 * (and, without a mask, the activation) alone is not, the rest runs as its own step, a jit binary add of the
 * mask or the residual with the remaining post-ops (MatmulWithSplitEpilogue): under AVX2 (Zen 3, older
 * Intel) the jit sgemm takes a sum post-op only first, and the scale then a full mask ran "ref:any".
 * BYOC_HETERO_MATMUL_SPLIT_EPILOGUE=off keeps the reference primitive.
 * int8 operands (ops/int8_matmul.py: a QDQ transformer's Q.K^T and P.V): a and b uint8 / int8
 * with attrs a_scale, a_zero_point, b_scale, b_zero_point (per tensor), float32 output =
 * a_scale * b_scale * (a - a_zp) @ (b - b_zp) then the scale post-op; no bias, mask or residual.
 * oneDNN 3.2's x86 int8 matmul takes s8 weights only (u8 x u8 has no implementation), so a uint8
 * b is read as int8 b - 128 (its bytes XOR 0x80, one host pass into a temp) with zero point
 * b_zp - 128: the same differences b - b_zp.  The brgemm AMX matmul takes the strided views and
 * both zero points (Q.K^T 12 x [197, 64] x [64, 197] at 1 thread: 136-179 us against 409 us in
 * float32, bench/INT8.md, session 4).
 */
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "broadcast.h"
#include "env_switch.h"
#include "int8.h"
#include "kernel.h"
#include "reshape.h"

namespace byoc_hetero {

namespace {

/*! \brief How one operand is read: its logical shape and element strides over the input's bytes. */
struct OperandView {
  std::vector<int64_t> shape;
  memory::dims strides;
  bool strided = false;  // not the input's own row-major layout
};

OperandView ReadOperandView(const KernelContext& ctx, AttrReader& attrs, size_t k, const char* shape_key,
                            const char* strides_key, const char* axes_key) {
  OperandView v;
  if (attrs.Has(axes_key)) {
    // permute_dims(input k, axes) read through strides, computed here from the (bound) input
    // shape: in a symbolic region the codegen has no static strides to write.
    if (attrs.Has(shape_key) || attrs.Has(strides_key)) {
      attrs.Fail(axes_key, std::string("is given with ") + shape_key + " / " + strides_key + "; one view only");
    }
    const std::vector<int64_t>& in = ctx.input(k).shape;
    const std::vector<int64_t> axes = attrs.Ints(axes_key, in.size(), {});
    std::vector<bool> seen(in.size(), false);
    for (int64_t a : axes) {
      if (a < 0 || a >= static_cast<int64_t>(in.size()) || seen[a]) {
        attrs.Fail(axes_key, "axes " + ShapeToString(axes) + " are not a permutation of " +
                                 std::to_string(in.size()) + " axes (input " + std::to_string(k) + " " +
                                 ShapeToString(in) + ")");
      }
      seen[a] = true;
    }
    const size_t rank = ctx.output().shape.size();
    if (in.size() > rank) {
      attrs.Fail(axes_key, "input " + std::to_string(k) + " " + ShapeToString(in) + " has a higher rank than the output");
    }
    const memory::dims plain = PlainDesc(memory::dims(in.begin(), in.end())).get_strides();
    v.shape.assign(rank - in.size(), 1);
    v.strides.assign(rank - in.size(), 1);
    for (int64_t a : axes) {
      v.shape.push_back(in[a]);
      v.strides.push_back(in[a] == 1 ? 1 : plain[a]);
    }
    v.strided = true;
    return v;
  }
  if (!attrs.Has(shape_key) && !attrs.Has(strides_key)) {
    v.shape = ctx.input(k).shape;
    v.strides = PlainDesc(memory::dims(v.shape.begin(), v.shape.end())).get_strides();
    return v;
  }
  v.shape = attrs.Ints(shape_key, ctx.output().shape.size(), {});
  const std::vector<int64_t> strides = attrs.Ints(strides_key, v.shape.size(), {});
  v.strides.assign(strides.begin(), strides.end());
  v.strided = true;
  int64_t numel = 1;
  for (int64_t d : v.shape) numel *= d;
  if (v.shape.empty() || numel != ctx.input(k).numel()) {
    attrs.Fail(shape_key, "view " + ShapeToString(v.shape) + " must have the " +
                              std::to_string(ctx.input(k).numel()) + " elements of input " + std::to_string(k) +
                              " " + ShapeToString(ctx.input(k).shape));
  }
  // A permutation of a dense layout: the dims (of extent > 1) ordered by stride, each stride the
  // product of the faster dims' extents.  Anything else would read outside or twice.
  std::vector<size_t> order;
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] > 1) order.push_back(d);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v.strides[a] < v.strides[b]; });
  int64_t expect = 1;
  for (size_t d : order) {
    if (v.strides[d] != expect) {
      attrs.Fail(strides_key, "strides " + ShapeToString(strides) + " over " + ShapeToString(v.shape) +
                                  " are not a permutation of a dense row-major layout");
    }
    expect *= v.shape[d];
  }
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.shape[d] == 1) v.strides[d] = 1;  // any stride reads the one element; keep it tidy
  }
  return v;
}

bool IsReferenceImpl(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

/*! \brief Per-tensor quantization of the int8 operands (the file comment). */
struct Int8MatmulParams {
  float a_scale = 1.f, b_scale = 1.f;
  int32_t a_zp = 0, b_zp = 0;  // b_zp: of the int8 values the primitive reads (shifted for uint8 b)
  bool shift_b = false;        // b is uint8: read as int8 b - 128
};

Int8MatmulParams ReadInt8MatmulParams(const KernelContext& ctx, AttrReader& attrs) {
  const DType a = ctx.input(0).dtype, b = ctx.input(1).dtype;
  if (!IsInt8(a) || !IsInt8(b)) {
    ctx.Fail(std::string("an int8 matmul needs 8-bit a and b, got ") + DTypeName(a) + " and " + DTypeName(b));
  }
  Int8MatmulParams q;
  q.a_scale = CheckedScale(attrs, "a_scale", attrs.Float("a_scale", 0.0));
  q.b_scale = CheckedScale(attrs, "b_scale", attrs.Float("b_scale", 0.0));
  q.a_zp = CheckedZeroPoint(attrs, "a_zero_point", attrs.Int("a_zero_point", 0), a);
  q.b_zp = CheckedZeroPoint(attrs, "b_zero_point", attrs.Int("b_zero_point", 0), b);
  q.shift_b = b == DType::kUInt8;
  if (q.shift_b) q.b_zp -= 128;
  return q;
}

/*! \brief A host step filling the scale / zero-point buffers (and int8 b from uint8 b), then the matmul. */
class Int8MatmulKernel : public Kernel {
 public:
  Int8MatmulKernel(std::string label, dnnl::matmul::primitive_desc pd, Int8MatmulParams q,
                   std::vector<OperandLayout> inputs, OperandLayout output)
      : label_(std::move(label)), pd_(std::move(pd)), q_(q) {
    const auto f32 = memory::data_type::f32, s32 = memory::data_type::s32;
    temps_ = {memory::desc({1}, f32, {1}), memory::desc({1}, f32, {1}), memory::desc({1}, s32, {1}),
              memory::desc({1}, s32, {1})};
    if (q_.shift_b) temps_.push_back(pd_.weights_desc());  // b - 128, in b's own strides
    inputs_ = std::move(inputs);
    output_ = std::move(output);
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override {
    Step fill;
    fill.label = label_ + (q_.shift_b ? " (int8 scales, b - 128)" : " (int8 scales)");
    fill.op = "matmul";
    for (size_t k = 0; k < temps.size(); ++k) fill.args.emplace_back(static_cast<int>(k), temps[k]);
    if (q_.shift_b) fill.args.emplace_back(static_cast<int>(temps.size()), inputs[1]);
    const Int8MatmulParams q = q_;
    const int64_t bytes = q_.shift_b ? static_cast<int64_t>(inputs[1].md.get_size()) : 0;
    fill.host = [q, bytes](const std::vector<void*>& p) {
      *static_cast<float*>(p[0]) = q.a_scale;
      *static_cast<float*>(p[1]) = q.b_scale;
      *static_cast<int32_t*>(p[2]) = q.a_zp;
      *static_cast<int32_t*>(p[3]) = q.b_zp;
      if (!q.shift_b) return;
      const uint8_t* b = static_cast<const uint8_t*>(p[5]);
      uint8_t* out = static_cast<uint8_t*>(p[4]);
      // u8 v -> s8 v - 128: flip each byte's top bit, 8 bytes a step (the byte loop is not
      // vectorized at -O2 and cost as much as the matmul in the BERT-base profile, bench/INT8.md)
      constexpr uint64_t kTopBits = 0x8080808080808080ull;
      int64_t i = 0;
      for (; i + 8 <= bytes; i += 8) {
        uint64_t word;
        std::memcpy(&word, b + i, 8);
        word ^= kTopBits;
        std::memcpy(out + i, &word, 8);
      }
      for (; i < bytes; ++i) out[i] = b[i] ^ 0x80;
    };
    Step run;
    run.pd = pd_;
    run.label = label_;
    run.op = "matmul";
    run.args = {{DNNL_ARG_SRC, inputs[0]}, {DNNL_ARG_WEIGHTS, q_.shift_b ? temps[4] : inputs[1]},
                {DNNL_ARG_DST, output}, {DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, temps[0]},
                {DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, temps[1]}};
    if (q_.a_zp != 0) run.args.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, temps[2]);
    if (q_.b_zp != 0) run.args.emplace_back(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_WEIGHTS, temps[3]);
    std::vector<Step> steps;
    steps.push_back(std::move(fill));
    steps.push_back(std::move(run));
    return steps;
  }

 private:
  std::string label_;
  dnnl::matmul::primitive_desc pd_;
  Int8MatmulParams q_;
};

/*! \brief The int8 matmul of a and b read through \p a_md / \p b_view (f32-typed views). */
std::unique_ptr<Kernel> MakeInt8Matmul(const KernelContext& ctx, const Int8MatmulParams& q, const memory::desc& a_md,
                                       const memory::desc& b_view, const memory::dims& dst_dims,
                                       const Epilogue& epilogue) {
  const memory::desc a_src = WithType(a_md, DnnlType(ctx.input(0).dtype));
  const memory::desc b_in = WithType(b_view, DnnlType(ctx.input(1).dtype));
  const memory::desc b_s8 = WithType(b_view, memory::data_type::s8);
  dnnl::primitive_attr attr = ctx.MakeAttr(epilogue);
  attr.set_scales_mask(DNNL_ARG_SRC, 0);
  attr.set_scales_mask(DNNL_ARG_WEIGHTS, 0);
  if (q.a_zp != 0) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
  if (q.b_zp != 0) attr.set_zero_points_mask(DNNL_ARG_WEIGHTS, 0);
  dnnl::matmul::primitive_desc pd(ctx.engine, a_src, b_s8, memory::desc(), PlainDesc(dst_dims), attr);
  // b is read where it lies (shifted into a temp of its strides, or as the s8 weights directly)
  std::vector<OperandLayout> inputs{{a_src, pd.src_desc()}, {b_in, q.shift_b ? b_in : pd.weights_desc()}};
  OperandLayout output{PlainDesc(dst_dims), pd.dst_desc()};
  return std::make_unique<Int8MatmulKernel>(ctx.where(), std::move(pd), q, std::move(inputs), std::move(output));
}

/*! \brief The aligned shapes of a matmul's operands (leading 1s up to the output's rank) and its output. */
struct MatmulShapes {
  size_t rank;
  std::vector<int64_t> as, bs, out_shape;
  int64_t n;
};

/*! \brief a @ b's shapes checked (ranks, K, broadcastable batch dims) against each other and the output. */
MatmulShapes CheckMatmulShapes(const KernelContext& ctx, const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                               bool transpose_b) {
  if (a.size() < 2 || b.size() < 2) {
    ctx.Fail("a and b must have rank >= 2, got shapes " + ShapeToString(a) + " and " +
             ShapeToString(b));
  }
  // The output may declare more leading 1s than either operand (the codegen writes attention
  // scores [H, S, S] as [1, H, S, S] so that the mask post-op runs outside the reference matmul).
  const size_t rank = std::max({a.size(), b.size(), ctx.output().shape.size()});
  if (rank > 12) ctx.Fail("rank " + std::to_string(rank) + " exceeds the 12 dims oneDNN supports");
  const std::vector<int64_t> as = AlignRank(a, rank), bs = AlignRank(b, rank);
  const int64_t m = as[rank - 2], k = as[rank - 1];
  const int64_t bk = transpose_b ? bs[rank - 1] : bs[rank - 2];
  const int64_t n = transpose_b ? bs[rank - 2] : bs[rank - 1];
  if (bk != k) {
    ctx.Fail("a shape " + ShapeToString(a) + " has K=" + std::to_string(k) + " but b shape " +
             ShapeToString(b) + (transpose_b ? " (transposed)" : "") + " has K=" + std::to_string(bk));
  }
  std::vector<int64_t> out_shape(rank);
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (as[i] != bs[i] && as[i] != 1 && bs[i] != 1) {
      ctx.Fail("batch dims of " + ShapeToString(a) + " and " + ShapeToString(b) +
               " do not broadcast (dim " + std::to_string(i) + ")");
    }
    out_shape[i] = std::max(as[i], bs[i]);
  }
  out_shape[rank - 2] = m;
  out_shape[rank - 1] = n;
  ctx.ExpectOutputShape(out_shape);
  return {rank, as, bs, out_shape, n};
}

/*! \brief The mask's dims aligned to the output's rank, checked to broadcast to the output. */
memory::dims MaskDims(const KernelContext& ctx, size_t mask_index, const std::vector<int64_t>& out_shape) {
  const size_t rank = out_shape.size();
  memory::dims mask_dims;
  const std::vector<int64_t>& ms = ctx.input(mask_index).shape;
  bool ok = ms.size() <= rank;
  mask_dims.assign(rank, 1);
  for (size_t i = 0; ok && i < ms.size(); ++i) {
    const size_t d = rank - ms.size() + i;
    ok = ms[i] == out_shape[d] || ms[i] == 1;
    mask_dims[d] = ms[i];
  }
  if (!ok) {
    ctx.Fail("mask of shape " + ShapeToString(ms) + " does not broadcast to the output shape " +
             ShapeToString(out_shape));
  }
  return mask_dims;
}

/*! \brief The element strides of an operand read through \p view (its leading aligned dims stride 1),
 *         or the row-major strides of \p dims when it is read as stored. */
memory::dims ViewStrides(const OperandView& view, const memory::dims& dims) {
  if (!view.strided) return PlainDesc(dims).get_strides();
  memory::dims strides(dims.size() - view.shape.size(), 1);
  strides.insert(strides.end(), view.strides.begin(), view.strides.end());
  return strides;
}

/*! \brief Post-ops in the order the region format states: scale, mask add, activation, sum,
 *         post-activation (MakeAttr's order, with the mask's binary add after the scale);
 *         \p mask_post_op gets the index of the mask's add. */
dnnl::primitive_attr MaskedMatmulAttr(const KernelContext& ctx, const Epilogue& epilogue, const memory::dims& mask_dims,
                                      int* mask_post_op) {
  dnnl::primitive_attr attr = ctx.MakeAttr();
  dnnl::post_ops ops;
  if (epilogue.scale != 1.f) ops.append_eltwise(dnnl::algorithm::eltwise_linear, epilogue.scale, 0.f);
  *mask_post_op = ops.len();
  ops.append_binary(dnnl::algorithm::binary_add, PlainDesc(mask_dims));
  if (!epilogue.act.none()) ops.append_eltwise(epilogue.act.alg, epilogue.act.alpha, epilogue.act.beta);
  if (epilogue.residual) ops.append_sum(1.f);
  if (!epilogue.post_act.none()) ops.append_eltwise(epilogue.post_act.alg, epilogue.post_act.alpha, epilogue.post_act.beta);
  attr.set_post_ops(ops);
  return attr;
}

/*! \brief A float matmul's a and b as read: a's plain dims and descriptor, b's view over its bytes. */
struct MatmulOperands {
  memory::desc a_md;
  memory::dims a_dims;
  bool a_strided;
  memory::desc b_view;
  memory::dims b_dims;
  bool b_strided;
  bool b_constant;
};

/*! \brief BYOC_HETERO_MATMUL_PLAIN_A (read when a region is planned): "on" (or unset) reads a strided a
 *         against a constant b through a plain copy where that turns oneDNN's jit sgemm into its brgemm
 *         matmul; "off" reads a where it lies.  On by default since the quiet A/B of session 16
 *         (DeBERTa-v3-base, 2 threads: 1.028x, faster in 6 of 6 rounds; bench/ZOO.md). */
bool PlainABrgemmOn() { return EnvSwitch("BYOC_HETERO_MATMUL_PLAIN_A", "on", "off", true); }

/*!
 * \brief The float matmul primitive. A constant b is reordered once into the layout matmul prefers;
 *        one that arrives at run time is read where it lies.
 *        bf16: a and b are read as bf16 copies (a constant b converted once, run-time operands on every
 *        call, a strided view through one reorder), accumulation and the output stay f32.
 *        A strided bf16 a (Q of attention, a permuted dense output stored bf16) is read where it lies
 *        when a jit matmul takes those strides, else through a plain bf16 copy.  \p dst: the output's layout.
 */
dnnl::matmul::primitive_desc MatmulPdWithDst(const KernelContext& ctx, const MatmulOperands& o,
                                             const memory::desc& bias, const memory::desc& dst,
                                             const dnnl::primitive_attr& attr) {
  memory::desc a_src = ctx.bf16 ? WithType(o.a_md, memory::data_type::bf16) : o.a_md;
  auto make = [&](const memory::desc& b) { return dnnl::matmul::primitive_desc(ctx.engine, a_src, b, bias, dst, attr); };
  auto make_bf16 = [&] {
    return make(o.b_constant ? AnyDesc(o.b_dims, memory::data_type::bf16) : WithType(o.b_view, memory::data_type::bf16));
  };
  dnnl::matmul::primitive_desc pd =
      ctx.bf16 ? make_bf16() : o.b_constant ? MatmulForConstantWeight(make, o.b_dims) : make(o.b_view);
  if (ctx.bf16 && o.a_strided && IsReferenceImpl(pd)) {
    a_src = WithType(PlainDesc(o.a_dims), memory::data_type::bf16);
    pd = make_bf16();
  }
  if (!ctx.bf16 && o.a_strided && o.b_constant && PlainABrgemmOn() &&
      std::string(pd.impl_info_str()).rfind("gemm:", 0) == 0) {
    // BYOC_HETERO_MATMUL_PLAIN_A (default on): oneDNN's brgemm matmul reads only a plain a, so a strided a
    // (DeBERTa's Q / K against the constant position keys, a permuted dense output) ran on the jit sgemm;
    // read a plain copy (the planner's reorder) where that gets a brgemm.
    const memory::desc strided_a = a_src;
    a_src = PlainDesc(o.a_dims);
    dnnl::matmul::primitive_desc plain = MatmulForConstantWeight(make, o.b_dims);
    if (std::string(plain.impl_info_str()).rfind("brg", 0) == 0) return plain;
    a_src = strided_a;
  }
  if (!ctx.bf16 && IsReferenceImpl(pd) && (o.a_strided || (o.b_strided && !o.b_constant))) {
    // Only the reference matmul reads these strides: read plain copies (the planner reorders).
    a_src = PlainDesc(o.a_dims);
    pd = o.b_constant ? MatmulForConstantWeight(make, o.b_dims) : make(o.b_strided ? AnyDesc(o.b_dims) : o.b_view);
  }
  return pd;
}

/*!
 * \brief MatmulPdWithDst with the output plain (f32 unless every reader rounds it to bf16 anyway:
 *        OutputOnlyFeedsBf16Convs), or in the planner's hint when \p may_follow_hint: the layout
 *        under which the permute that alone reads the product is a view with row-major bytes
 *        (LayoutResolver::PermutedOutputLayout; attention's (P @ V) [B, heads, N, d] written as
 *        [B, N, heads, d], which the output dense reads with no reorder).  The hint is taken only
 *        where a jit matmul writes it reading a as it is; otherwise the output is plain.
 */
dnnl::matmul::primitive_desc MatmulPd(const KernelContext& ctx, const MatmulOperands& o, const memory::desc& bias,
                                      const memory::dims& dst_dims, const dnnl::primitive_attr& attr,
                                      bool may_follow_hint) {
  const bool bf16_out = OutputOnlyFeedsBf16Convs(ctx);
  const memory::desc plain = WithType(PlainDesc(dst_dims), bf16_out ? memory::data_type::bf16 : memory::data_type::f32);
  const memory::desc& hint = ctx.output_hint;
  if (may_follow_hint && !ctx.bf16 && !bf16_out && hint.get_ndims() == static_cast<int>(dst_dims.size()) &&
      hint.get_dims() == dst_dims && hint.get_data_type() == memory::data_type::f32) {
    try {
      dnnl::matmul::primitive_desc pd = MatmulPdWithDst(ctx, o, bias, hint, attr);
      if (!IsReferenceImpl(pd) && pd.src_desc() == o.a_md) return pd;
    } catch (const dnnl::error&) {
      // no implementation writes that layout: plain below
    }
  }
  return MatmulPdWithDst(ctx, o, bias, plain, attr);
}

/*!
 * \brief How many of \p hint's dims each of \p out's dims is split into, where \p hint is \p out with
 *        its batch dims split into factors (M and N as they are, unit dims anywhere); empty otherwise.
 */
std::vector<size_t> BatchSplit(const memory::dims& hint, const std::vector<int64_t>& out) {
  if (out.size() < 2 || hint.size() <= out.size()) return {};
  const size_t batch = hint.size() - 2;
  if (hint[batch] != out[out.size() - 2] || hint[batch + 1] != out.back()) return {};
  std::vector<size_t> counts(out.size(), 1);
  size_t h = 0;
  for (size_t i = 0; i + 2 < out.size(); ++i) {
    int64_t product = 1;
    size_t c = 0;
    for (; h < batch && (c == 0 || product < out[i] || hint[h] == 1); ++h, ++c) product *= hint[h];
    if (c == 0 || product != out[i]) return {};
    counts[i] = c;
  }
  return h == batch ? counts : std::vector<size_t>{};
}

/*! \brief \p dims / \p strides (an operand at the output's rank) with batch dim i split as the output's
 *         is (\p counts, \p hint: BatchSplit); a broadcast dim of 1 into as many 1s. */
memory::desc SplitBatchDims(const memory::dims& dims, const memory::dims& strides, const std::vector<size_t>& counts,
                            const memory::dims& hint, bool plain) {
  memory::dims new_dims, new_strides;
  size_t h = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    const size_t c = i + 2 < dims.size() ? counts[i] : 1;
    const size_t first = new_dims.size();
    for (size_t k = 0; k < c; ++k) new_dims.push_back(i + 2 < dims.size() && dims[i] != 1 ? hint[h + k] : dims[i]);
    new_strides.resize(new_dims.size());
    int64_t stride = strides[i];  // the innermost part keeps the dim's stride
    for (size_t k = new_dims.size(); k-- > first;) {
      new_strides[k] = stride;
      stride *= new_dims[k];
    }
    if (i + 2 < dims.size()) h += c;
  }
  return plain ? PlainDesc(new_dims) : StridedDesc(new_dims, new_strides);
}

/*!
 * \brief The float matmul writing the planner's hint of a higher rank than its output (plan/layouts.h
 *        PermutedOutputLayout through a reshape: Swin's P @ V [windows * heads, N, d] written as
 *        [windows, heads, N, d] under the strides that make the reshape and permute after it views):
 *        a, b and the output with their batch dims split as the hint's; null where the hint is no such
 *        split or no jit matmul writes it (the caller builds the plain form).  No mask or residual.
 */
std::unique_ptr<Kernel> MatmulWritingSplitHint(const KernelContext& ctx, const MatmulOperands& o, bool has_bias,
                                               const memory::dims& dst_dims, const Epilogue& epilogue) {
  const memory::desc& hint = ctx.output_hint;
  if (hint.get_ndims() <= static_cast<int>(dst_dims.size())) return nullptr;
  const memory::dims hint_dims = hint.get_dims();
  const std::vector<size_t> counts = BatchSplit(hint_dims, std::vector<int64_t>(dst_dims.begin(), dst_dims.end()));
  if (counts.empty()) return nullptr;
  MatmulOperands split = o;
  split.a_md = SplitBatchDims(o.a_dims, o.a_md.get_strides(), counts, hint_dims, !o.a_strided);
  split.a_dims = split.a_md.get_dims();
  split.b_view = SplitBatchDims(o.b_dims, o.b_view.get_strides(), counts, hint_dims, false);
  split.b_dims = split.b_view.get_dims();
  memory::dims bias_dims(hint_dims.size(), 1);
  bias_dims.back() = hint_dims.back();
  const dnnl::primitive_attr attr = ctx.MakeAttr(epilogue);
  dnnl::matmul::primitive_desc pd =
      MatmulPd(ctx, split, has_bias ? PlainDesc(bias_dims) : memory::desc(), hint_dims, attr, /*may_follow_hint=*/true);
  if (pd.dst_desc() != hint) return nullptr;
  return MakeAnchorKernel(ctx, "matmul", std::move(pd), split.a_md, split.b_view, bias_dims, has_bias, hint_dims,
                          epilogue);
}

/*!
 * \brief Operand \p k's view \p view (over the input's row-major bytes) composed with the strides the
 *        input is stored under, where it is a float32 run-time value held only under strides (a slice's
 *        view of Swin's qkv dense output, a reshape of it): the same elements, read where they lie; an
 *        empty desc where the value is plain, constant, bf16, or its layout does not take the view's dims, and
 *        unless BYOC_HETERO_SLICE_VIEWS=on (StridedReadsOn: opt-in).
 */
memory::desc StoredOperand(const KernelContext& ctx, size_t k, const memory::desc& view) {
  if (!StridedReadsOn() || ctx.bf16 || k >= ctx.input_storage.size() || ctx.input_constant[k] || ctx.input(k).dtype != DType::kFloat32) {
    return memory::desc();
  }
  const memory::desc& stored = ctx.input_storage[k];
  const memory::desc plain = PlainDescOf(ctx.input(k));
  if (stored == plain || stored.get_ndims() != plain.get_ndims() || stored.get_dims() != plain.get_dims()) {
    return memory::desc();
  }
  // The view is a permutation of a dense layout: its dims (of extent > 1) ordered by falling stride are
  // a row-major reshape of the tensor, which the stored layout reads as that shape (or cannot).
  const memory::dims dims = view.get_dims(), strides = view.get_strides();
  std::vector<size_t> order;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] > 1) order.push_back(d);
  }
  if (order.empty()) return memory::desc();
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] > strides[b]; });
  memory::dims rows;
  for (size_t d : order) rows.push_back(dims[d]);
  const memory::desc as_rows = ReshapedView(stored, rows);
  if (as_rows.is_zero()) return memory::desc();
  const memory::dims row_strides = as_rows.get_strides();
  memory::dims composed(dims.size(), 1);
  for (size_t j = 0; j < order.size(); ++j) composed[order[j]] = row_strides[j];
  return StridedDesc(dims, composed);
}

/*! \brief As MakeAnchorKernel, with the mask read plain as the binary post-op's second source
 *         (\p residual_index: the residual input's index, -1 without one). */
std::unique_ptr<Kernel> MakeMaskedMatmul(const KernelContext& ctx, dnnl::matmul::primitive_desc pd,
                                         const memory::desc& a_md, const memory::desc& b_view, bool has_bias,
                                         const memory::dims& bias_dims, const memory::dims& mask_dims, int mask_post_op,
                                         const memory::dims& dst_dims, int residual_index) {
  std::vector<OperandLayout> inputs{{a_md, pd.src_desc()}, {b_view, pd.weights_desc()}};
  std::vector<int> args{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS};
  if (has_bias) {
    inputs.push_back({PlainDesc(bias_dims), pd.bias_desc()});
    args.push_back(DNNL_ARG_BIAS);
  }
  inputs.push_back({PlainDesc(mask_dims), PlainDesc(mask_dims)});
  args.push_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(mask_post_op) | DNNL_ARG_SRC_1);
  OperandLayout output{PlainDesc(dst_dims), pd.dst_desc()};
  if (residual_index >= 0) {
    inputs.push_back(output);
    args.push_back(0);
  }
  return std::make_unique<PrimitiveKernel>(ctx.where(), "matmul", std::move(pd), std::move(args), std::move(inputs),
                                           std::move(output), residual_index);
}

/*! \brief What a float matmul computes, as BuildMatmul read it. */
struct FloatMatmul {
  MatmulOperands operands;  // a and b as views over their inputs' row-major bytes
  bool has_bias;
  memory::dims bias_dims;
  bool has_mask;
  memory::dims mask_dims, dst_dims;
  Epilogue epilogue;
  int residual_index;  // -1 without a residual
};

/*!
 * \brief A float matmul whose epilogue runs as two steps: the matmul with the post-ops before the first one
 *        reading another tensor (the scale; the activation too without a mask) into a temp, then one oneDNN
 *        binary add of the mask (or, without one, the residual) with the rest as its post-ops (activation,
 *        the residual as a binary add, post-activation) into the output.  MatmulWithSplitEpilogue says when.
 */
class SplitEpilogueMatmulKernel : public Kernel {
 public:
  SplitEpilogueMatmulKernel(std::string label, dnnl::matmul::primitive_desc matmul, dnnl::binary::primitive_desc add,
                            std::vector<OperandLayout> inputs, OperandLayout output, bool has_bias, int add_input,
                            int residual_post_op, int residual_input)
      : label_(std::move(label)),
        matmul_(std::move(matmul)),
        add_(std::move(add)),
        has_bias_(has_bias),
        add_input_(add_input),
        residual_post_op_(residual_post_op),
        residual_input_(residual_input) {
    inputs_ = std::move(inputs);
    output_ = std::move(output);
    temps_ = {matmul_.dst_desc()};
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override {
    Step product;
    product.pd = matmul_;
    product.label = label_;
    product.op = "matmul";
    product.args = {{DNNL_ARG_SRC, BoundInput(0, inputs[0])}, {DNNL_ARG_WEIGHTS, BoundInput(1, inputs[1])},
                    {DNNL_ARG_DST, temps[0]}};
    if (has_bias_) product.args.emplace_back(DNNL_ARG_BIAS, inputs[2]);
    Step add;
    add.pd = add_;
    add.label = label_ + " (epilogue)";
    add.op = "matmul";
    add.args = {{DNNL_ARG_SRC_0, temps[0]}, {DNNL_ARG_SRC_1, inputs[add_input_]}, {DNNL_ARG_DST, output}};
    if (residual_post_op_ >= 0) {
      add.args.emplace_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(residual_post_op_) | DNNL_ARG_SRC_1, inputs[residual_input_]);
    }
    std::vector<Step> steps;
    steps.push_back(std::move(product));
    steps.push_back(std::move(add));
    return steps;
  }

 private:
  std::string label_;
  dnnl::matmul::primitive_desc matmul_;
  dnnl::binary::primitive_desc add_;
  bool has_bias_;
  int add_input_, residual_post_op_, residual_input_;
};

/*! \brief BYOC_HETERO_MATMUL_SPLIT_EPILOGUE (read when a region is planned): "on" (or unset) lets a matmul whose
 *         primitive with its whole epilogue is a reference one run the epilogue as its own step
 *         (MatmulWithSplitEpilogue); "off" keeps the one reference primitive (the A/B's other side). */
bool SplitEpilogueOn() { return EnvSwitch("BYOC_HETERO_MATMUL_SPLIT_EPILOGUE", "on", "off", true); }

/*!
 * \brief \p f as a SplitEpilogueMatmulKernel, or null where that would not avoid a reference kernel.
 *        For a matmul whose primitive with its whole epilogue is oneDNN's reference one (\p full_is_ref):
 *        under ONEDNN_MAX_CPU_ISA=AVX2 (Zen 3, older Intel) f32 matmul is the jit sgemm, which takes a sum
 *        post-op only first and a binary post-op in few broadcasts, so attention's scale then full mask
 *        (the residual) ran "ref:any".  Taken only where both the matmul without the tensor-reading post-ops
 *        and the binary with them are jit kernels.
 */
std::unique_ptr<Kernel> MatmulWithSplitEpilogue(const KernelContext& ctx, const FloatMatmul& f) {
  const Epilogue& e = f.epilogue;
  if (!f.has_mask && !e.residual) return nullptr;
  Epilogue head;
  head.scale = e.scale;
  if (!f.has_mask) head.act = e.act;
  const memory::desc product = PlainDesc(f.dst_dims);
  dnnl::post_ops ops;
  if (f.has_mask && !e.act.none()) ops.append_eltwise(e.act.alg, e.act.alpha, e.act.beta);
  const int residual_post_op = f.has_mask && e.residual ? ops.len() : -1;
  if (residual_post_op >= 0) ops.append_binary(dnnl::algorithm::binary_add, product);
  if (!e.post_act.none()) ops.append_eltwise(e.post_act.alg, e.post_act.alpha, e.post_act.beta);
  dnnl::primitive_attr add_attr = ctx.MakeAttr();
  add_attr.set_post_ops(ops);
  const memory::desc bias = f.has_bias ? PlainDesc(f.bias_dims) : memory::desc();
  try {
    dnnl::matmul::primitive_desc matmul = MatmulPdWithDst(ctx, f.operands, bias, product, ctx.MakeAttr(head));
    const memory::desc addend = f.has_mask ? PlainDesc(f.mask_dims) : product;
    dnnl::binary::primitive_desc add(ctx.engine, dnnl::algorithm::binary_add, product, addend, product, add_attr);
    if (IsReferenceImpl(matmul) || IsReferenceImpl(add)) return nullptr;
    const MatmulOperands& o = f.operands;
    std::vector<OperandLayout> inputs{{o.a_md, matmul.src_desc()}, {o.b_view, matmul.weights_desc()}};
    if (f.has_bias) inputs.push_back({PlainDesc(f.bias_dims), matmul.bias_desc()});
    if (f.has_mask) inputs.push_back({addend, addend});
    if (e.residual) inputs.push_back({product, product});
    const int add_input = 2 + f.has_bias;  // the mask, or the residual without one
    return std::make_unique<SplitEpilogueMatmulKernel>(ctx.where(), std::move(matmul), std::move(add), std::move(inputs),
                                                       OperandLayout{product, product}, f.has_bias, add_input,
                                                       residual_post_op, f.residual_index);
  } catch (const dnnl::error&) {
    return nullptr;  // no such primitive: the whole epilogue as post-ops
  }
}

/*! \brief The float matmul of \p f: one writing a split hint, or the plain / hinted form, masked or not. */
std::unique_ptr<Kernel> BuildFloatMatmul(const KernelContext& ctx, const FloatMatmul& f) {
  int mask_post_op = -1;
  const dnnl::primitive_attr attr =
      f.has_mask ? MaskedMatmulAttr(ctx, f.epilogue, f.mask_dims, &mask_post_op) : ctx.MakeAttr(f.epilogue);
  if (!f.has_mask && !f.epilogue.residual) {
    if (auto split = MatmulWritingSplitHint(ctx, f.operands, f.has_bias, f.dst_dims, f.epilogue)) return split;
  }
  const MatmulOperands& o = f.operands;
  dnnl::matmul::primitive_desc pd = MatmulPd(ctx, o, f.has_bias ? PlainDesc(f.bias_dims) : memory::desc(), f.dst_dims,
                                             attr, !f.epilogue.residual);
  if (SplitEpilogueOn() && IsReferenceImpl(pd)) {  // the knob checked on every float matmul
    if (auto split = MatmulWithSplitEpilogue(ctx, f)) return split;
  }
  if (!f.has_mask) {
    return MakeAnchorKernel(ctx, "matmul", std::move(pd), o.a_md, o.b_view, f.bias_dims, f.has_bias, f.dst_dims,
                            f.epilogue);
  }
  return MakeMaskedMatmul(ctx, std::move(pd), o.a_md, o.b_view, f.has_bias, f.bias_dims, f.mask_dims, mask_post_op,
                          f.dst_dims, f.residual_index);
}

/*!
 * \brief BuildFloatMatmul reading a and b where they lie when they are held under strides (StoredOperand:
 *        Swin's Q, K and V, slices of one dense's output viewed by the planner with no copy): the matmul
 *        is made over the composed descriptors and takes the values' storage as it is (HandOverStored).
 *        Where the primitive would not read them so (only the reference matmul takes those strides: it
 *        reads plain copies instead), the matmul is made over the plain views as before and the planner
 *        copies.
 */
std::unique_ptr<Kernel> BuildFloatMatmulReadingStored(const KernelContext& ctx, const FloatMatmul& f) {
  FloatMatmul stored = f;
  memory::desc a_stored = StoredOperand(ctx, 0, f.operands.a_md);
  memory::desc b_stored = f.operands.b_constant ? memory::desc() : StoredOperand(ctx, 1, f.operands.b_view);
  if (a_stored.is_zero() && b_stored.is_zero()) return BuildFloatMatmul(ctx, f);
  if (!a_stored.is_zero()) {
    stored.operands.a_md = a_stored;
    stored.operands.a_strided = true;
  }
  if (!b_stored.is_zero()) {
    stored.operands.b_view = b_stored;
    stored.operands.b_strided = true;
  }
  std::unique_ptr<Kernel> kernel = BuildFloatMatmul(ctx, stored);
  for (size_t k = 0; k < 2; ++k) {
    const bool handed = !(k == 0 ? a_stored : b_stored).is_zero();
    const OperandLayout& in = kernel->inputs()[k];
    if (handed && in.want != in.view) return BuildFloatMatmul(ctx, f);  // it wants another layout: copy
  }
  for (size_t k = 0; k < 2; ++k) {
    if ((k == 0 ? a_stored : b_stored).is_zero()) continue;
    kernel->HandOverStored(k, PlainDescOf(ctx.input(k)), ctx.input_storage[k]);
  }
  return kernel;
}

}  // namespace

static std::unique_ptr<Kernel> BuildMatmul(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const bool transpose_b = attrs.Flag("transpose_b", false);
  Epilogue epilogue = ctx.ReadEpilogue(attrs);
  epilogue.scale = static_cast<float>(attrs.Float("scale", 1.0));
  const OperandView a_view = ReadOperandView(ctx, attrs, 0, "a_shape", "a_strides", "a_axes");
  const OperandView b_in = ReadOperandView(ctx, attrs, 1, "b_shape", "b_strides", "b_axes");
  const bool has_mask = attrs.Flag("has_mask", false);
  const size_t base = ctx.node().inputs.size() - (epilogue.residual ? 1 : 0) - (has_mask ? 1 : 0);
  const bool has_bias = attrs.Flag("has_bias", base == 3);
  ReadNodePrecision(ctx, attrs);  // validated; ctx.bf16 holds what it means here
  const bool int8 = attrs.Has("a_scale") || IsInt8(ctx.input(0).dtype) || IsInt8(ctx.input(1).dtype);
  const Int8MatmulParams q = int8 ? ReadInt8MatmulParams(ctx, attrs) : Int8MatmulParams{};
  if (int8 && (has_bias || has_mask || epilogue.residual)) {
    ctx.Fail("an int8 matmul takes no bias, mask or residual (ops/int8_matmul.py fuses none)");
  }
  attrs.CheckNoUnknown();

  ctx.ExpectInputCount(2 + has_bias + has_mask + epilogue.residual,
                       std::string(has_bias ? "a, b, bias" : "a, b") + (has_mask ? ", mask" : "") +
                           (epilogue.residual ? ", residual" : ""));
  const MatmulShapes shapes = CheckMatmulShapes(ctx, a_view.shape, b_in.shape, transpose_b);
  const size_t rank = shapes.rank;
  const int64_t n = shapes.n;
  const std::vector<int64_t>& as = shapes.as;
  const std::vector<int64_t>& bs = shapes.bs;
  const std::vector<int64_t>& out_shape = shapes.out_shape;
  if (has_bias && ctx.input(2).numel() != n) {
    ctx.Fail("bias must have N=" + std::to_string(n) + " elements, got shape " +
             ShapeToString(ctx.input(2).shape));
  }
  const memory::dims mask_dims = has_mask ? MaskDims(ctx, 2 + has_bias, out_shape) : memory::dims{};
  const size_t residual_index = 2 + has_bias + has_mask;
  if (epilogue.residual) ctx.ExpectInputShape(residual_index, "residual", out_shape);

  // b as the logical [..., K, N] matrix over its stored bytes (a leading 1 stride for aligned dims).
  memory::dims b_dims(bs.begin(), bs.end());
  memory::dims b_strides = ViewStrides(b_in, b_dims);
  if (transpose_b) {
    std::swap(b_dims[rank - 2], b_dims[rank - 1]);
    std::swap(b_strides[rank - 2], b_strides[rank - 1]);
  }
  const memory::desc b_view = StridedDesc(b_dims, b_strides);
  const memory::dims a_dims(as.begin(), as.end()), dst_dims(out_shape.begin(), out_shape.end());
  const memory::desc a_md = a_view.strided ? StridedDesc(a_dims, ViewStrides(a_view, a_dims)) : PlainDesc(a_dims);
  memory::dims bias_dims(rank, 1);
  bias_dims[rank - 1] = n;
  if (int8) return MakeInt8Matmul(ctx, q, a_md, b_view, dst_dims, epilogue);

  const MatmulOperands operands{a_md, a_dims, a_view.strided, b_view, b_dims, b_in.strided,
                                ctx.input_constant.size() > 1 && ctx.input_constant[1]};
  const FloatMatmul spec{operands, has_bias, bias_dims, has_mask, mask_dims, dst_dims, epilogue,
                         epilogue.residual ? static_cast<int>(residual_index) : -1};
  return BuildFloatMatmulReadingStored(ctx, spec);
}

/*! \brief bf16 region: a and b are rounded to bf16; never the bias or a residual. */
static KernelTraits MatmulTraits() {
  KernelTraits traits;
  traits.bf16_input = [](const NodeInfo&, size_t k) { return k <= 1 ? Bf16Read::kRounds : Bf16Read::kF32; };
  traits.accepts_int8 = true;  // 8-bit a and b with attrs a_scale ... (the file comment)
  // a float32 a and b are read where they lie (BuildFloatMatmulReadingStored); int8 ones are not
  traits.strided_input = [](const NodeInfo& node, size_t k) {
    return k <= 1 && node.attrs.count("a_scale") == 0 ? StridedRead::kInPlace : StridedRead::kCopies;
  };
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("matmul", BuildMatmul, MatmulTraits());

}  // namespace byoc_hetero
