/*!
 * \file cuda/cuda_region.h
 * \brief The document of a cuda region (format "byoc_hetero.cuda_region", docs/backends.md):
 *        tensors, inputs, constants, gemm nodes and outputs, parsed and checked.
 */
#ifndef BYOC_HETERO_CUDA_CUDA_REGION_H_
#define BYOC_HETERO_CUDA_CUDA_REGION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/gemm.h"

namespace byoc_hetero {
namespace cuda {

/*! \brief One gemm node: inputs (data, weight[, bias]) and output are tensor ids. */
struct GemmNode {
  std::vector<int> inputs;
  int output = -1;
  GemmShape shape;
};

/*! \brief A named constant: loaded by __init_<symbol>, uploaded to each device at its first call. */
struct ConstantRef {
  std::string name;
  int tensor = -1;
};

/*! \brief A parsed cuda region (every tensor float32, static shape). */
struct CudaRegion {
  std::string symbol = "<unknown>";
  std::vector<std::vector<int64_t>> shapes;  // by tensor id
  std::vector<int> inputs, outputs;
  std::vector<ConstantRef> constants;
  std::vector<GemmNode> nodes;

  /*! \brief "cuda region <symbol>", for messages. */
  std::string where() const { return "cuda region " + symbol; }
  /*! \brief Elements of tensor t. */
  int64_t Numel(int t) const;
};

/*! \brief Parse and check a document; ValueError naming the region and the field otherwise. */
CudaRegion ParseCudaRegion(const std::string& json_text);

}  // namespace cuda
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_CUDA_CUDA_REGION_H_
