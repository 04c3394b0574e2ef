/*!
 * \file cuda/cuda_region.h
 * \brief The document of a cuda region (format "byoc_hetero.cuda_region", docs/backends.md):
 *        tensors, inputs, constants, nodes (gemm on cuBLASLt, conv2d on cuDNN) and outputs, parsed
 *        and checked. Version 2; a version-1 document (gemm nodes only) still loads.
 */
#ifndef BYOC_HETERO_CUDA_CUDA_REGION_H_
#define BYOC_HETERO_CUDA_CUDA_REGION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/conv.h"
#include "cuda/gemm.h"

namespace byoc_hetero {
namespace cuda {

/*!
 * \brief One node: inputs and output are tensor ids. A gemm reads (data, weight[, bias]), a conv2d
 *        (data, weight[, bias][, residual]); the attrs of its op are in gemm or conv.
 */
struct Node {
  std::string op;  // "gemm" | "conv2d"
  std::vector<int> inputs;
  int output = -1;
  GemmShape gemm;
  ConvShape conv;
};

/*! \brief A named constant: loaded by __init_<symbol>, uploaded to each device at its first call. */
struct ConstantRef {
  std::string name;
  int tensor = -1;
};

/*! \brief A parsed cuda region (every tensor float32 or float16, static shape). */
struct CudaRegion {
  std::string symbol = "<unknown>";
  std::vector<std::vector<int64_t>> shapes;  // by tensor id
  std::vector<int> bits;                     // by tensor id: 32 (float32) or 16 (float16)
  std::vector<int> inputs, outputs;
  std::vector<ConstantRef> constants;
  std::vector<Node> nodes;

  /*! \brief "cuda region <symbol>", for messages. */
  std::string where() const { return "cuda region " + symbol; }
  /*! \brief Elements of tensor t. */
  int64_t Numel(int t) const;
  /*! \brief Bytes of tensor t. */
  size_t Bytes(int t) const { return static_cast<size_t>(Numel(t)) * (bits[t] / 8); }
};

/*! \brief Parse and check a document; ValueError naming the region and the field otherwise. */
CudaRegion ParseCudaRegion(const std::string& json_text);

}  // namespace cuda
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_CUDA_CUDA_REGION_H_
