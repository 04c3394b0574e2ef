/*!
 * \file cuda/gemm.h
 * \brief One gemm node of a cuda region on cuBLASLt: Y = X·W (or X·Wᵀ) [+ bias] [relu | gelu_tanh],
 *        row-major float32 or float16 (float16 tensors: FP32 accumulation, CUBLAS_COMPUTE_32F), optionally
 *        batched (strided), with its descriptors made once per device and reused by every call.
 *
 * Row-major Y[M,N] = X[M,K]·W[K,N] is column-major Yᵀ = Wᵀ·Xᵀ: cuBLASLt's A is W (N×K, or K×N
 * read transposed when the weight is given as [N,K]), B is X (K×M), D is Y (N×M), so the bias is
 * the per-row vector of D that the BIAS epilogues add.
 */
#ifndef BYOC_HETERO_CUDA_GEMM_H_
#define BYOC_HETERO_CUDA_GEMM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/cuda_api.h"

namespace byoc_hetero {
namespace cuda {

/*! \brief What a gemm node computes (its document attrs). */
struct GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool transpose_b = false;      // the weight is [.., N, K]
  bool batched_weight = false;   // the weight has the batch dims too (else shared by the batch)
  bool has_bias = false;
  std::string activation = "none";  // none | relu | gelu_tanh
  int bits = 32;                     // the tensors' dtype: 32 (float32) or 16 (float16)
  std::string compute = "fp32";      // fp32 | tf32 | fp16 (the last two: float32 tensors only)

  /*! \brief The cuBLASLt epilogue of has_bias and activation. */
  cublasLtEpilogue_t Epilogue() const;
  /*! \brief The cuBLASLt compute type of compute (ValueError for an unknown one, or tf32 / fp16 on
   *         float16 tensors). */
  cublasComputeType_t ComputeType() const;
  /*! \brief "gemm 2x[64x128x256] NK bias relu", for messages. */
  std::string Text() const;
};

/*! \brief The cuBLASLt objects of one node on one device (made at its first call there). */
class GemmPlan {
 public:
  GemmPlan(cublasLtHandle_t handle, const GemmShape& shape);
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  /*! \brief Y = X·W [+ bias] [act] on stream; bias may be null when the node has none. */
  void Run(const void* x, const void* w, const void* bias, void* y, cudaStream_t stream);

 private:
  /*! \brief Ask cuBLASLt's heuristic for an algorithm valid for pointers aligned to align bytes. */
  void ChooseAlgorithm(uint32_t align);

  cublasLtHandle_t handle_;
  GemmShape shape_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  uint32_t align_ = 0;  // the pointer alignment algo_ was chosen for (0: none chosen yet)
};

}  // namespace cuda
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_CUDA_GEMM_H_
