/*!
 * \file kernels/kernel.h
 * \brief The interface between the region planner and the per-op kernels.
 *
 * A kernel is built once per node when a module is created: it reads its attrs, checks the
 * shapes, and creates its oneDNN primitive descriptor(s).  It tells the planner, for every
 * node input and for its output, two memory descriptors:
 *
 *   view  the tensor's bytes read as plain (dense, strided) data, with the dims the kernel
 *         reasons in (e.g. dense reads a [B, S, K] input as [B*S, K]; an "NK" dense weight is
 *         [K, N] with strides [1, K]; a grouped conv weight is [G, O/G, I/G, KH, KW]);
 *   want  the layout the primitive reads/writes (usually chosen by oneDNN via format_tag::any).
 *
 * The planner owns all memory and all layout changes: it inserts the reorders view -> want
 * (once at __init_ for constants, per call for runtime values), keeps intermediates in the
 * producer's layout, and converts to plain only at the region boundary.  Bind() then maps the
 * planner's memories onto the primitive's execution arguments.
 *
 * Adding an op = one file with a builder + one line in kernels/registry.cc.
 */
#ifndef BYOC_HETERO_KERNELS_KERNEL_H_
#define BYOC_HETERO_KERNELS_KERNEL_H_

#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../region_graph.h"

namespace byoc_hetero {

using dnnl::memory;

/*! \brief Plain row-major float32 descriptor. */
memory::desc PlainDesc(const memory::dims& dims);
/*! \brief Float32 descriptor with explicit strides (in elements). */
memory::desc StridedDesc(const memory::dims& dims, const memory::dims& strides);
/*! \brief Float32 descriptor letting oneDNN choose the layout. */
memory::desc AnyDesc(const memory::dims& dims);
/*! \brief Human-readable descriptor, oneDNN-verbose style: "[1,64,56,56]:aBcd16b". */
std::string DescribeDesc(const memory::desc& md);

struct OperandLayout {
  memory::desc view;
  memory::desc want;
};

/*! \brief One primitive execution with its arguments; the planner adds DNNL_ARG_SCRATCHPAD. */
struct Step {
  dnnl::primitive_desc_base pd;
  std::unordered_map<int, memory> args;
  std::string label;
};

enum class Activation { kNone, kRelu };

/*! \brief What a kernel builder gets to see. */
struct KernelContext {
  const RegionGraph& graph;
  size_t node_index;
  const dnnl::engine& engine;

  const NodeInfo& node() const { return graph.nodes[node_index]; }
  const TensorInfo& input(size_t k) const { return graph.tensors[node().inputs[k]]; }
  const TensorInfo& output() const { return graph.tensors[node().output]; }
  /*! \brief "byoc_hetero region '<sym>' node <i> (<op>)". */
  std::string where() const { return graph.where(node_index); }
  /*! \brief Throw a ValueError prefixed with where(). */
  [[noreturn]] void Fail(const std::string& message) const;
  /*! \brief Check the number of node inputs. */
  void ExpectInputCount(size_t expected, const std::string& what) const;
  /*! \brief Check the rank of input k. */
  void ExpectRank(size_t k, const char* name, size_t rank) const;
  /*! \brief Check the output tensor's declared shape against what the op produces. */
  void ExpectOutputShape(const std::vector<int64_t>& produced) const;
  /*! \brief Read "activation" ("none" | "relu"). */
  Activation ReadActivation(AttrReader& attrs) const;
  /*! \brief Attributes every kernel primitive uses: user scratchpad + activation post-op. */
  dnnl::primitive_attr MakeAttr(Activation act) const;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  /*! \brief Layouts, one per node input (same order as the node's inputs). */
  const std::vector<OperandLayout>& inputs() const { return inputs_; }
  const OperandLayout& output() const { return output_; }
  /*!
   * \brief Map memories onto execution steps.
   * \param inputs One memory per node input, each with inputs()[k].want as descriptor.
   * \param output The output memory, with output().want as descriptor.
   */
  virtual std::vector<Step> Bind(const std::vector<memory>& inputs, const memory& output) const = 0;

 protected:
  std::vector<OperandLayout> inputs_;
  OperandLayout output_;
};

/*! \brief A kernel that is a single primitive; node input k is passed as exec arg input_args[k]. */
class PrimitiveKernel : public Kernel {
 public:
  PrimitiveKernel(std::string label, dnnl::primitive_desc_base pd, std::vector<int> input_args,
                  std::vector<OperandLayout> inputs, OperandLayout output);
  std::vector<Step> Bind(const std::vector<memory>& inputs, const memory& output) const override;

 private:
  std::string label_;
  dnnl::primitive_desc_base pd_;
  std::vector<int> input_args_;
};

using KernelBuilder = std::unique_ptr<Kernel> (*)(const KernelContext&);

/*! \brief The builder for an op, or nullptr. */
KernelBuilder FindKernelBuilder(const std::string& op);
/*! \brief The ops this runtime can execute, in registration order. */
std::vector<std::string> SupportedOps();

// One builder per file under kernels/.
std::unique_ptr<Kernel> BuildConv2D(const KernelContext& ctx);
std::unique_ptr<Kernel> BuildDense(const KernelContext& ctx);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_KERNEL_H_
