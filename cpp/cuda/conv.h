/*!
 * \file cuda/conv.h
 * \brief One conv2d node of a cuda region on cuDNN: Y = act(conv(X, W) + bias + Z), NCHW data,
 *        KCRS (OIHW) weights, float32 with FMA math (no TF32), groups, strides, symmetric padding
 *        and dilation; one cudnnConvolutionBiasActivationForward call, its descriptors, algorithm
 *        and workspace made once per device and reused by every call.
 *
 * The fused call always adds a bias (a zero one when the node has none) and reads Z with a scale
 * of 0 when the node has no residual. With no activation cuDNN runs only the implicit-precomputed
 * GEMM algorithm; with relu, the first its heuristic offers whose workspace fits kMaxWorkspace.
 */
#ifndef BYOC_HETERO_CUDA_CONV_H_
#define BYOC_HETERO_CUDA_CONV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_api.h"
#include "cuda/cudnn_api.h"

namespace byoc_hetero {
namespace cuda {

/*! \brief What a conv2d node computes (its document attrs). */
struct ConvShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // data [N, C, H, W]
  int64_t k = 0, r = 0, s = 0;         // weight [K, C / groups, R, S]
  int64_t groups = 1;
  int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int64_t out_h = 0, out_w = 0;        // output [N, K, out_h, out_w]
  bool has_bias = false, has_residual = false;
  std::string activation = "none";     // none | relu

  std::vector<int64_t> DataShape() const { return {n, c, h, w}; }
  std::vector<int64_t> WeightShape() const { return {k, c / groups, r, s}; }
  std::vector<int64_t> OutShape() const { return {n, k, out_h, out_w}; }
  /*! \brief "" when the attrs are consistent (channels divide by groups, the output dims follow
   *         from the input's, padding and strides), else what is wrong. */
  std::string Problem() const;
  /*! \brief "conv2d [1x64x56x56] * [64x64x3x3] g1 s1x1 p1x1 d1x1 +bias relu", for messages. */
  std::string Text() const;
};

/*! \brief The cuDNN objects of one conv2d node on one device (made at its first call there). */
class ConvPlan {
 public:
  /*! \brief Largest workspace an algorithm may ask for (bytes). */
  static constexpr size_t kMaxWorkspace = size_t{256} << 20;

  ConvPlan(cudnnHandle_t handle, const ConvShape& shape);
  ~ConvPlan();
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;

  /*! \brief Y = act(conv(X, W) [+ bias] [+ Z]) on stream; bias / z null when the node has none. */
  void Run(const void* x, const void* w, const void* bias, const void* z, void* y, cudaStream_t stream);

 private:
  void MakeDescriptors();
  void ChooseAlgorithm();
  /*! \brief Destroy the descriptors made (by the destructor, or a constructor that failed). */
  void Release() noexcept;

  cudnnHandle_t handle_;
  ConvShape shape_;
  std::string what_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr, bias_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnActivationDescriptor_t act_ = nullptr;
  cudnnConvolutionFwdAlgo_t algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t workspace_bytes_ = 0;
  std::unique_ptr<DeviceBuffer> workspace_, zero_bias_;
};

}  // namespace cuda
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_CUDA_CONV_H_
