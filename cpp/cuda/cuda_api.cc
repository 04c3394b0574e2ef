/*!
 * \file cuda/cuda_api.cc
 * \brief Lazy loading of the CUDA runtime and cuBLASLt (cuda_api.h).
 */
#include "cuda/cuda_api.h"

#include <dlfcn.h>
#include <tvm/ffi/error.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

namespace byoc_hetero {
namespace cuda {

void* OpenLibrary(const char* env, const std::vector<std::string>& sonames, const char* what, const char* wheel,
                  std::string* path) {
  std::vector<std::string> tried;
  if (const char* given = std::getenv(env); given != nullptr && *given != '\0') tried.push_back(given);
  tried.insert(tried.end(), sonames.begin(), sonames.end());
  std::string errors;
  for (const auto& name : tried) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      *path = name;
      return handle;
    }
    const char* err = dlerror();
    errors += "\n  " + name + ": " + (err ? err : "not found");
  }
  TVM_FFI_THROW(ByocError) << "the cuda_vendor backend needs " << what << " and found none (install " << wheel
                           << ", pip install 'byoc-hetero[cuda]', or set " << env << " to its path); tried:"
                           << errors;
  return nullptr;
}

void* BindSymbol(void* handle, const char* symbol, const std::string& lib) {
  void* address = dlsym(handle, symbol);
  if (address == nullptr) {
    TVM_FFI_THROW(ByocError) << "the cuda_vendor backend: " << lib << " has no symbol " << symbol
                             << " (a CUDA 12 or 13 library, cuDNN 9, is expected)";
  }
  return address;
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  CheckCuda(Api().Malloc(&ptr_, bytes), "cuda_vendor backend, cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() { Api().Free(ptr_); }

namespace {

void BindCudart(void* rt, CudaApi* api) {
  const std::string& lib = api->cudart_path;
  Bind(rt, "cudaGetDeviceCount", lib, &api->GetDeviceCount);
  Bind(rt, "cudaSetDevice", lib, &api->SetDevice);
  Bind(rt, "cudaGetDevice", lib, &api->GetDevice);
  Bind(rt, "cudaMalloc", lib, &api->Malloc);
  Bind(rt, "cudaFree", lib, &api->Free);
  Bind(rt, "cudaMemcpy", lib, &api->Memcpy);
  Bind(rt, "cudaGetErrorString", lib, &api->ErrorString);
}

void BindCublasLt(void* lt, CudaApi* api) {
  const std::string& lib = api->cublaslt_path;
  Bind(lt, "cublasLtCreate", lib, &api->LtCreate);
  Bind(lt, "cublasLtDestroy", lib, &api->LtDestroy);
  Bind(lt, "cublasLtMatmulDescCreate", lib, &api->DescCreate);
  Bind(lt, "cublasLtMatmulDescDestroy", lib, &api->DescDestroy);
  Bind(lt, "cublasLtMatmulDescSetAttribute", lib, &api->DescSet);
  Bind(lt, "cublasLtMatrixLayoutCreate", lib, &api->LayoutCreate);
  Bind(lt, "cublasLtMatrixLayoutDestroy", lib, &api->LayoutDestroy);
  Bind(lt, "cublasLtMatrixLayoutSetAttribute", lib, &api->LayoutSet);
  Bind(lt, "cublasLtMatmulPreferenceCreate", lib, &api->PrefCreate);
  Bind(lt, "cublasLtMatmulPreferenceDestroy", lib, &api->PrefDestroy);
  Bind(lt, "cublasLtMatmulPreferenceSetAttribute", lib, &api->PrefSet);
  Bind(lt, "cublasLtMatmulAlgoGetHeuristic", lib, &api->Heuristic);
  Bind(lt, "cublasLtMatmul", lib, &api->Matmul);
}

/*! \brief Load both libraries and ask for a device; throws ByocError on the first thing missing. */
CudaApi Load() {
  CudaApi api;
  void* rt = OpenLibrary("BYOC_HETERO_CUDART", {"libcudart.so.12", "libcudart.so.13", "libcudart.so"},
                         "the CUDA runtime (libcudart)", "nvidia-cuda-runtime-cu12", &api.cudart_path);
  BindCudart(rt, &api);
  void* lt = OpenLibrary("BYOC_HETERO_CUBLASLT", {"libcublasLt.so.12", "libcublasLt.so.13", "libcublasLt.so"},
                         "cuBLASLt (libcublasLt)", "nvidia-cublas-cu12", &api.cublaslt_path);
  BindCublasLt(lt, &api);
  int count = 0;
  const cudaError_t err = api.GetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    TVM_FFI_THROW(ByocError) << "the cuda_vendor backend found no usable CUDA GPU: cudaGetDeviceCount (" << api.cudart_path
                             << ") says " << (err == cudaSuccess ? std::string("0 devices")
                                                                 : "error " + std::to_string(static_cast<int>(err)) +
                                                                       " (" + api.ErrorString(err) + ")")
                             << " — no NVIDIA driver or no GPU on this machine; place these regions on a machine "
                                "with one, or partition without target 'cuda_vendor'";
  }
  return api;
}

}  // namespace

const CudaApi& Api() { return LoadedOnce<CudaApi, Load>(); }

std::string Availability() {
  try {
    Api();
    return "";
  } catch (const tvm::ffi::Error& e) {
    return e.message();
  }
}

void CheckCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  TVM_FFI_THROW(ByocError) << what << ": CUDA error " << static_cast<int>(err) << " ("
                           << Api().ErrorString(err) << ")";
}

void CheckLt(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  TVM_FFI_THROW(ByocError) << what << ": cuBLASLt status " << static_cast<int>(st)
                           << " (cublasStatus_t; 7 = invalid value, 15 = not supported, 13 = execution failed)";
}

}  // namespace cuda
}  // namespace byoc_hetero
