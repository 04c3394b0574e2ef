/*!
 * \file enums.cc
 * \brief The tables of enums.h.
 */
#include "enums.h"

namespace byoc_hetero {

using dnnl::algorithm;

const std::vector<EnumEntry<ActivationSpec>>& Activations() {
  // oneDNN 3.2 eltwise semantics (alpha, beta): hardswish x * max(0, min(1, alpha*x + beta)),
  // hardsigmoid max(0, min(1, alpha*x + beta)), linear alpha*x + beta, pow alpha * x^beta.
  // oneDNN has no erf on its own, so "erf" is not here (a host kernel, kernels/unary.cc).
  static const std::vector<EnumEntry<ActivationSpec>> table = {
      {"none", {algorithm::undef, 0.f, 0.f, false}},
      {"relu", {algorithm::eltwise_relu, 0.f, 0.f, false}},
      {"clip", {algorithm::eltwise_clip, 0.f, 0.f, true}},
      {"sigmoid", {algorithm::eltwise_logistic, 0.f, 0.f, false}},
      {"tanh", {algorithm::eltwise_tanh, 0.f, 0.f, false}},
      {"gelu_erf", {algorithm::eltwise_gelu_erf, 0.f, 0.f, false}},
      {"gelu_tanh", {algorithm::eltwise_gelu_tanh, 0.f, 0.f, false}},
      {"silu", {algorithm::eltwise_swish, 1.f, 0.f, false}},  // x * sigmoid(alpha * x), alpha = 1
      {"hardswish", {algorithm::eltwise_hardswish, 1.f / 6.f, 0.5f, false}},  // x * relu6(x + 3) / 6
      {"hardsigmoid", {algorithm::eltwise_hardsigmoid, 1.f / 6.f, 0.5f, false}},  // relu6(x + 3) / 6
      {"sqrt", {algorithm::eltwise_sqrt, 0.f, 0.f, false}},
      {"rsqrt", {algorithm::eltwise_pow, 1.f, -0.5f, false}},
      {"exp", {algorithm::eltwise_exp, 0.f, 0.f, false}},
      {"log", {algorithm::eltwise_log, 0.f, 0.f, false}},
      {"abs", {algorithm::eltwise_abs, 0.f, 0.f, false}},
      {"negative", {algorithm::eltwise_linear, -1.f, 0.f, false}},
      {"square", {algorithm::eltwise_square, 0.f, 0.f, false}},
      {"cube", {algorithm::eltwise_pow, 1.f, 3.f, false}},  // alpha * x^beta
  };
  return table;
}

const std::vector<EnumEntry<algorithm>>& PoolAlgorithms() {
  static const std::vector<EnumEntry<algorithm>> table = {
      {"max", algorithm::pooling_max},
      {"avg_include_padding", algorithm::pooling_avg_include_padding},
      {"avg_exclude_padding", algorithm::pooling_avg_exclude_padding},
  };
  return table;
}

const std::vector<EnumEntry<algorithm>>& BinaryAlgorithms() {
  static const std::vector<EnumEntry<algorithm>> table = {
      {"add", algorithm::binary_add},
      {"mul", algorithm::binary_mul},
      {"sub", algorithm::binary_sub},
      {"div", algorithm::binary_div},
      {"max", algorithm::binary_max},
      {"min", algorithm::binary_min},
  };
  return table;
}

const std::vector<EnumEntry<bool>>& DenseWeightLayouts() {
  static const std::vector<EnumEntry<bool>> table = {{"KN", false}, {"NK", true}};
  return table;
}

std::vector<std::string> ActivationNames() { return EnumNamesOf(Activations()); }

std::map<std::string, std::vector<std::string>> EnumNames() {
  return {
      {"activation", ActivationNames()},
      {"pool_algorithm", EnumNamesOf(PoolAlgorithms())},
      {"binary_algorithm", EnumNamesOf(BinaryAlgorithms())},
      {"dense_weight_layout", EnumNamesOf(DenseWeightLayouts())},
  };
}

}  // namespace byoc_hetero
