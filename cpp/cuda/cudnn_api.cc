/*!
 * \file cuda/cudnn_api.cc
 * \brief Lazy loading of cuDNN 9 (cudnn_api.h).
 */
#include "cuda/cudnn_api.h"

#include <tvm/ffi/error.h>

#include "cuda/cuda_api.h"

namespace byoc_hetero {
namespace cuda {

namespace {

void BindDescriptors(void* lib, CudnnApi* api) {
  const std::string& path = api->path;
  Bind(lib, "cudnnCreateTensorDescriptor", path, &api->CreateTensor);
  Bind(lib, "cudnnDestroyTensorDescriptor", path, &api->DestroyTensor);
  Bind(lib, "cudnnSetTensor4dDescriptor", path, &api->SetTensor4d);
  Bind(lib, "cudnnCreateFilterDescriptor", path, &api->CreateFilter);
  Bind(lib, "cudnnDestroyFilterDescriptor", path, &api->DestroyFilter);
  Bind(lib, "cudnnSetFilter4dDescriptor", path, &api->SetFilter4d);
  Bind(lib, "cudnnCreateConvolutionDescriptor", path, &api->CreateConv);
  Bind(lib, "cudnnDestroyConvolutionDescriptor", path, &api->DestroyConv);
  Bind(lib, "cudnnSetConvolution2dDescriptor", path, &api->SetConv2d);
  Bind(lib, "cudnnSetConvolutionGroupCount", path, &api->SetGroupCount);
  Bind(lib, "cudnnSetConvolutionMathType", path, &api->SetMathType);
  Bind(lib, "cudnnCreateActivationDescriptor", path, &api->CreateActivation);
  Bind(lib, "cudnnDestroyActivationDescriptor", path, &api->DestroyActivation);
  Bind(lib, "cudnnSetActivationDescriptor", path, &api->SetActivation);
}

CudnnApi Load() {
  Api();  // a usable GPU first: without one, that is the error to give
  CudnnApi api;
  void* lib = OpenLibrary("BYOC_HETERO_CUDNN", {"libcudnn.so.9"}, "cuDNN 9 (libcudnn) for its conv2d nodes",
                          "nvidia-cudnn-cu12", &api.path);
  Bind(lib, "cudnnGetVersion", api.path, &api.GetVersion);
  const size_t version = api.GetVersion();
  if (version < 90000 || version >= 100000) {
    TVM_FFI_THROW(ByocError) << "the cuda_vendor backend needs cuDNN 9 for its conv2d nodes; " << api.path
                             << " is version " << version;
  }
  Bind(lib, "cudnnGetErrorString", api.path, &api.ErrorString);
  Bind(lib, "cudnnCreate", api.path, &api.Create);
  Bind(lib, "cudnnDestroy", api.path, &api.Destroy);
  Bind(lib, "cudnnSetStream", api.path, &api.SetStream);
  BindDescriptors(lib, &api);
  Bind(lib, "cudnnGetConvolutionForwardAlgorithm_v7", api.path, &api.GetAlgorithms);
  Bind(lib, "cudnnGetConvolutionForwardWorkspaceSize", api.path, &api.WorkspaceSize);
  Bind(lib, "cudnnConvolutionBiasActivationForward", api.path, &api.ConvBiasActivation);
  return api;
}

}  // namespace

const CudnnApi& Cudnn() { return LoadedOnce<CudnnApi, Load>(); }

void CheckCudnn(cudnnStatus_t st, const std::string& what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  TVM_FFI_THROW(ByocError) << what << ": cuDNN status " << static_cast<int>(st) << " (" << Cudnn().ErrorString(st)
                           << ")";
}

}  // namespace cuda
}  // namespace byoc_hetero
