/*!
 * \file kernels/kernel.cc
 * \brief Shared kernel helpers and the op registry.
 */
#include "kernel.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <numeric>
#include <sstream>
#include <utility>

namespace byoc_hetero {

// ---------------------------------------------------------------------------------------------
// Registry: add new ops here (one line each).

namespace {
struct RegistryEntry {
  const char* op;
  KernelBuilder builder;
};
constexpr RegistryEntry kRegistry[] = {
    {"conv2d", &BuildConv2D},
    {"dense", &BuildDense},
};
}  // namespace

KernelBuilder FindKernelBuilder(const std::string& op) {
  for (const auto& e : kRegistry) {
    if (op == e.op) return e.builder;
  }
  return nullptr;
}

std::vector<std::string> SupportedOps() {
  std::vector<std::string> ops;
  for (const auto& e : kRegistry) ops.emplace_back(e.op);
  return ops;
}

// ---------------------------------------------------------------------------------------------
// Descriptors

memory::desc PlainDesc(const memory::dims& dims) {
  memory::dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  return memory::desc(dims, memory::data_type::f32, strides);
}

memory::desc StridedDesc(const memory::dims& dims, const memory::dims& strides) {
  return memory::desc(dims, memory::data_type::f32, strides);
}

memory::desc AnyDesc(const memory::dims& dims) {
  return memory::desc(dims, memory::data_type::f32, memory::format_tag::any);
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

Activation KernelContext::ReadActivation(AttrReader& attrs) const {
  return attrs.Choice("activation", {"none", "relu"}, "none") == "relu" ? Activation::kRelu
                                                                        : Activation::kNone;
}

dnnl::primitive_attr KernelContext::MakeAttr(Activation act) const {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (act == Activation::kRelu) {
    dnnl::post_ops ops;
    ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(ops);
  }
  return attr;
}

// ---------------------------------------------------------------------------------------------
// PrimitiveKernel

PrimitiveKernel::PrimitiveKernel(std::string label, dnnl::primitive_desc_base pd,
                                 std::vector<int> input_args, std::vector<OperandLayout> inputs,
                                 OperandLayout output)
    : label_(std::move(label)), pd_(std::move(pd)), input_args_(std::move(input_args)) {
  inputs_ = std::move(inputs);
  output_ = std::move(output);
}

std::vector<Step> PrimitiveKernel::Bind(const std::vector<memory>& inputs,
                                        const memory& output) const {
  Step step;
  step.pd = pd_;
  step.label = label_;
  for (size_t k = 0; k < inputs.size(); ++k) step.args[input_args_[k]] = inputs[k];
  step.args[DNNL_ARG_DST] = output;
  return {std::move(step)};
}

}  // namespace byoc_hetero
