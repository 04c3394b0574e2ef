/*!
 * \file cuda/gemm.cc
 * \brief GemmPlan: a gemm node on cuBLASLt (gemm.h).
 */
#include "cuda/gemm.h"

#include <tvm/ffi/error.h>

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <type_traits>

namespace byoc_hetero {
namespace cuda {

cublasLtEpilogue_t GemmShape::Epilogue() const {
  if (activation == "relu") return has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  if (activation == "gelu_tanh") return has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  if (activation != "none") {
    TVM_FFI_THROW(ValueError) << "gemm: activation '" << activation << "' (expected none, relu or gelu_tanh)";
  }
  return has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

cublasComputeType_t GemmShape::ComputeType() const {
  if (compute == "fp32") return CUBLAS_COMPUTE_32F;
  if (bits == 32 && compute == "tf32") return CUBLAS_COMPUTE_32F_FAST_TF32;
  if (bits == 32 && compute == "fp16") return CUBLAS_COMPUTE_32F_FAST_16F;
  TVM_FFI_THROW(ValueError) << "gemm: compute '" << compute << "' on float" << bits
                            << " tensors (expected fp32, or tf32 / fp16 for float32 tensors)";
  return CUBLAS_COMPUTE_32F;  // not reached
}

std::string GemmShape::Text() const {
  std::ostringstream os;
  os << "gemm " << batch << "x[" << m << "x" << n << "x" << k << "] weight " << (transpose_b ? "NK" : "KN")
     << (batched_weight ? " batched" : "") << (has_bias ? " +bias" : "") << " " << activation
     << (bits == 16 ? " float16" : "") << (compute != "fp32" ? " compute " + compute : "");
  return os.str();
}

namespace {

cublasLtMatrixLayout_t Layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld, int64_t batch,
                              int64_t stride, const char* what) {
  const CudaApi& api = Api();
  cublasLtMatrixLayout_t layout = nullptr;
  CheckLt(api.LayoutCreate(&layout, type, rows, cols, ld), what);
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    CheckLt(api.LayoutSet(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), what);
    CheckLt(api.LayoutSet(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)), what);
  }
  return layout;
}

/*! \brief The largest power of two up to 256 dividing every address (cuBLASLt's alignment preference). */
uint32_t Alignment(std::initializer_list<const void*> pointers) {
  uint32_t align = 256;
  for (const void* p : pointers) {
    if (p == nullptr) continue;
    while (align > 1 && reinterpret_cast<uintptr_t>(p) % align != 0) align /= 2;
  }
  return align;
}

}  // namespace

GemmPlan::GemmPlan(cublasLtHandle_t handle, const GemmShape& shape) : handle_(handle), shape_(shape) {
  const CudaApi& api = Api();
  const std::string what = "cuda_vendor backend, " + shape.Text();
  CheckLt(api.DescCreate(&desc_, shape.ComputeType(), CUDA_R_32F), what.c_str());  // float alpha and beta
  const cublasOperation_t ta = shape.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  CheckLt(api.DescSet(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), what.c_str());
  CheckLt(api.DescSet(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), what.c_str());
  const cublasLtEpilogue_t epilogue = shape.Epilogue();
  CheckLt(api.DescSet(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), what.c_str());
  const int64_t m = shape.m, n = shape.n, k = shape.k, batch = shape.batch;
  // A = the weight: N×K (ld N), or K×N (ld K) read transposed; B = the data K×M; D = Y, N×M.
  // float16 tensors: FP32 compute and scale (alpha, beta and the accumulation in float32)
  const cudaDataType_t type = shape.bits == 16 ? CUDA_R_16F : CUDA_R_32F;
  const int64_t w_stride = shape.batched_weight ? n * k : 0;
  a_ = shape.transpose_b ? Layout(type, k, n, k, batch, w_stride, what.c_str())
                         : Layout(type, n, k, n, batch, w_stride, what.c_str());
  b_ = Layout(type, k, m, k, batch, m * k, what.c_str());
  d_ = Layout(type, n, m, n, batch, m * n, what.c_str());
}

GemmPlan::~GemmPlan() {
  const CudaApi& api = Api();  // loaded: the constructor succeeded
  if (d_) api.LayoutDestroy(d_);
  if (b_) api.LayoutDestroy(b_);
  if (a_) api.LayoutDestroy(a_);
  if (desc_) api.DescDestroy(desc_);
}

void GemmPlan::ChooseAlgorithm(uint32_t align) {
  const CudaApi& api = Api();
  const std::string what = "cuda_vendor backend, choosing an algorithm for " + shape_.Text();
  cublasLtMatmulPreference_t pref = nullptr;
  CheckLt(api.PrefCreate(&pref), what.c_str());
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(api.PrefDestroy)> owner(
      pref, api.PrefDestroy);
  const uint64_t workspace = 0;  // no workspace: the algorithms that need none
  CheckLt(api.PrefSet(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)), what.c_str());
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    CheckLt(api.PrefSet(pref, attr, &align, sizeof(align)), what.c_str());
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  CheckLt(api.Heuristic(handle_, desc_, a_, b_, d_, d_, pref, 1, &result, &found), what.c_str());
  if (found == 0) {
    TVM_FFI_THROW(ByocError) << what << ": cuBLASLt offers no algorithm (pointers aligned to " << align
                             << " bytes, no workspace)";
  }
  algo_ = result.algo;
  align_ = align;
}

void GemmPlan::Run(const void* x, const void* w, const void* bias, void* y, cudaStream_t stream) {
  const CudaApi& api = Api();
  if (shape_.has_bias) {
    CheckLt(api.DescSet(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "cuda_vendor backend, bias");
  }
  // An algorithm chosen for better-aligned pointers may not run on these: choose again for them.
  const uint32_t align = Alignment({x, w, bias, y});
  if (align_ == 0 || align < align_) ChooseAlgorithm(align);
  const float one = 1.0f, zero = 0.0f;
  CheckLt(api.Matmul(handle_, desc_, &one, w, a_, x, b_, &zero, y, d_, y, d_, &algo_, nullptr, 0, stream),
          ("cuda_vendor backend, " + shape_.Text()).c_str());
}

}  // namespace cuda
}  // namespace byoc_hetero
