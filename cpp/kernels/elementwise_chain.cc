/*!
 * \file kernels/elementwise_chain.cc
 * \brief elementwise_chain: a chain of element-wise float32 ops and the (de)quantizations between
 *        them, computed in one pass over the data (host kernel).
 *
 * What a QDQ transformer leaves between its int8 dense layers is element-wise work with a
 * quantize -> dequantize round trip after every op (quantize_static writes one around each Div,
 * Erf, Add and Mul of GELU and of the residual adds): as separate nodes, 11 passes over a
 * [128, 3072] tensor per GELU, a third of a 2-layer int8 BERT call (bench/INT8.md, session 3).
 * The pass fuse_elementwise_chains (byoc_hetero/backends/onednn/ops/qdq_chain.py) joins them into
 * this node; here each block of kBlock elements runs the whole program while it sits in L1.
 *
 * Inputs: the chain's tensors, of the output's shape (float32, or uint8 / int8 read by a
 * "dequantize" instruction), or float32 of the output's trailing dims after leading 1s (an
 * attention mask [1, 1, S, S] over [1, H, S, S]): element i of the output reads element i mod its
 * size (then every operand is read in the plain layout).  Attrs (one entry per instruction, in run order; instruction k writes
 * value k):
 *   ops          comma-separated: load (input lhs[k], float32), dequantize (input lhs[k], 8-bit,
 *                scales[k], zero_points[k]), requantize_u8 | requantize_s8 (value lhs[k] rounded to
 *                the grid of scales[k], zero_points[k]: ONNX's QuantizeLinear then DequantizeLinear),
 *                add | sub | mul | div (values lhs[k] op rhs[k]), const (scales[k]), erf (value lhs[k])
 *   lhs, rhs     integers (rhs unused but present for unary ops: -1)
 *   scales       floats, zero_points integers (0 where unused)
 *   out_scale, out_zero_point   when the output is uint8 / int8: the last value is quantized
 * Each op computes what its node computed, so the result is the same bits as the unfused nodes:
 * the (de)quantizations are kernels/quantize.cc's loops and erf is kernels/unary.cc's.
 */
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "int8.h"
#include "kernel.h"
#include "unary.h"

namespace byoc_hetero {

namespace {

enum class ChainOp { kLoad, kDequantize, kRequantize, kAdd, kSub, kMul, kDiv, kConst, kErf };

struct Instruction {
  ChainOp op = ChainOp::kLoad;
  int64_t lhs = -1, rhs = -1;
  float scale = 1.f;
  int32_t zero = 0;
  DType qtype = DType::kUInt8;  // of a dequantize's input or a requantize's grid
};

constexpr int64_t kBlock = 512;  // 2 KiB a value: a program of 16 values stays in L1

/*! \brief dst = a op b over n elements, cloned per ISA (the file is built for baseline x86-64:
 *         without the clones these loops run 4 floats a step). */
__attribute__((target_clones("avx512f", "avx2", "default"))) void Arith(ChainOp op, const float* a, const float* b,
                                                                         float* dst, int64_t n) {
  switch (op) {
    case ChainOp::kAdd:
      for (int64_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
      break;
    case ChainOp::kSub:
      for (int64_t i = 0; i < n; ++i) dst[i] = a[i] - b[i];
      break;
    case ChainOp::kMul:
      for (int64_t i = 0; i < n; ++i) dst[i] = a[i] * b[i];
      break;
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = a[i] / b[i];
      break;
  }
}

/*! \brief One block of \p n elements starting at \p begin: runs \p prog into \p regs (a value is
 *         kBlock floats), then writes the last value to \p out (quantized when \p q_out). */
/*! \brief \p n floats of a float32 input of \p size elements from element \p begin mod \p size: a
 *         pointer into it when they do not wrap, else copied, wrapping, into \p scratch. */
const float* LoadRepeating(const float* in, int64_t size, int64_t begin, int64_t n, float* scratch) {
  const int64_t at = begin % size;
  if (at + n <= size) return in + at;
  for (int64_t i = 0, j = at; i < n; ++i, j = j + 1 == size ? 0 : j + 1) scratch[i] = in[j];
  return scratch;
}

void RunBlock(const std::vector<Instruction>& prog, const std::vector<void*>& p, int64_t begin, int64_t n,
              float* regs, const float** vals, const Instruction* q_out) {
  for (size_t k = 0; k < prog.size(); ++k) {
    const Instruction& ins = prog[k];
    float* dst = regs + k * kBlock;
    const float* a = ins.lhs >= 0 && ins.op != ChainOp::kLoad && ins.op != ChainOp::kDequantize ? vals[ins.lhs] : nullptr;
    const bool binary = ins.op == ChainOp::kAdd || ins.op == ChainOp::kSub || ins.op == ChainOp::kMul ||
                        ins.op == ChainOp::kDiv;
    const float* b = binary ? vals[ins.rhs] : nullptr;
    vals[k] = dst;
    switch (ins.op) {
      case ChainOp::kLoad:  // read in place (ins.rhs: the input's size when it repeats)
        vals[k] = ins.rhs > 0 ? LoadRepeating(static_cast<const float*>(p[ins.lhs]), ins.rhs, begin, n, dst)
                              : static_cast<const float*>(p[ins.lhs]) + begin;
        break;
      case ChainOp::kDequantize:
        DequantizeSpan(static_cast<const uint8_t*>(p[ins.lhs]) + begin, dst, n, ins.scale, ins.zero, ins.qtype);
        break;
      case ChainOp::kRequantize:
        RoundTripSpan(a, dst, n, ins.scale, ins.zero, ins.qtype);
        break;
      case ChainOp::kAdd:
      case ChainOp::kSub:
      case ChainOp::kMul:
      case ChainOp::kDiv:
        Arith(ins.op, a, b, dst, n);
        break;
      case ChainOp::kConst:
        vals[k] = dst;  // filled once per thread (RunChain)
        break;
      case ChainOp::kErf:
        ErfRun(a, dst, n);
        break;
    }
  }
  const float* last = vals[prog.size() - 1];
  void* out = p.back();
  if (q_out != nullptr) {
    QuantizeSpan(last, static_cast<uint8_t*>(out) + begin, n, q_out->scale, q_out->zero, q_out->qtype);
  } else {
    std::memcpy(static_cast<float*>(out) + begin, last, n * sizeof(float));
  }
}

/*! \brief The whole tensor of \p numel elements, in blocks; one OpenMP team only when the work
 *         (elements x instructions) is at least twice the host Q/DQ steps' minimum (int8.cc says
 *         why there is one): a chain instruction costs about what a quantize costs an element, so
 *         an attention's scores chain ([12, 128, 128], 8 instructions, 0.47 ms on 1 thread) gets
 *         the team that its 196K elements alone were refused. */
void RunChain(const std::vector<Instruction>& prog, const std::vector<void*>& p, int64_t numel,
              const Instruction* q_out) {
  const int64_t blocks = (numel + kBlock - 1) / kBlock;
#pragma omp parallel if (numel * static_cast<int64_t>(prog.size()) >= 2 * ParallelMinimum())
  {
    std::vector<float> regs(prog.size() * kBlock);
    std::vector<const float*> vals(prog.size());
    for (size_t k = 0; k < prog.size(); ++k) {
      if (prog[k].op == ChainOp::kConst) std::fill_n(regs.data() + k * kBlock, kBlock, prog[k].scale);
    }
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kBlock;
      RunBlock(prog, p, begin, std::min(kBlock, numel - begin), regs.data(), vals.data(), q_out);
    }
  }
}

/*!
 * \brief Whether the chain is a function of one byte: its only input is 8-bit, read by dequantize
 *        instructions alone, and its output is 8-bit (a QDQ transformer's GELU between two int8
 *        dense layers, once ops/qdq_views.py moved the reshapes off its ends).
 */
bool OneByteFunction(const KernelContext& ctx, const std::vector<Instruction>& prog, const Instruction* q_out) {
  if (q_out == nullptr || ctx.node().inputs.size() != 1 || !IsInt8(ctx.input(0).dtype)) return false;
  return std::none_of(prog.begin(), prog.end(), [](const Instruction& ins) { return ins.op == ChainOp::kLoad; });
}

/*!
 * \brief The chain's output bits for each of the 256 input values (value lo + k at k), computed
 *        by RunChain itself: the table holds exactly what the chain writes for that byte. Why: a
 *        GELU chain of 15 instructions cost ~7 ns an element over [128, 3072] (2-layer BERT-base,
 *        1 thread, loaded: 2.9 ms a layer against 0.5 ms for the int8 dense before it); a lookup is
 *        64 elements an instruction with AVX-512 VBMI (kernels/lookup.cc).
 */
std::array<uint8_t, 256> Tabulate(const std::vector<Instruction>& prog, DType in, const Instruction& q_out) {
  std::array<uint8_t, 256> values{}, bytes{};
  for (int k = 0; k < 256; ++k) {
    values[k] = in == DType::kUInt8 ? static_cast<uint8_t>(k) : static_cast<uint8_t>(static_cast<int8_t>(k - 128));
  }
  RunChain(prog, {values.data(), bytes.data()}, 256, &q_out);
  return bytes;
}

std::vector<std::string> SplitNames(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

ChainOp ParseOp(AttrReader& attrs, const std::string& name, DType* qtype) {
  static const std::vector<std::pair<std::string, ChainOp>> kOps = {
      {"load", ChainOp::kLoad}, {"dequantize", ChainOp::kDequantize}, {"requantize_u8", ChainOp::kRequantize},
      {"requantize_s8", ChainOp::kRequantize}, {"add", ChainOp::kAdd}, {"sub", ChainOp::kSub},
      {"mul", ChainOp::kMul}, {"div", ChainOp::kDiv}, {"const", ChainOp::kConst}, {"erf", ChainOp::kErf}};
  for (const auto& [n, op] : kOps) {
    if (n == name) {
      if (name == "requantize_s8") *qtype = DType::kInt8;
      return op;
    }
  }
  attrs.Fail("ops", "unknown instruction '" + name + "' (load, dequantize, requantize_u8, requantize_s8, add, "
                    "sub, mul, div, const, erf)");
}

/*! \brief Check one instruction's operands against the node's inputs and the values before it. */
void CheckInstruction(const KernelContext& ctx, AttrReader& attrs, Instruction& ins, size_t k) {
  const auto value = [&](int64_t v, const char* key) {
    if (v < 0 || v >= static_cast<int64_t>(k)) {
      attrs.Fail(key, "instruction " + std::to_string(k) + " reads value " + std::to_string(v) +
                          "; it may read the values 0.." + std::to_string(static_cast<int64_t>(k) - 1));
    }
  };
  const bool reads_input = ins.op == ChainOp::kLoad || ins.op == ChainOp::kDequantize;
  if (reads_input) {
    if (ins.lhs < 0 || ins.lhs >= static_cast<int64_t>(ctx.node().inputs.size())) {
      attrs.Fail("lhs", "instruction " + std::to_string(k) + " reads input " + std::to_string(ins.lhs) + " of " +
                            std::to_string(ctx.node().inputs.size()));
    }
    const DType dt = ctx.input(ins.lhs).dtype;
    if (ins.op == ChainOp::kLoad ? dt != DType::kFloat32 : !IsInt8(dt)) {
      ctx.Fail("instruction " + std::to_string(k) + " reads input " + std::to_string(ins.lhs) + " of dtype " +
               DTypeName(dt) + (ins.op == ChainOp::kLoad ? "; load reads float32" : "; dequantize reads 8-bit"));
    }
    ins.qtype = dt;
  } else if (ins.op != ChainOp::kConst) {
    value(ins.lhs, "lhs");
  }
  if (ins.op == ChainOp::kAdd || ins.op == ChainOp::kSub || ins.op == ChainOp::kMul || ins.op == ChainOp::kDiv) {
    value(ins.rhs, "rhs");
  } else {
    ins.rhs = -1;
  }
}

void CheckQParams(AttrReader& attrs, const Instruction& ins, const char* key) {
  if (!(ins.scale > 0.f) || ins.scale == std::numeric_limits<float>::infinity()) {
    attrs.Fail(key, "a scale must be finite and > 0, got " + std::to_string(ins.scale));
  }
  const int32_t lo = ins.qtype == DType::kUInt8 ? 0 : -128, hi = ins.qtype == DType::kUInt8 ? 255 : 127;
  if (ins.zero < lo || ins.zero > hi) {
    attrs.Fail(key, "zero point " + std::to_string(ins.zero) + " is outside " + DTypeName(ins.qtype));
  }
}

std::vector<Instruction> ReadProgram(const KernelContext& ctx, AttrReader& attrs) {
  const std::vector<std::string> names = SplitNames(attrs.Str("ops", ""));
  if (names.empty()) attrs.Fail("ops", "required: the chain's instructions");
  const size_t n = names.size();
  const std::vector<int64_t> lhs = attrs.Ints("lhs", n, {}), rhs = attrs.Ints("rhs", n, {});
  const std::vector<double> scales = attrs.Floats("scales", n, {});
  const std::vector<int64_t> zeros = attrs.Ints("zero_points", n, {});
  if (lhs.empty() || rhs.empty() || scales.empty() || zeros.empty()) {
    attrs.Fail("lhs", "lhs, rhs, scales and zero_points are required, one entry per instruction");
  }
  std::vector<Instruction> prog(n);
  for (size_t k = 0; k < n; ++k) {
    Instruction& ins = prog[k];
    ins.op = ParseOp(attrs, names[k], &ins.qtype);
    ins.lhs = lhs[k];
    ins.rhs = rhs[k];
    ins.scale = static_cast<float>(scales[k]);
    ins.zero = static_cast<int32_t>(zeros[k]);
    CheckInstruction(ctx, attrs, ins, k);
    if (ins.op == ChainOp::kDequantize || ins.op == ChainOp::kRequantize) CheckQParams(attrs, ins, "scales");
  }
  return prog;
}

/*!
 * \brief The layout every operand is read and written in: the producer's layout of input 0 when it
 *        is a strided one without blocks (the int8 convs' NHWC) and every input has the output's
 *        dims, so an element-wise chain between two such convs costs no relayout; else plain.
 */
memory::dims ChainStrides(const KernelContext& ctx) {
  const memory::dims dims(ctx.output().shape.begin(), ctx.output().shape.end());
  const memory::desc in = ctx.InputLayout(0);
  if (in.get_format_kind() == dnnl::memory::format_kind::blocked && in.get_inner_nblks() == 0 &&
      in.get_padded_dims() == in.get_dims() && in.get_dims() == dims) {
    const memory::dims strides = in.get_strides();
    if (in.get_size() == PlainDescOf(ctx.input(0)).get_size()) return strides;
  }
  return PlainDesc(dims).get_strides();
}

/*! \brief Each input's plain layout: the view the chain reads it under (its logical dims). */
std::vector<memory::desc> PlainInputs(const KernelContext& ctx) {
  std::vector<memory::desc> inputs;
  for (size_t k = 0; k < ctx.node().inputs.size(); ++k) inputs.push_back(PlainDescOf(ctx.input(k)));
  return inputs;
}

/*!
 * \brief Read every input of the output's shape, and write the output, in \p strides (ChainStrides):
 *        the element-wise program does not care where an element sits as long as all operands
 *        agree.  Those are the layouts the chain *wants*; each input's *view* stays its plain layout,
 *        so the planner reorders an input stored otherwise (a permute's plain output next to an int8
 *        conv's NHWC one) instead of reading its plain bytes as if they were NHWC (issue 35:
 *        int8 ConvNeXt-T's stage-2 residual sum, whose permuted operand was read scrambled).
 */
void FollowStrides(const KernelContext& ctx, const memory::dims& strides, HostKernel* kernel) {
  const memory::dims dims(ctx.output().shape.begin(), ctx.output().shape.end());
  if (strides == PlainDesc(dims).get_strides()) return;
  for (size_t k = 0; k < ctx.node().inputs.size(); ++k) {
    if (ctx.input(k).shape == ctx.output().shape) {
      kernel->ReadInputIn(k, memory::desc(dims, DnnlType(ctx.input(k).dtype), strides));
    }
  }
  kernel->FollowLayout(kernel->inputs()[0].want, memory::desc(dims, DnnlType(ctx.output().dtype), strides));
}

/*! \brief Whether \p in repeats whole over \p out: \p out's trailing dims after leading 1s. */
bool RepeatsOver(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  if (in.empty() || in.size() > out.size()) return false;
  size_t k = 0;
  while (k < in.size() && in[k] == 1) ++k;  // leading 1s broadcast: drop them
  return std::equal(in.begin() + k, in.end(), out.end() - (in.size() - k));
}

/*! \brief Check the inputs' shapes; whether one of them repeats (then every operand is read plain). */
bool CheckChainInputs(const KernelContext& ctx, std::vector<Instruction>& prog) {
  const std::vector<int64_t>& shape = ctx.output().shape;
  bool repeats = false;
  for (size_t k = 0; k < ctx.node().inputs.size(); ++k) {
    const bool same = ctx.input(k).shape == shape;
    if (!same && !(ctx.input(k).dtype == DType::kFloat32 && RepeatsOver(ctx.input(k).shape, shape))) {
      ctx.Fail("input " + std::to_string(k) + " is " + ShapeToString(ctx.input(k).shape) +
               "; an input of a chain has the output's shape " + ShapeToString(shape) +
               " or, float32, its trailing dims after leading 1s");
    }
    repeats |= !same;
  }
  for (Instruction& ins : prog) {
    if (ins.op == ChainOp::kLoad && ctx.input(ins.lhs).shape != shape) ins.rhs = ctx.input(ins.lhs).numel();
    if (ins.op == ChainOp::kDequantize && ctx.input(ins.lhs).shape != shape) {
      ctx.Fail("input " + std::to_string(ins.lhs) + " is dequantized but does not have the output's shape");
    }
  }
  return repeats;
}

}  // namespace

static std::unique_ptr<Kernel> BuildElementwiseChain(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const std::vector<int64_t>& shape = ctx.output().shape;
  std::vector<Instruction> prog = ReadProgram(ctx, attrs);
  const bool repeats = CheckChainInputs(ctx, prog);
  std::unique_ptr<Instruction> q_out;
  const DType out = ctx.output().dtype;
  if (IsInt8(out)) {
    q_out = std::make_unique<Instruction>();
    q_out->qtype = out;
    q_out->scale = static_cast<float>(attrs.Float("out_scale", 0.0));
    q_out->zero = static_cast<int32_t>(attrs.Int("out_zero_point", 0));
    CheckQParams(attrs, *q_out, "out_scale");
  } else if (out != DType::kFloat32) {
    ctx.Fail(std::string("the output must be float32, uint8 or int8, got ") + DTypeName(out));
  }
  attrs.CheckNoUnknown();
  const memory::dims dims(shape.begin(), shape.end());
  const memory::dims strides = repeats ? PlainDesc(dims).get_strides() : ChainStrides(ctx);
  const int64_t numel = ctx.output().numel();
  std::unique_ptr<HostKernel> kernel;
  if (OneByteFunction(ctx, prog, q_out.get())) {
    HostFn fn = TableLookupFn(ctx.input(0).dtype, out, Tabulate(prog, ctx.input(0).dtype, *q_out), numel);
    kernel = std::make_unique<HostKernel>(ctx.where() + " as a 256-entry table", "elementwise_chain", std::move(fn),
                                          PlainInputs(ctx), PlainDescOf(ctx.output()));
  } else {
    std::shared_ptr<const Instruction> quantized(std::move(q_out));
    HostFn fn = [prog = std::move(prog), quantized, numel](const std::vector<void*>& p) {
      RunChain(prog, p, numel, quantized.get());
    };
    kernel = std::make_unique<HostKernel>(ctx.where(), "elementwise_chain", std::move(fn), PlainInputs(ctx),
                                          PlainDescOf(ctx.output()));
  }
  FollowStrides(ctx, strides, kernel.get());
  return kernel;
}

static KernelTraits ChainTraits() {
  KernelTraits traits;
  traits.accepts_int8 = true;  // dequantizes 8-bit inputs and may quantize its output
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("elementwise_chain", BuildElementwiseChain, ChainTraits());

}  // namespace byoc_hetero
