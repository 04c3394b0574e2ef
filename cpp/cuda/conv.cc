/*!
 * \file cuda/conv.cc
 * \brief ConvPlan: a conv2d node on cuDNN (conv.h).
 */
#include "cuda/conv.h"

#include <tvm/ffi/error.h>

#include <sstream>
#include <vector>

namespace byoc_hetero {
namespace cuda {

std::string ConvShape::Problem() const {
  if (n < 1 || c < 1 || h < 1 || w < 1 || k < 1 || r < 1 || s < 1) return "every dim must be >= 1";
  if (groups < 1 || c % groups != 0 || k % groups != 0) {
    return "groups " + std::to_string(groups) + " must divide the channels in (" + std::to_string(c) + ") and out (" +
           std::to_string(k) + ")";
  }
  if (pad_h < 0 || pad_w < 0 || stride_h < 1 || stride_w < 1 || dilation_h < 1 || dilation_w < 1) {
    return "padding must be >= 0, strides and dilations >= 1";
  }
  const int64_t want_h = (h + 2 * pad_h - dilation_h * (r - 1) - 1) / stride_h + 1;
  const int64_t want_w = (w + 2 * pad_w - dilation_w * (s - 1) - 1) / stride_w + 1;
  if (want_h != out_h || want_w != out_w) {
    return "output " + std::to_string(out_h) + "x" + std::to_string(out_w) + ", the attrs give " +
           std::to_string(want_h) + "x" + std::to_string(want_w);
  }
  if (activation != "none" && activation != "relu") return "activation '" + activation + "' (expected none or relu)";
  return "";
}

std::string ConvShape::Text() const {
  std::ostringstream os;
  os << "conv2d [" << n << "x" << c << "x" << h << "x" << w << "] * [" << k << "x" << c / groups << "x" << r << "x" << s
     << "] g" << groups << " s" << stride_h << "x" << stride_w << " p" << pad_h << "x" << pad_w << " d" << dilation_h
     << "x" << dilation_w << (has_bias ? " +bias" : "") << (has_residual ? " +residual" : "") << " " << activation;
  return os.str();
}

ConvPlan::ConvPlan(cudnnHandle_t handle, const ConvShape& shape)
    : handle_(handle), shape_(shape), what_("cuda_vendor backend, " + shape.Text()) {
  try {
    MakeDescriptors();
    ChooseAlgorithm();
    if (workspace_bytes_ > 0) workspace_ = std::make_unique<DeviceBuffer>(workspace_bytes_);
    if (!shape_.has_bias) {  // the fused call always adds a bias
      zero_bias_ = std::make_unique<DeviceBuffer>(shape_.k * sizeof(float));
      const std::vector<float> zeros(shape_.k, 0.0f);
      CheckCuda(Api().Memcpy(zero_bias_->get(), zeros.data(), zeros.size() * sizeof(float), cudaMemcpyHostToDevice),
                "cuda_vendor backend, a conv2d's zero bias");
    }
  } catch (...) {
    Release();  // the descriptors made so far (no destructor runs for a half-made object)
    throw;
  }
}

void ConvPlan::MakeDescriptors() {
  const CudnnApi& dnn = Cudnn();
  const ConvShape& s = shape_;
  auto nchw = [&](cudnnTensorDescriptor_t* desc, int64_t n, int64_t c, int64_t h, int64_t w) {
    CheckCudnn(dnn.CreateTensor(desc), what_);
    CheckCudnn(dnn.SetTensor4d(*desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(n), static_cast<int>(c),
                               static_cast<int>(h), static_cast<int>(w)),
               what_ + ", a tensor descriptor");
  };
  nchw(&x_, s.n, s.c, s.h, s.w);
  nchw(&y_, s.n, s.k, s.out_h, s.out_w);
  nchw(&bias_, 1, s.k, 1, 1);
  CheckCudnn(dnn.CreateFilter(&w_), what_);
  CheckCudnn(dnn.SetFilter4d(w_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, static_cast<int>(s.k),
                             static_cast<int>(s.c / s.groups), static_cast<int>(s.r), static_cast<int>(s.s)),
             what_ + ", the filter descriptor");
  CheckCudnn(dnn.CreateConv(&conv_), what_);
  CheckCudnn(dnn.SetConv2d(conv_, static_cast<int>(s.pad_h), static_cast<int>(s.pad_w), static_cast<int>(s.stride_h),
                           static_cast<int>(s.stride_w), static_cast<int>(s.dilation_h),
                           static_cast<int>(s.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             what_ + ", the convolution descriptor");
  CheckCudnn(dnn.SetGroupCount(conv_, static_cast<int>(s.groups)), what_ + ", groups");
  CheckCudnn(dnn.SetMathType(conv_, CUDNN_FMA_MATH), what_ + ", FMA math");  // float32, as cuBLASLt's gemms
  CheckCudnn(dnn.CreateActivation(&act_), what_);
  const cudnnActivationMode_t mode = s.activation == "relu" ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY;
  CheckCudnn(dnn.SetActivation(act_, mode, CUDNN_NOT_PROPAGATE_NAN, 0.0), what_ + ", the activation");
}

void ConvPlan::ChooseAlgorithm() {
  const CudnnApi& dnn = Cudnn();
  if (shape_.activation == "none") {  // cuDNN's fused call runs identity with this algorithm only
    algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    CheckCudnn(dnn.WorkspaceSize(handle_, x_, w_, conv_, y_, algo_, &workspace_bytes_), what_ + ", its workspace");
    return;
  }
  cudnnConvolutionFwdAlgoPerf_t found[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int count = 0;
  CheckCudnn(dnn.GetAlgorithms(handle_, x_, w_, conv_, y_, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, found),
             what_ + ", choosing an algorithm");
  for (int i = 0; i < count; ++i) {
    if (found[i].status == CUDNN_STATUS_SUCCESS && found[i].memory <= kMaxWorkspace) {
      algo_ = found[i].algo;
      workspace_bytes_ = found[i].memory;
      return;
    }
  }
  TVM_FFI_THROW(ByocError) << what_ << ": cuDNN's heuristic offers no algorithm within a " << (kMaxWorkspace >> 20)
                           << " MiB workspace (" << count << " offered)";
}

ConvPlan::~ConvPlan() { Release(); }

void ConvPlan::Release() noexcept {
  if (x_ == nullptr) return;  // the first descriptor made: none was (cuDNN may not even be loaded)
  const CudnnApi& dnn = Cudnn();  // loaded: x_ was made with it
  if (act_) dnn.DestroyActivation(act_);
  if (conv_) dnn.DestroyConv(conv_);
  if (w_) dnn.DestroyFilter(w_);
  for (cudnnTensorDescriptor_t desc : {bias_, y_, x_}) {
    if (desc) dnn.DestroyTensor(desc);
  }
}

void ConvPlan::Run(const void* x, const void* w, const void* bias, const void* z, void* y, cudaStream_t stream) {
  const CudnnApi& dnn = Cudnn();
  CheckCudnn(dnn.SetStream(handle_, stream), what_ + ", cudnnSetStream");
  const float alpha1 = 1.0f, alpha2 = shape_.has_residual ? 1.0f : 0.0f;
  const void* bias_ptr = shape_.has_bias ? bias : zero_bias_->get();
  const void* z_ptr = shape_.has_residual ? z : y;  // scaled by 0 when none
  CheckCudnn(dnn.ConvBiasActivation(handle_, &alpha1, x_, x, w_, w, conv_, algo_,
                                    workspace_ ? workspace_->get() : nullptr, workspace_bytes_, &alpha2, y_, z_ptr,
                                    bias_, bias_ptr, act_, y_, y),
             what_);
}

}  // namespace cuda
}  // namespace byoc_hetero
