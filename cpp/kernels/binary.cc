/*!
 * \file kernels/binary.cc
 * \brief binary: elementwise add / mul / sub / div / max / min with numpy broadcasting on either
 *        side (one oneDNN binary), with an optional activation fused as a post-op.
 *
 * Attrs: algorithm "add" | "mul" | "sub" | "div" | "max" | "min" (required), shift (a number, default
 * 0), activation (+ clip) (default "none").  Inputs a, b and optionally an addend c: the output is
 * act(a op b + shift + c), the shift an eltwise linear post-op and c a binary add post-op (c
 * broadcasts to the output, which is the broadcast of a and b).  Region pass fuse_affine_tails
 * writes them: GRN's gamma * (x * Nx) + beta + x as one pass, x * (gamma * Nx + 1) + beta, the
 * small factor gamma * Nx + 1 a binary with shift 1.
 *
 * oneDNN 3.2's binary broadcasts only its second source (src0 must have the destination's dims),
 * so the kernel picks one of three forms:
 *   - input 0 has the output shape: a op b as it stands; input 0 is read in its producer's layout;
 *   - only input 1 has it: the operands are swapped, for add / mul / max / min (they commute) and
 *     for sub, whose swap b - a is turned back into a - b by an eltwise linear(-1) post-op placed
 *     before the activation (no copy either way);
 *   - otherwise (div with a broadcast dividend, or both inputs broadcast, as [B, 1, S] - [B, S, 1]):
 *     input 0 is first expanded to the output shape by a host step into a per-call temp.
 * oneDNN 3.2's jit binary broadcasts src1 only in a few patterns (per tensor, per channel, ...);
 * any other ran its reference kernel: torchvision Swin-T's shifted-window mask [1, W, 1, N, N]
 * over the scores [1, W, heads, N, N] took 18% of the model's call as 5 "ref:any" steps.  Where
 * the primitive would be a reference one, the operands are read plain in the fewest dims (the
 * same bytes: [W, heads, N * N] + [W, 1, N * N]); where that is still a reference kernel, the
 * broadcast operand is expanded to the output shape by a host step into a per-call temp and the
 * binary runs without a broadcast (AvoidReferenceBroadcast).
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "broadcast.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BYOC_HETERO_CHANNEL_MUL_BF16 1
// GCC 12 warns about the intrinsics' own undefined-vector idiom (-Wmaybe-uninitialized in
// avx512fintrin.h, a known false positive)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/*!
 * \brief y[r, c] = bf16(x[r, c] * scale[c]) for rows [begin, end) of channels-last bf16 data: f32
 *        products rounded to nearest even, as oneDNN's binary with a bf16 destination rounds.
 *        Compiled for AVX-512 BF16 and called only where oneDNN's ISA is avx512_core_bf16 or
 *        later (a bf16 region runs only there: EffectivePrecision).
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void ChannelMulRowsBf16(
    const uint16_t* x, const float* scale, uint16_t* y, int64_t channels, int64_t begin, int64_t end) {
  const int64_t full = channels / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (channels - full)) - 1u);
  for (int64_t r = begin; r < end; ++r) {
    const uint16_t* xr = x + r * channels;
    uint16_t* yr = y + r * channels;
    for (int64_t c = 0; c < full; c += 16) {
      const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + c)));
      const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)), _mm512_loadu_ps(scale + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(yr + c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    }
    if (tail) {
      const __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(tail, xr + full));
      const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)),
                                     _mm512_maskz_loadu_ps(tail, scale + full));
      _mm256_mask_storeu_epi16(yr + full, tail, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    }
  }
}
#pragma GCC diagnostic pop
#endif

/*!
 * \brief The host loop for a channels-last (NHWC) bf16 tensor times a per-channel [1, C, 1, 1]
 *        scale (bf16 or f32) into a channels-last bf16 result: a squeeze-excitation's channel
 *        multiply in a bf16 region. nullptr where the operands are laid out otherwise or the CPU
 *        lacks native bf16: oneDNN's binary runs instead.
 *
 * Why not oneDNN's binary: its jit:uni kernel for this broadcast (oneDNN 3.2, Zen 5, 2 threads)
 * took 39-43 us on EfficientNet-B0's [1,32,112,112] multiply, 14 us on [1,96,56,56], 17.5 us on
 * [1,144,56,56] (0.123 ms over the model's 16), where OpenVINO's own kernel for the same
 * multiplies took 9.4 / 8.1 / 10.4 us (0.064 ms); its 2-D row form ([HW, C] x [1, C]) was 2x slower
 * still.
 */
HostFn ChannelMulBf16Fn(const memory::desc& src0, const memory::desc& src1, const memory::desc& dst) {
#ifdef BYOC_HETERO_CHANNEL_MUL_BF16
  const memory::dims d = dst.get_dims();
  auto nhwc_bf16 = [](const memory::desc& md) {
    return md.get_ndims() == 4 &&
           md == memory::desc(md.get_dims(), memory::data_type::bf16, memory::format_tag::acdb);
  };
  if (!Bf16Native() || !nhwc_bf16(src0) || !nhwc_bf16(dst) || src0.get_dims() != d) return nullptr;
  const memory::dims per_channel{1, d[1], 1, 1};
  const memory::data_type st = src1.get_data_type();
  if (src1.get_dims() != per_channel || src1.get_format_kind() != memory::format_kind::blocked ||
      src1.get_inner_nblks() != 0 || (st != memory::data_type::bf16 && st != memory::data_type::f32)) {
    return nullptr;  // a dense [1, C, 1, 1] has the bytes of a plain [C] in any order of its dims
  }
  const int64_t channels = d[1], rows = d[0] * d[2] * d[3];
  const bool scale_bf16 = st == memory::data_type::bf16;
  return [channels, rows, scale_bf16](const std::vector<void*>& ptrs) {
    std::vector<float> scale(static_cast<size_t>(channels));
    for (int64_t c = 0; c < channels; ++c) {
      if (scale_bf16) {
        const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(ptrs[1])[c]) << 16;
        std::memcpy(&scale[c], &bits, sizeof(float));
      } else {
        scale[c] = static_cast<const float*>(ptrs[1])[c];
      }
    }
    const uint16_t* x = static_cast<const uint16_t*>(ptrs[0]);
    uint16_t* y = static_cast<uint16_t*>(ptrs[2]);
    // at least 16 tasks where there are rows enough (a 7x7 map has 49 rows: one task of 64 left a
    // thread idle, 4.0 us vs oneDNN's 2.7 us on [1,1152,7,7]), at most 64 rows each
    const int64_t per_task = std::max<int64_t>(1, std::min<int64_t>(64, rows / 16));
    const int64_t tasks = (rows + per_task - 1) / per_task;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      ChannelMulRowsBf16(x, scale.data(), y, channels, t * per_task, std::min(rows, (t + 1) * per_task));
    }
  };
#else
  return nullptr;
#endif
}

/*! \brief The binary primitive, preceded by an expansion of input 0 when it is broadcast. */
class BinaryKernel : public Kernel {
 public:
  BinaryKernel(std::string label, dnnl::binary::primitive_desc pd, std::vector<int> args,
               std::vector<OperandLayout> inputs, OperandLayout output, HostFn expand,
               size_t expand_input, HostFn host = nullptr)
      : label_(std::move(label)), pd_(std::move(pd)), args_(std::move(args)), expand_(std::move(expand)),
        expand_input_(expand_input), host_(std::move(host)) {
    inputs_ = std::move(inputs);
    output_ = std::move(output);
    if (expand_) temps_.push_back(args_[expand_input_] == DNNL_ARG_SRC_0 ? pd_.src0_desc() : pd_.src1_desc());
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override {
    std::vector<Step> steps;
    Step run;
    run.pd = pd_;
    run.label = label_;
    run.op = "binary";
    if (expand_) {
      Step expand;
      expand.host = expand_;
      expand.label = label_ + ": input " + std::to_string(expand_input_) + " broadcast to the output shape";
      expand.op = "binary";
      expand.args = {{0, inputs[expand_input_]}, {1, temps[0]}};
      steps.push_back(std::move(expand));
      for (size_t k = 0; k < inputs.size(); ++k) {
        run.args.emplace_back(args_[k], k == expand_input_ ? temps[0] : inputs[k]);
      }
    } else if (host_) {
      // the host loop in place of the primitive: (src0, src1, dst) in this order
      run.pd = dnnl::primitive_desc_base();
      run.host = host_;
      for (int arg : {DNNL_ARG_SRC_0, DNNL_ARG_SRC_1}) {
        for (size_t k = 0; k < inputs.size(); ++k) {
          if (args_[k] == arg) run.args.emplace_back(static_cast<int>(run.args.size()), inputs[k]);
        }
      }
      run.args.emplace_back(2, output);
      steps.push_back(std::move(run));
      return steps;
    } else {
      for (size_t k = 0; k < inputs.size(); ++k) run.args.emplace_back(args_[k], inputs[k]);
    }
    run.args.emplace_back(DNNL_ARG_DST, output);
    steps.push_back(std::move(run));
    return steps;
  }

 private:
  std::string label_;
  dnnl::binary::primitive_desc pd_;
  std::vector<int> args_;
  HostFn expand_;
  size_t expand_input_;  // the input expand_ writes into the temp (node input order)
  HostFn host_;  // replaces the primitive when set (ChannelMulBf16Fn)
};

}  // namespace

/*!
 * \brief Whether the broadcast operand \p other (at most one dim > 1: a squeeze-excitation's
 *        [1, C, 1, 1] scale) is read as its producer stored it: such an operand has the same bytes in
 *        any dense layout (e.g. a 1x1 conv's acdb:bf16 in a bf16 region), so no per-call reorder to
 *        plain f32.
 */
static bool ReadAsStored(const KernelContext& ctx, size_t other, size_t rank, const memory::desc& src1) {
  const memory::desc other_stored = ctx.InputLayout(other);
  const std::vector<int64_t>& dims = ctx.input(other).shape;
  const bool vector_like = std::count_if(dims.begin(), dims.end(), [](int64_t d) { return d > 1; }) <= 1;
  return vector_like && dims.size() == rank && other_stored != src1 &&
         other_stored.get_format_kind() == memory::format_kind::blocked && other_stored.get_inner_nblks() == 0;
}

/*! \brief What follows the op, as post-ops in this order: a sub swap's negation and the shift (one
 *         eltwise linear), the addend (a binary add of \p addend: post-op 1 after that linear, else
 *         0; addend_post_op), the activation. */
struct BinaryTail {
  bool negate = false;  // a sub computed as b - a: * -1 gives a - b back
  float shift = 0.f;
  std::optional<memory::desc> addend;
  Activation act;

  bool none() const { return !negate && shift == 0.f && !addend && act.none(); }
  int addend_post_op() const { return negate || shift != 0.f ? 1 : 0; }
};

static dnnl::primitive_attr BinaryAttr(const KernelContext& ctx, const BinaryTail& tail) {
  dnnl::primitive_attr attr = ctx.MakeAttr();
  dnnl::post_ops ops;
  if (tail.negate || tail.shift != 0.f) {
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, tail.negate ? -1.f : 1.f, tail.shift);
  }
  if (tail.addend) ops.append_binary(dnnl::algorithm::binary_add, *tail.addend);
  if (!tail.act.none()) ops.append_eltwise(tail.act.alg, tail.act.alpha, tail.act.beta);
  if (ops.len() > 0) attr.set_post_ops(ops);
  return attr;
}

/*! \brief The attrs shift and activation (+ clip) of a binary node. */
static BinaryTail ReadTail(const KernelContext& ctx, AttrReader& attrs) {
  BinaryTail tail;
  tail.act = ctx.ReadActivation(attrs);
  const double shift = attrs.Float("shift", 0.0);
  if (!std::isfinite(shift)) attrs.Fail("shift", "expected a finite number");
  tail.shift = static_cast<float>(shift);
  return tail;
}

/*! \brief The addend's (input 2) dims aligned to the output's rank, each the output's or 1; nullopt
 *         without an addend. */
static std::optional<std::vector<int64_t>> ReadAddend(const KernelContext& ctx,
                                                      const std::vector<int64_t>& out_shape) {
  if (ctx.node().inputs.size() < 3) return std::nullopt;
  const std::vector<int64_t>& c = ctx.input(2).shape;
  const std::optional<std::vector<int64_t>> joint = BroadcastShape({out_shape, c});
  if (c.size() > out_shape.size() || !joint || *joint != out_shape) {
    ctx.Fail("addend (input 2) of shape " + ShapeToString(c) + " does not broadcast to the output shape " +
             ShapeToString(out_shape) + " of a and b");
  }
  if (ctx.input(2).dtype != DType::kFloat32) ctx.Fail("addend (input 2) must be float32");
  return AlignRank(c, out_shape.size());
}

/*! \brief The output's dims and each operand's (rank-aligned, each dim the output's or 1) with the
 *         output's axes of size 1 dropped and neighbouring axes merged where every operand has both
 *         or broadcasts along both: the same row-major bytes in the fewest dims (a leading 1 kept
 *         before [C, S] with a per-row [C, 1] operand: oneDNN's per-channel form). */
struct CollapsedDims {
  memory::dims dst;
  std::vector<memory::dims> operands;
};

static CollapsedDims CollapseAxes(const std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& operands) {
  CollapsedDims c;
  c.operands.resize(operands.size());
  int64_t prev = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 1) continue;
    bool same = prev >= 0;
    for (const auto& op : operands) same = same && (op[i] == 1) == (op[static_cast<size_t>(prev)] == 1);
    if (!same) {
      c.dst.push_back(1);
      for (auto& op : c.operands) op.push_back(1);
    }
    c.dst.back() *= out[i];
    for (size_t k = 0; k < operands.size(); ++k) c.operands[k].back() *= operands[k][i];
    prev = static_cast<int64_t>(i);
  }
  if (c.dst.empty()) {  // one element
    c.dst = {1};
    for (auto& op : c.operands) op = {1};
  }
  const bool per_row = std::any_of(c.operands.begin(), c.operands.end(),
                                   [](const memory::dims& op) { return op.size() == 2 && op[0] > 1 && op[1] == 1; });
  if (c.dst.size() == 2 && per_row) {  // [C, S] + [C, 1] runs as oneDNN's reference: [1, C, S] + [1, C, 1] jitted
    c.dst.insert(c.dst.begin(), 1);
    for (auto& op : c.operands) op.insert(op.begin(), 1);
  }
  return c;
}

/*! \brief The binary primitive of src0 and src1, read plain instead where only a reference
 *         implementation reads them as given, and writing f32 where only one writes bf16. */
static dnnl::binary::primitive_desc BinaryPd(const KernelContext& ctx, dnnl::algorithm alg, memory::desc src0,
                                             memory::desc src1, const memory::desc& dst_any,
                                             const dnnl::primitive_attr& attr, bool read_as_stored,
                                             bool src0_may_be_plain, const memory::dims& other_dims,
                                             const memory::dims& dst_dims) {
  dnnl::binary::primitive_desc pd(ctx.engine, alg, src0, src1, dst_any, attr);
  if (read_as_stored && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) {
    src1 = PlainDesc(other_dims);  // no jit kernel reads that operand as stored: reorder it
    pd = dnnl::binary::primitive_desc(ctx.engine, alg, src0, src1, dst_any, attr);
  }
  if (src0_may_be_plain && src0 != PlainDesc(dst_dims) && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) {
    // oneDNN 3.2 has no jit binary for some blocked src0 with a broadcast src1 (measured: a
    // [1,16,112,112] aBcd16b conv output plus a [1,1,1,1] scalar ran "ref:any", 12 ms of
    // MobileNetV3's 15); reading src0 plain costs one jit reorder instead.
    src0 = PlainDesc(dst_dims);
    const memory::desc plain_src1 = other_dims == dst_dims ? src0 : src1;
    pd = dnnl::binary::primitive_desc(ctx.engine, alg, src0, plain_src1, dst_any, attr);
  }
  if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0 && memory::desc(pd.dst_desc()).get_data_type() ==
                                                                 memory::data_type::bf16) {
    // no jit binary writes bf16 from these operands (float32 plain [1,1024,14,14] + float32 into bf16
    // ran "ref:any", 16.6 ms of a 28.5 ms int8 + bf16 ResNet-50 mix at 1 thread, 392 ms at 2, once a
    // quantize reader made the output bf16-eligible): write float32, which that reader takes as well
    pd = dnnl::binary::primitive_desc(ctx.engine, alg, pd.src0_desc(), pd.src1_desc(),
                                      AnyDesc(dst_dims, memory::data_type::f32), attr);
  }
  return pd;
}

/*! \brief Which input oneDNN reads as src0 (it has the output shape): 0 or 1; 2 when input 0 must be
 *         expanded to the output shape first. */
static size_t FullInput(const std::vector<int64_t>& as, const std::vector<int64_t>& bs,
                        const std::vector<int64_t>& out_shape, const std::string& alg_name) {
  const bool commutes = alg_name == "add" || alg_name == "mul" || alg_name == "max" || alg_name == "min";
  if (as == out_shape) return 0;
  if (bs == out_shape && (commutes || alg_name == "sub")) return 1;
  return 2;
}

/*! \brief The operands' layouts and the exec args they bind to, node input order (a, b[, addend]). */
static void BindOperands(const dnnl::binary::primitive_desc& pd, const BinaryTail& tail, size_t full, bool expand,
                         bool expand_other, const std::vector<int64_t>& as, const memory::dims& dst_dims,
                         const memory::dims& other_dims, std::vector<OperandLayout>* inputs, std::vector<int>* args) {
  inputs->assign(2, OperandLayout{});
  args->assign(2, 0);
  if (expand) {  // input 0 expanded into the temp by a host step, input 1 the primitive's src1
    (*inputs)[0] = {PlainDesc(memory::dims(as.begin(), as.end())), PlainDesc(memory::dims(as.begin(), as.end()))};
    (*args)[0] = DNNL_ARG_SRC_0;
    (*inputs)[1] = {PlainDesc(other_dims), pd.src1_desc()};
    (*args)[1] = DNNL_ARG_SRC_1;
  } else {
    (*inputs)[full] = {PlainDesc(dst_dims), pd.src0_desc()};
    (*args)[full] = DNNL_ARG_SRC_0;
    // an operand expanded by the host step is read plain by it; the primitive reads the temp
    (*inputs)[1 - full] = {PlainDesc(other_dims), expand_other ? PlainDesc(other_dims) : pd.src1_desc()};
    (*args)[1 - full] = DNNL_ARG_SRC_1;
  }
  if (tail.addend) {
    inputs->push_back({*tail.addend, *tail.addend});
    args->push_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(tail.addend_post_op()) | DNNL_ARG_SRC_1);
  }
}

static bool IsReference(const dnnl::binary::primitive_desc& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

/*!
 * \brief A broadcast binary (no addend, src1 broadcast) that oneDNN 3.2 would run with its reference
 *        kernel: both operands read plain in the fewest dims (CollapseAxes) where a jit kernel takes
 *        that; else the broadcast operand expanded to the output's (collapsed) dims by a host step
 *        and the binary run without a broadcast. Updates \p dst_dims, \p other_dims and \p pd; true
 *        when the operand is expanded.
 */
static bool AvoidReferenceBroadcast(const KernelContext& ctx, dnnl::algorithm alg, const BinaryTail& tail,
                                    const std::vector<int64_t>& out_shape, const std::vector<int64_t>& other_shape,
                                    memory::dims* dst_dims, memory::dims* other_dims,
                                    dnnl::binary::primitive_desc* pd) {
  const CollapsedDims c = CollapseAxes(out_shape, {other_shape});
  const memory::data_type dt = memory::desc(pd->dst_desc()).get_data_type();
  const dnnl::primitive_attr attr = BinaryAttr(ctx, tail);
  const memory::desc src0 = PlainDesc(c.dst);
  dnnl::binary::primitive_desc collapsed(ctx.engine, alg, src0, PlainDesc(c.operands[0]), AnyDesc(c.dst, dt), attr);
  *dst_dims = c.dst;
  *other_dims = c.operands[0];
  if (!IsReference(collapsed)) {
    *pd = std::move(collapsed);
    return false;
  }
  *pd = dnnl::binary::primitive_desc(ctx.engine, alg, src0, src0, AnyDesc(c.dst, dt), attr);
  return true;
}

static std::unique_ptr<Kernel> BuildBinary(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const std::string alg_name = attrs.Choice("algorithm", EnumNamesOf(BinaryAlgorithms()), "");
  BinaryTail tail = ReadTail(ctx, attrs);
  attrs.CheckNoUnknown();
  if (ctx.node().inputs.size() != 3) ctx.ExpectInputCount(2, "a, b[, addend]");

  const auto& a = ctx.input(0).shape;
  const auto& b = ctx.input(1).shape;
  const std::optional<std::vector<int64_t>> broadcast = BroadcastShape({a, b});
  if (!broadcast) ctx.Fail("shapes " + ShapeToString(a) + " and " + ShapeToString(b) + " do not broadcast");
  const std::vector<int64_t>& out_shape = *broadcast;
  const size_t rank = out_shape.size();
  const std::vector<int64_t> as = AlignRank(a, rank), bs = AlignRank(b, rank);
  ctx.ExpectOutputShape(a.empty() && b.empty() ? std::vector<int64_t>{} : out_shape);
  const dnnl::algorithm alg = *FindEnum(BinaryAlgorithms(), alg_name);
  const size_t which = FullInput(as, bs, out_shape, alg_name);
  const bool expand = which == 2;
  const size_t full = expand ? 0 : which;
  tail.negate = full == 1 && alg_name == "sub";  // (b - a) * -1 = a - b, then the shift, addend, activation
  const size_t other = 1 - full;
  memory::dims dst_dims(out_shape.begin(), out_shape.end());
  const std::vector<int64_t>& os = full == 0 ? bs : as;
  memory::dims other_dims(os.begin(), os.end());
  const std::optional<std::vector<int64_t>> addend = ReadAddend(ctx, out_shape);
  if (addend) {
    // with an addend every operand is read plain in the fewest dims: oneDNN 3.2's jit binary adds a
    // [1, C, 1] post-op operand wrongly to [N, C, 1] (N > 1), and runs its reference kernel for a
    // [1, 1, 1, C] one over [1, H, W, C] (GRN's beta) where [1, C] over [H * W, C] is jitted
    const CollapsedDims c = CollapseAxes(out_shape, {os, *addend});
    dst_dims = c.dst;
    other_dims = c.operands[0];
    tail.addend = PlainDesc(c.operands[1]);
  }
  memory::desc src0 = PlainDesc(dst_dims);  // the temp input 0 is expanded into, or a plain read
  if (!expand && !addend && ctx.input(full).shape.size() == rank) src0 = ctx.InputLayout(full);  // as stored
  memory::desc src1 = other_dims == dst_dims && !expand ? src0 : PlainDesc(other_dims);
  const bool read_as_stored =
      !expand && !addend && other_dims != dst_dims && ReadAsStored(ctx, other, rank, src1);
  if (read_as_stored) src1 = ctx.InputLayout(other);
  // bf16 region: the output is written bf16 where every reader rounds it to bf16 anyway
  // (OutputOnlyFeedsBf16Convs: a squeeze-excitation's channel multiply read by the projection
  // conv), so that conv reads it without a reorder; the operands may then arrive bf16 as well
  // (their producers store them so: kernel.cc), which oneDNN's binary reads as they are.
  const memory::desc dst_any = AnyDesc(dst_dims, OutputOnlyFeedsBf16Convs(ctx) ? memory::data_type::bf16
                                                                              : memory::data_type::f32);
  dnnl::binary::primitive_desc pd = BinaryPd(ctx, alg, src0, src1, dst_any, BinaryAttr(ctx, tail), read_as_stored,
                                             !expand, other_dims, dst_dims);
  const bool expand_other = !expand && !addend && other_dims != dst_dims && IsReference(pd) &&
                            AvoidReferenceBroadcast(ctx, alg, tail, out_shape, os, &dst_dims, &other_dims, &pd);
  std::vector<OperandLayout> inputs;
  std::vector<int> args;
  BindOperands(pd, tail, full, expand, expand_other, as, dst_dims, other_dims, &inputs, &args);
  OperandLayout output{PlainDesc(dst_dims), pd.dst_desc()};
  HostFn host;
  if (!expand && alg == dnnl::algorithm::binary_mul && tail.none()) {
    host = ChannelMulBf16Fn(pd.src0_desc(), pd.src1_desc(), pd.dst_desc());
  }
  HostFn expand_fn = expand ? ExpandFn(as, out_shape) : HostFn();
  if (expand_other) expand_fn = ExpandFn(std::vector<int64_t>(other_dims.begin(), other_dims.end()),
                                         std::vector<int64_t>(dst_dims.begin(), dst_dims.end()));
  return std::make_unique<BinaryKernel>(ctx.where(), std::move(pd), std::move(args), std::move(inputs),
                                        std::move(output), std::move(expand_fn), expand_other ? 1 - full : 0,
                                        std::move(host));
}

/*!
 * \brief bf16 region: mul reads its operands bf16 when its output is stored bf16 (the product of
 *        rounded operands, rounded again: a squeeze-excitation's channel scale before the projection
 *        conv; relative errors add, no cancellation; stored bf16 as OpenVINO's bf16 EfficientNet
 *        stores it: EfficientNet-B0 had 16 f32 -> bf16 reorders of the multiply's output per call,
 *        and its depthwise outputs, pools and multiplies moved f32 bytes); max / min: exact.
 *        add / sub / div stay f32 (rounding operands before a cancelling sum loses more than
 *        rounding its result).
 */
static Bf16Read BinaryBf16Input(const NodeInfo& node, size_t k) {
  if (k == 2) return Bf16Read::kF32;  // the addend: a float32 post-op operand
  auto alg = node.attrs.find("algorithm");
  const std::string name =
      alg != node.attrs.end() ? std::string(alg->second.as<tvm::ffi::String>().value_or("")) : "";
  return name == "mul" || name == "max" || name == "min" ? Bf16Read::kLikeOutput : Bf16Read::kF32;
}

static KernelTraits BinaryTraits() {
  KernelTraits traits;
  traits.bf16_input = BinaryBf16Input;
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("binary", BuildBinary, BinaryTraits());

}  // namespace byoc_hetero
