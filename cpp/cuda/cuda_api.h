/*!
 * \file cuda/cuda_api.h
 * \brief The CUDA runtime and cuBLASLt functions the cuda_vendor backend calls, loaded with dlopen at
 *        first use (the library links neither, so it loads, and regions are created and
 *        exported, on a machine without a GPU or the CUDA libraries).
 *
 * Where each comes from, first found wins: the path in BYOC_HETERO_CUDART / BYOC_HETERO_CUBLASLT,
 * then the sonames libcudart.so.12 / .13 and libcublasLt.so.12 / .13 (a library the process has
 * already loaded, e.g. byoc_hetero's preload from the nvidia-* wheels, is found by its soname).
 * Only functions whose signatures CUDA 12 and 13 share are used.
 */
#ifndef BYOC_HETERO_CUDA_CUDA_API_H_
#define BYOC_HETERO_CUDA_CUDA_API_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace byoc_hetero {
namespace cuda {

/*! \brief The loaded entry points (filled once by Api()). */
struct CudaApi {
  decltype(&cudaGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&cudaSetDevice) SetDevice = nullptr;
  decltype(&cudaGetDevice) GetDevice = nullptr;
  decltype(&cudaMalloc) Malloc = nullptr;
  decltype(&cudaFree) Free = nullptr;
  decltype(&cudaMemcpy) Memcpy = nullptr;
  decltype(&cudaGetErrorString) ErrorString = nullptr;
  decltype(&cublasLtCreate) LtCreate = nullptr;
  decltype(&cublasLtDestroy) LtDestroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) DescCreate = nullptr;
  decltype(&cublasLtMatmulDescDestroy) DescDestroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) DescSet = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) LayoutCreate = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) LayoutDestroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) LayoutSet = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) PrefCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) PrefDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) PrefSet = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) Heuristic = nullptr;
  decltype(&cublasLtMatmul) Matmul = nullptr;
  /*! \brief Where each library was loaded from (for messages and get_runtime_info). */
  std::string cudart_path, cublaslt_path;
};

/*!
 * \brief The CUDA entry points, loaded at the first call; throws ByocError naming the library
 *        that is missing (and where it was looked for), or that no CUDA device can be used (no
 *        driver, no GPU), as the CUDA runtime words it.
 */
const CudaApi& Api();

/*! \brief "" when Api() would succeed, else its message (loads the libraries, throws nothing). */
std::string Availability();

/*!
 * \brief dlopen the path in $env, else the first of sonames that loads; on failure throw ByocError
 *        naming what (e.g. "cuDNN 9 (libcudnn)"), the wheel that ships it, and every name tried.
 *        The name that loaded goes to *path.
 */
void* OpenLibrary(const char* env, const std::vector<std::string>& sonames, const char* what, const char* wheel,
                  std::string* path);

/*! \brief The address of symbol in handle; ByocError naming the library lib when it has none. */
void* BindSymbol(void* handle, const char* symbol, const std::string& lib);

template <typename T>
void Bind(void* handle, const char* symbol, const std::string& lib, T* out) {
  *out = reinterpret_cast<T>(BindSymbol(handle, symbol, lib));
}

/*!
 * \brief The entry points Load() fills, made at the first call that succeeds. A failure is not
 *        cached: every call until one succeeds retries (and raises the same clear error), so
 *        installing a driver or a library later is not ruled out.
 */
template <typename T, T (*Load)()>
const T& LoadedOnce() {
  static std::mutex mu;
  static std::unique_ptr<T> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (!loaded) loaded = std::make_unique<T>(Load());
  return *loaded;
}

/*! \brief A cudaMalloc'd buffer on the current device, freed with its owner (Api() must have loaded). */
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

/*! \brief Throw ByocError "<what>: CUDA error <code> (<text>)" unless err is cudaSuccess. */
void CheckCuda(cudaError_t err, const char* what);

/*! \brief Throw ByocError "<what>: cuBLASLt status <code>" unless st is CUBLAS_STATUS_SUCCESS. */
void CheckLt(cublasStatus_t st, const char* what);

}  // namespace cuda
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_CUDA_CUDA_API_H_
