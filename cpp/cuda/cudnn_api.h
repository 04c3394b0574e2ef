/*!
 * \file cuda/cudnn_api.h
 * \brief The cuDNN 9 functions the cuda_vendor backend's conv2d nodes call, loaded with dlopen at
 *        the first conv2d node's first run (a region of gemm nodes alone never loads cuDNN).
 *
 * Where it comes from, first found wins: the path in BYOC_HETERO_CUDNN, then the soname
 * libcudnn.so.9 (byoc_hetero's preload from the nvidia-cudnn-cu12 wheel, or the system's). The
 * legacy convolution API is used (cudnnConvolutionBiasActivationForward: conv, bias, residual and
 * relu in one call); cuDNN 9 keeps it, marked deprecated, in its libcudnn_cnn.
 */
#ifndef BYOC_HETERO_CUDA_CUDNN_API_H_
#define BYOC_HETERO_CUDA_CUDNN_API_H_

#include <cudnn.h>

#include <string>

namespace byoc_hetero {
namespace cuda {

/*! \brief The loaded cuDNN entry points (filled once by Cudnn()). */
struct CudnnApi {
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) ErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnCreateTensorDescriptor) CreateTensor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) DestroyTensor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) SetTensor4d = nullptr;
  decltype(&cudnnCreateFilterDescriptor) CreateFilter = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) DestroyFilter = nullptr;
  decltype(&cudnnSetFilter4dDescriptor) SetFilter4d = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) CreateConv = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) DestroyConv = nullptr;
  decltype(&cudnnSetConvolution2dDescriptor) SetConv2d = nullptr;
  decltype(&cudnnSetConvolutionGroupCount) SetGroupCount = nullptr;
  decltype(&cudnnSetConvolutionMathType) SetMathType = nullptr;
  decltype(&cudnnCreateActivationDescriptor) CreateActivation = nullptr;
  decltype(&cudnnDestroyActivationDescriptor) DestroyActivation = nullptr;
  decltype(&cudnnSetActivationDescriptor) SetActivation = nullptr;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) GetAlgorithms = nullptr;
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) WorkspaceSize = nullptr;
  decltype(&cudnnConvolutionBiasActivationForward) ConvBiasActivation = nullptr;
  /*! \brief Where libcudnn was loaded from (for messages). */
  std::string path;
};

/*!
 * \brief The cuDNN entry points, loaded at the first call after Api() (a GPU must be usable);
 *        throws ByocError naming libcudnn and where it was looked for when it is missing, or the
 *        version found when it is not cuDNN 9.
 */
const CudnnApi& Cudnn();

/*! \brief Throw ByocError "<what>: cuDNN status <code> (<text>)" unless st is CUDNN_STATUS_SUCCESS. */
void CheckCudnn(cudnnStatus_t st, const std::string& what);

}  // namespace cuda
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_CUDA_CUDNN_API_H_
