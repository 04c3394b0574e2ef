/*!
 * \file enums.h
 * \brief The string enums of the region format, defined once.
 *
 * Each table maps the names the region document uses (docs/region-format.md) to what the runtime
 * does with them.  The kernels read their attrs against these tables, the bench module builds its
 * primitives from them, and byoc_hetero._C.enum_names() hands the names to Python, whose rules
 * and codegen check themselves against it (tests/), so a name added here is the one name to add.
 */
#ifndef BYOC_HETERO_ENUMS_H_
#define BYOC_HETERO_ENUMS_H_

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <string>
#include <vector>

namespace byoc_hetero {

/*! \brief One name of a string enum and its meaning. */
template <typename T>
struct EnumEntry {
  const char* name;
  T value;
};

/*! \brief The names of a table, in table order. */
template <typename T>
std::vector<std::string> EnumNamesOf(const std::vector<EnumEntry<T>>& table) {
  std::vector<std::string> names;
  for (const auto& e : table) names.emplace_back(e.name);
  return names;
}

/*! \brief The entry named \p name, or nullptr. */
template <typename T>
const T* FindEnum(const std::vector<EnumEntry<T>>& table, const std::string& name) {
  for (const auto& e : table) {
    if (name == e.name) return &e.value;
  }
  return nullptr;
}

/*!
 * \brief What an activation name means as a oneDNN eltwise: the algorithm and its alpha/beta;
 *        for "clip" (bounded), alpha/beta are the [min, max] the attr `clip` gives instead.
 */
struct ActivationSpec {
  dnnl::algorithm alg;
  float alpha;
  float beta;
  bool bounded;
};

/*! \brief "none" first, then the activations, in the order messages list them. */
const std::vector<EnumEntry<ActivationSpec>>& Activations();
/*! \brief pool2d's attr `algorithm`. */
const std::vector<EnumEntry<dnnl::algorithm>>& PoolAlgorithms();
/*! \brief binary's attr `algorithm`. */
const std::vector<EnumEntry<dnnl::algorithm>>& BinaryAlgorithms();
/*! \brief dense's attr `weight_layout`: true when the weight is stored [N, K] (x @ W^T). */
const std::vector<EnumEntry<bool>>& DenseWeightLayouts();

/*! \brief Activation names (Activations(), "none" included). */
std::vector<std::string> ActivationNames();
/*! \brief Every table by name: activation, pool_algorithm, binary_algorithm, dense_weight_layout. */
std::map<std::string, std::vector<std::string>> EnumNames();

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_ENUMS_H_
