/*!
 * \file kernels/kernel.cc
 * \brief Shared kernel helpers and the op registry (filled by BYOC_HETERO_REGISTER_KERNEL).
 */
#include "kernel.h"

#include "env_switch.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <numeric>
#include <sstream>
#include <utility>

namespace byoc_hetero {

// ---------------------------------------------------------------------------------------------
// Registry

namespace {
/*! \brief What an op registered: its kernel's builder and traits. */
struct RegisteredKernel {
  KernelBuilder builder;
  KernelTraits traits;
};

/*! \brief op -> its kernel; filled by the registrars while the library loads, read-only afterwards. */
std::map<std::string, RegisteredKernel>& Registry() {
  static std::map<std::string, RegisteredKernel> registry;
  return registry;
}
}  // namespace

KernelRegistrar::KernelRegistrar(const char* op, KernelBuilder builder, KernelTraits traits) {
  if (!Registry().emplace(op, RegisteredKernel{builder, traits}).second) {
    std::fprintf(stderr, "byoc_hetero: two kernels registered for op '%s'\n", op);
    std::abort();
  }
}

KernelBuilder FindKernelBuilder(const std::string& op) {
  auto it = Registry().find(op);
  return it == Registry().end() ? nullptr : it->second.builder;
}

const KernelTraits& FindKernelTraits(const std::string& op) {
  static const KernelTraits kNone;
  auto it = Registry().find(op);
  return it == Registry().end() ? kNone : it->second.traits;
}

Bf16Read Bf16ReadLikeOutput(const NodeInfo& /*node*/, size_t /*k*/) { return Bf16Read::kLikeOutput; }
bool StridedReadsOn() {
  const char* knob = std::getenv("BYOC_HETERO_SLICE_VIEWS");
  return knob != nullptr && std::string(knob) == "on";
}

StridedRead StridedPassesOn(const NodeInfo& /*node*/, size_t /*k*/) { return StridedRead::kPassesOn; }

std::vector<std::string> SupportedOps() {
  std::vector<std::string> ops;
  for (const auto& entry : Registry()) ops.push_back(entry.first);
  return ops;
}

// ---------------------------------------------------------------------------------------------
// Descriptors

memory::desc PlainDesc(const memory::dims& shape) {
  const memory::dims dims = shape.empty() ? memory::dims{1} : shape;  // a scalar is one element
  memory::dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  return memory::desc(dims, memory::data_type::f32, strides);
}

memory::desc PlainDescOf(const TensorInfo& tensor) {
  const memory::desc f32 = PlainDesc(tensor.shape);
  memory::data_type type = memory::data_type::f32;
  switch (tensor.dtype) {
    case DType::kInt64:
      type = memory::data_type::f64;
      break;
    case DType::kInt32:
      type = memory::data_type::s32;
      break;
    case DType::kBool:
    case DType::kUInt8:
      type = memory::data_type::u8;
      break;
    case DType::kInt8:
      type = memory::data_type::s8;
      break;
    case DType::kFloat16:
      type = memory::data_type::f16;
      break;
    default:
      return f32;
  }
  return memory::desc(f32.get_dims(), type, f32.get_strides());
}

memory::desc StridedDesc(const memory::dims& dims, const memory::dims& strides) {
  return memory::desc(dims, memory::data_type::f32, strides);
}

memory::desc AnyDesc(const memory::dims& dims, memory::data_type dt) {
  return memory::desc(dims, dt, memory::format_tag::any);
}

memory::desc WithType(const memory::desc& md, memory::data_type dt) {
  return memory::desc(md.get_dims(), dt, md.get_strides());
}

dnnl::matmul::primitive_desc MatmulForConstantWeight(
    const std::function<dnnl::matmul::primitive_desc(const memory::desc&)>& make, const memory::dims& wei_dims) {
  dnnl::matmul::primitive_desc pd = make(AnyDesc(wei_dims));
  if (std::string(pd.impl_info_str()).rfind("gemm:", 0) != 0 || wei_dims.size() < 2) return pd;
  // Row-major strides with the last two dims swapped.
  const size_t r = wei_dims.size();
  memory::dims strides(r);
  strides[r - 2] = 1;
  strides[r - 1] = wei_dims[r - 2];
  int64_t step = wei_dims[r - 2] * wei_dims[r - 1];
  for (size_t i = r - 2; i-- > 0;) {
    strides[i] = step;
    step *= wei_dims[i];
  }
  return make(StridedDesc(wei_dims, strides));
}

std::string DescribeDesc(const memory::desc& md) {
  std::ostringstream os;
  const memory::dims dims = md.get_dims();
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? "," : "") << dims[i];
  os << "]:";
  if (md.get_format_kind() != memory::format_kind::blocked) {
    os << (md.get_format_kind() == memory::format_kind::any ? "any" : "opaque");
    return os.str();
  }
  // Outer dims ordered by decreasing stride; blocked dims in upper case; inner blocks appended.
  const memory::dims strides = md.get_strides();
  const memory::dims blks = md.get_inner_blks();
  const memory::dims idxs = md.get_inner_idxs();
  std::vector<int> order(dims.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return strides[a] > strides[b]; });
  std::vector<bool> blocked(dims.size(), false);
  for (auto idx : idxs) blocked[idx] = true;
  for (int d : order) os << static_cast<char>((blocked[d] ? 'A' : 'a') + d);
  for (size_t i = 0; i < blks.size(); ++i) os << blks[i] << static_cast<char>('a' + idxs[i]);
  if (md.get_data_type() == memory::data_type::bf16) os << ":bf16";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// KernelContext

void KernelContext::Fail(const std::string& message) const {
  TVM_FFI_THROW(ValueError) << where() << ": " << message;
  TVM_FFI_UNREACHABLE();
}

void KernelContext::ExpectInputCount(size_t expected, const std::string& what) const {
  if (node().inputs.size() != expected) {
    Fail("expected " + std::to_string(expected) + " inputs (" + what + "), got " +
         std::to_string(node().inputs.size()));
  }
}

void KernelContext::ExpectRank(size_t k, const char* name, size_t rank) const {
  if (input(k).shape.size() != rank) {
    Fail(std::string(name) + " (tensor " + std::to_string(node().inputs[k]) + ") must be " +
         std::to_string(rank) + "-D, got shape " + ShapeToString(input(k).shape));
  }
}

void KernelContext::ExpectOutputShape(const std::vector<int64_t>& produced) const {
  if (output().shape != produced) {
    Fail("output tensor " + std::to_string(node().output) + " is declared with shape " +
         ShapeToString(output().shape) + " but the op produces " + ShapeToString(produced));
  }
}

void KernelContext::ExpectInputShape(size_t k, const char* name,
                                     const std::vector<int64_t>& shape) const {
  if (input(k).shape != shape) {
    Fail(std::string(name) + " (tensor " + std::to_string(node().inputs[k]) + ") must have shape " +
         ShapeToString(shape) + ", got " + ShapeToString(input(k).shape));
  }
}

memory::desc KernelContext::InputLayout(size_t k) const {
  const memory::dims dims(input(k).shape.begin(), input(k).shape.end());
  if (k < input_storage.size()) {
    const memory::desc& md = input_storage[k];
    if (md.get_ndims() == static_cast<int>(dims.size()) && md.get_dims() == dims) return md;
  }
  return PlainDesc(dims);
}

double ReadEpsilon(AttrReader& attrs) {
  if (!attrs.Has("epsilon")) attrs.Fail("epsilon", "missing (required)");
  const double eps = attrs.Float("epsilon", 0.0);
  if (!(eps >= 0.0) || !std::isfinite(eps)) attrs.Fail("epsilon", "must be a finite number >= 0");
  return eps;
}

namespace {
/*! \brief Whether oneDNN's effective ISA here is one of \p isas. */
bool IsaIn(std::initializer_list<dnnl::cpu_isa> isas) {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return std::find(isas.begin(), isas.end(), isa) != isas.end();
}
}  // namespace

bool IsaHasAvx512() {
  using i = dnnl::cpu_isa;
  return IsaIn({i::avx512_core, i::avx512_core_vnni, i::avx512_core_bf16, i::avx512_core_fp16, i::avx512_core_amx,
                i::avx512_core_amx_fp16});
}

bool Bf16Native() {
  using i = dnnl::cpu_isa;
  return IsaIn({i::avx512_core_bf16, i::avx512_core_fp16, i::avx512_core_amx, i::avx512_core_amx_fp16});
}

std::string EffectivePrecision(const std::string& requested, std::string* reason) {
  if (reason != nullptr) reason->clear();
  if (requested != kPrecisionBf16) return kPrecisionF32;
  if (!EnvSwitch("BYOC_HETERO_BF16", "auto", "off", true)) {
    if (reason != nullptr) *reason = "bf16 switched off (BYOC_HETERO_BF16=off)";
    return kPrecisionF32;
  }
  if (!Bf16Native()) {
    if (reason != nullptr) *reason = "the CPU has no native bf16 (oneDNN ISA below avx512_core_bf16)";
    return kPrecisionF32;
  }
  return kPrecisionBf16;
}

std::string RequestedNodePrecision(const RegionGraph& g, size_t n) {
  const auto& attrs = g.nodes[n].attrs;
  auto it = attrs.find("precision");
  if (it == attrs.end()) return g.precision;
  auto s = it->second.as<tvm::ffi::String>();
  return s.has_value() && std::string(*s) == kPrecisionBf16 ? kPrecisionBf16 : kPrecisionF32;
}

bool NodeComputesBf16(const RegionGraph& g, size_t n) {
  return EffectivePrecision(RequestedNodePrecision(g, n)) == kPrecisionBf16;
}

std::string ReadNodePrecision(const KernelContext& ctx, AttrReader& attrs) {
  return attrs.Choice("precision", {kPrecisionF32, kPrecisionBf16}, ctx.graph.precision);
}

namespace {
/*!
 * \brief Whether tensor t (written by node `producer`) is read only where a bf16 region rounds it
 *        to bf16 anyway, so that storing it rounded saves the reorders: every reader's kernel
 *        declares (KernelTraits::bf16_input) that it rounds that input to bf16 (kRounds: the data
 *        of a conv2d, the operands of a dense or a matmul), or that it reads it like its own output
 *        (kLikeOutput) and its output qualifies in turn.  Through a reshape (the same bytes), a
 *        permute (a bf16 -> bf16 reorder) or a max pool (the max of rounded values is the rounded
 *        max) no number changes; the other kLikeOutput readers round earlier than f32 would, each
 *        for a reason and within a bound given where it declares the trait (conv2d.cc: the
 *        residual stream; eltwise.cc, pool2d.cc, binary.cc: a squeeze-excitation block).
 */
bool OnlyConvsRead(const RegionGraph& g, size_t producer, int t) {
  if (std::find(g.outputs.begin(), g.outputs.end(), t) != g.outputs.end()) return false;
  bool read = false;
  for (size_t n = producer + 1; n < g.nodes.size(); ++n) {
    const NodeInfo& node = g.nodes[n];
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      if (node.inputs[k] != t) continue;
      // a reader kept f32 (its own precision attr: a tuner's decision) reads the f32 value
      const Bf16Read how = NodeComputesBf16(g, n) ? FindKernelTraits(node.op).Bf16Input(node, k) : Bf16Read::kF32;
      const bool ok = how == Bf16Read::kRounds || (how == Bf16Read::kLikeOutput && OnlyConvsRead(g, n, node.output));
      if (!ok) return false;
      read = true;
    }
  }
  return read;
}
}  // namespace

bool OutputOnlyFeedsBf16Convs(const KernelContext& ctx) {
  return ctx.bf16 && OnlyConvsRead(ctx.graph, ctx.node_index, ctx.node().output);
}

memory::desc Bf16OutputIfRounded(const KernelContext& ctx, const memory::desc& plain) {
  return OutputOnlyFeedsBf16Convs(ctx) ? WithType(plain, memory::data_type::bf16) : plain;
}

std::optional<memory::format_tag> ChannelBlockedTag(const memory::desc& md) {
  if (md.get_ndims() != 4 || md.get_data_type() != memory::data_type::f32) return std::nullopt;
  for (memory::format_tag tag : {memory::format_tag::aBcd8b, memory::format_tag::aBcd16b}) {
    if (md == memory::desc(md.get_dims(), memory::data_type::f32, tag)) return tag;
  }
  return std::nullopt;
}

Activation KernelContext::ReadActivation(AttrReader& attrs, const char* key,
                                         const char* clip_key) const {
  Activation a;
  a.name = attrs.Choice(key, ActivationNames(), "none");
  const ActivationSpec& spec = *FindEnum(Activations(), a.name);
  a.alg = spec.alg;
  a.alpha = spec.alpha;
  a.beta = spec.beta;
  if (spec.bounded) {
    if (!attrs.Has(clip_key)) attrs.Fail(clip_key, std::string("missing (required when ") + key + " is \"clip\")");
    std::vector<double> bounds = attrs.Floats(clip_key, 2, {});
    if (!std::isfinite(bounds[0]) || !std::isfinite(bounds[1]) || bounds[0] > bounds[1]) {
      attrs.Fail(clip_key, "expected finite [min, max] with min <= max");
    }
    a.alpha = static_cast<float>(bounds[0]);
    a.beta = static_cast<float>(bounds[1]);
  } else if (attrs.Has(clip_key)) {
    attrs.Fail(clip_key, std::string("only allowed when ") + key + " is \"clip\"");
  }
  return a;
}

Epilogue KernelContext::ReadEpilogue(AttrReader& attrs) const {
  Epilogue e;
  e.act = ReadActivation(attrs, "activation", "clip");
  e.residual = attrs.Flag("residual", false);
  e.post_act = ReadActivation(attrs, "post_activation", "post_clip");
  if (!e.residual && !e.post_act.none()) {
    attrs.Fail("post_activation", "needs residual = 1 (it applies after the residual sum)");
  }
  return e;
}

dnnl::primitive_attr KernelContext::MakeAttr(const Epilogue& e) const {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (e.scale != 1.f) ops.append_eltwise(dnnl::algorithm::eltwise_linear, e.scale, 0.f);
  if (!e.act.none()) ops.append_eltwise(e.act.alg, e.act.alpha, e.act.beta);
  if (!e.gate.empty()) ops.append_binary(dnnl::algorithm::binary_mul, PlainDesc(e.gate));  // at gate_post_op()
  if (e.residual) ops.append_sum(1.f);
  if (!e.post_act.none()) ops.append_eltwise(e.post_act.alg, e.post_act.alpha, e.post_act.beta);
  if (ops.len() > 0) attr.set_post_ops(ops);
  return attr;
}

// ---------------------------------------------------------------------------------------------
// Kernels

PrimitiveKernel::PrimitiveKernel(std::string label, std::string op, dnnl::primitive_desc_base pd,
                                 std::vector<int> input_args, std::vector<OperandLayout> inputs,
                                 OperandLayout output, int sum_input)
    : label_(std::move(label)),
      op_(std::move(op)),
      pd_(std::move(pd)),
      input_args_(std::move(input_args)) {
  inputs_ = std::move(inputs);
  output_ = std::move(output);
  sum_input_ = sum_input;
}

std::unique_ptr<Kernel> MakeAnchorKernel(const KernelContext& ctx, const char* op,
                                         dnnl::primitive_desc_base pd, const memory::desc& src_view,
                                         const memory::desc& wei_view, const memory::dims& bias_dims,
                                         bool has_bias, const memory::dims& dst_dims,
                                         const Epilogue& epilogue) {
  std::vector<OperandLayout> inputs{{src_view, pd.src_desc(0)}, {wei_view, pd.weights_desc(0)}};
  std::vector<int> args{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS};
  if (has_bias) {
    inputs.push_back({PlainDesc(bias_dims), pd.weights_desc(1)});
    args.push_back(DNNL_ARG_BIAS);
  }
  if (!epilogue.gate.empty()) {
    inputs.push_back({PlainDesc(epilogue.gate), PlainDesc(epilogue.gate)});
    args.push_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(epilogue.gate_post_op()) | DNNL_ARG_SRC_1);
  }
  OperandLayout output{PlainDesc(dst_dims), pd.dst_desc(0)};
  int sum_input = -1;
  if (epilogue.residual) {
    sum_input = static_cast<int>(inputs.size());
    inputs.push_back(output);
    args.push_back(0);
  }
  return std::make_unique<PrimitiveKernel>(ctx.where(), op, std::move(pd), std::move(args),
                                           std::move(inputs), std::move(output), sum_input);
}

std::vector<Step> PrimitiveKernel::Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                                        const std::vector<MemRef>& /*temps*/) const {
  Step step;
  step.pd = pd_;
  step.label = label_;
  step.op = op_;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (input_args_[k] != 0) step.args.emplace_back(input_args_[k], BoundInput(k, inputs[k]));
  }
  step.args.emplace_back(DNNL_ARG_DST, output);
  return {std::move(step)};
}

void Kernel::HandOverStored(size_t k, const memory::desc& plain, const memory::desc& stored) {
  if (bound_.size() < inputs_.size()) bound_.resize(inputs_.size());
  bound_.at(k) = inputs_.at(k).want;
  inputs_[k] = {plain, stored};
}

HostKernel::HostKernel(std::string label, std::string op, HostFn fn,
                       std::vector<memory::desc> inputs, memory::desc output)
    : label_(std::move(label)), op_(std::move(op)), fn_(std::move(fn)) {
  for (auto& md : inputs) inputs_.push_back({md, md});
  output_ = {output, output};
}

std::vector<Step> HostKernel::Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                                   const std::vector<MemRef>& /*temps*/) const {
  Step step;
  step.host = fn_;
  step.label = label_;
  step.op = op_;
  for (size_t k = 0; k < inputs.size(); ++k) step.args.emplace_back(static_cast<int>(k), inputs[k]);
  step.args.emplace_back(static_cast<int>(inputs.size()), output);
  return {std::move(step)};
}

void HostKernel::FollowLayout(const memory::desc& input, const memory::desc& output) {
  inputs_.at(0).want = input;
  output_.want = output;
}

void HostKernel::ReadInputIn(size_t k, const memory::desc& want) { inputs_.at(k).want = want; }

AliasKernel::AliasKernel(memory::desc input_view, memory::desc output_view) {
  inputs_.push_back({input_view, input_view});
  output_ = {output_view, output_view};
  alias_input_ = 0;
}

}  // namespace byoc_hetero
