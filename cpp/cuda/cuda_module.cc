/*!
 * \file cuda/cuda_module.cc
 * \brief The TVM FFI runtime module of one cuda region (kind "byoc_hetero_cuda").
 *
 * Functions (GetFunction):
 *   <symbol>(in_0, ..., in_{I-1}, out_0, ..., out_{O-1})  run on the inputs' CUDA device
 *   __init_<symbol>(Array<Tensor>) -> int                 the constants (host tensors), kept
 *   get_symbol(), get_const_vars(), get_graph_json(), get_runtime_info()
 *
 * Globals (registered when libbyoc_hetero_cuda.so is loaded):
 *   byoc_hetero.cuda.create(document: str) -> Module
 *   byoc_hetero.cuda.availability() -> str                ("" when a GPU can run regions)
 *   ffi.Module.load_from_bytes.byoc_hetero_cuda(bytes) -> Module
 *
 * Nothing CUDA is touched until a region runs: then the CUDA runtime and cuBLASLt are loaded
 * (cuda_api.h) and, per device, a cuBLASLt handle, the constants' copies, the buffers of the
 * values between nodes and each node's descriptors are made once and reused; cuDNN is loaded only
 * for a region that has conv2d nodes. Calls of one module
 * are serialized (its in-between buffers are shared).
 */
#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_api.h"
#include "cuda/conv.h"
#include "cuda/cuda_region.h"
#include "cuda/cudnn_api.h"
#include "cuda/gemm.h"

namespace byoc_hetero {
namespace cuda {

namespace ffi = tvm::ffi;

namespace {

constexpr const char kKind[] = "byoc_hetero_cuda";
constexpr const char kMagic[] = "BYOCCU01";

std::string ShapeText(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/*! \brief One node's plan on one device: runs it on the tensors' device addresses (by tensor id). */
class NodeRunner {
 public:
  virtual ~NodeRunner() = default;
  virtual void Run(const std::vector<void*>& ptr, cudaStream_t stream) = 0;
};

const void* In(const std::vector<void*>& ptr, int t) { return ptr[t]; }

/*! \brief A gemm node on cuBLASLt: inputs (data, weight[, bias]). */
class GemmRunner final : public NodeRunner {
 public:
  GemmRunner(cublasLtHandle_t handle, const Node& node) : node_(node), plan_(handle, node.gemm) {}
  void Run(const std::vector<void*>& ptr, cudaStream_t stream) final {
    const void* bias = node_.inputs.size() == 3 ? In(ptr, node_.inputs[2]) : nullptr;
    plan_.Run(In(ptr, node_.inputs[0]), In(ptr, node_.inputs[1]), bias, ptr[node_.output], stream);
  }

 private:
  const Node& node_;
  GemmPlan plan_;
};

/*! \brief A conv2d node on cuDNN: inputs (data, weight[, bias][, residual]). */
class ConvRunner final : public NodeRunner {
 public:
  ConvRunner(cudnnHandle_t handle, const Node& node) : node_(node), plan_(handle, node.conv) {}
  void Run(const std::vector<void*>& ptr, cudaStream_t stream) final {
    size_t next = 2;
    const void* bias = node_.conv.has_bias ? In(ptr, node_.inputs[next++]) : nullptr;
    const void* residual = node_.conv.has_residual ? In(ptr, node_.inputs[next]) : nullptr;
    plan_.Run(In(ptr, node_.inputs[0]), In(ptr, node_.inputs[1]), bias, residual, ptr[node_.output], stream);
  }

 private:
  const Node& node_;
  ConvPlan plan_;
};

/*! \brief What a region needs on one device: library handles (made for the node kinds it has),
 *         constants, in-between buffers, node runners. */
struct DeviceState {
  std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, cublasStatus_t (*)(cublasLtHandle_t)> lt{nullptr,
                                                                                                     nullptr};
  std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, cudnnStatus_t (*)(cudnnHandle_t)> dnn{nullptr, nullptr};
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::vector<void*> where;  // tensor id -> its constant copy or in-between buffer (else null)
  std::vector<std::unique_ptr<NodeRunner>> runners;

  /*! \brief The runner of `node`, the handle of its library made at its first node. */
  std::unique_ptr<NodeRunner> MakeRunner(const Node& node) {
    if (node.op == "conv2d") {
      if (!dnn) {
        cudnnHandle_t handle = nullptr;
        CheckCudnn(Cudnn().Create(&handle), "cuda_vendor backend, cudnnCreate");
        dnn = {handle, Cudnn().Destroy};
      }
      return std::make_unique<ConvRunner>(dnn.get(), node);
    }
    if (!lt) {
      cublasLtHandle_t handle = nullptr;
      CheckLt(Api().LtCreate(&handle), "cuda_vendor backend, cublasLtCreate");
      lt = {handle, Api().LtDestroy};
    }
    return std::make_unique<GemmRunner>(lt.get(), node);
  }
};

/*! \brief Check a call argument: a compact float tensor of `bits` and `shape` on a CUDA device. */
const DLTensor& CheckArgument(const ffi::AnyView& arg, const std::vector<int64_t>& shape, int bits,
                              const std::string& what) {
  std::optional<DLTensor*> dl = arg.try_cast<DLTensor*>();
  if (!dl.has_value() || *dl == nullptr) {
    TVM_FFI_THROW(InputError) << what << ": expected a Tensor, got " << arg.GetTypeKey();
  }
  const DLTensor& t = **dl;
  if (t.device.device_type != kDLCUDA) {
    TVM_FFI_THROW(InputError) << what << ": expected a tensor on a CUDA device (the cuda_vendor backend's regions run "
                              << "there; place them on 'cuda'), got one of device type "
                              << static_cast<int>(t.device.device_type);
  }
  if (t.dtype.code != kDLFloat || t.dtype.bits != bits || t.dtype.lanes != 1) {
    TVM_FFI_THROW(InputError) << what << ": expected dtype float" << bits << ", got "
                              << ffi::DLDataTypeToString(t.dtype);
  }
  if (t.ndim != static_cast<int>(shape.size()) || !std::equal(shape.begin(), shape.end(), t.shape)) {
    TVM_FFI_THROW(InputError) << what << ": expected shape " << ShapeText(shape.data(), shape.size()) << ", got "
                              << ShapeText(t.shape, t.ndim);
  }
  if (!ffi::IsContiguous(t)) TVM_FFI_THROW(InputError) << what << ": expected compact row-major strides";
  return t;
}

class CudaRegionModuleObj : public ffi::ModuleObj {
 public:
  explicit CudaRegionModuleObj(std::string json) : json_(std::move(json)), region_(ParseCudaRegion(json_)) {
    for (const auto& c : region_.constants) const_names_.push_back(c.name);
  }

  const char* kind() const final { return kKind; }
  int GetPropertyMask() const final { return ffi::Module::kBinarySerializable | ffi::Module::kRunnable; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(this);
    if (name == region_.symbol) {
      return ffi::Function::FromPacked([self, this](ffi::PackedArgs args, ffi::Any* rv) { Run(args); });
    }
    if (name == "__init_" + region_.symbol) {
      return ffi::Function::FromPacked([self, this](ffi::PackedArgs args, ffi::Any* rv) {
        Init(args);
        *rv = 0;
      });
    }
    if (name == "get_symbol") return ffi::Function::FromTyped([self, this]() { return ffi::String(region_.symbol); });
    if (name == "get_const_vars") return ffi::Function::FromTyped([self, this]() { return const_names_; });
    if (name == "get_graph_json") return ffi::Function::FromTyped([self, this]() { return ffi::String(json_); });
    if (name == "get_runtime_info") return ffi::Function::FromTyped([self, this]() { return RuntimeInfo(); });
    return std::nullopt;
  }

  ffi::Bytes SaveToBytes() const final { return ffi::Bytes(std::string(kMagic) + json_); }
  ffi::String InspectSource(const ffi::String& format) const final { return json_; }

 private:
  ffi::String RuntimeInfo() const {
    std::lock_guard<std::mutex> lock(mu_);
    ffi::json::Array devices;
    for (const auto& kv : states_) devices.push_back(static_cast<int64_t>(kv.first));
    ffi::json::Object info{{"devices", devices}, {"constants_loaded", consts_.has_value()}};
    return ffi::json::Stringify(info);
  }

  void Init(const ffi::PackedArgs& args) {
    const std::string fn = region_.where() + ": __init_" + region_.symbol;
    std::optional<ffi::Array<ffi::Tensor>> consts;
    if (args.size() == 1) consts = args[0].try_cast<ffi::Array<ffi::Tensor>>();
    if (!consts.has_value() || consts->size() != region_.constants.size()) {
      TVM_FFI_THROW(ValueError) << fn << ": expected one array of " << region_.constants.size() << " constants";
    }
    for (size_t i = 0; i < consts->size(); ++i) {
      const DLTensor& t = *(*consts)[i].GetDLTensorPtr();
      const int tensor = region_.constants[i].tensor;
      const auto& shape = region_.shapes[tensor];
      const std::string what = fn + " constant '" + region_.constants[i].name + "'";
      if (t.device.device_type != kDLCPU || t.dtype.code != kDLFloat || t.dtype.bits != region_.bits[tensor] ||
          !ffi::IsContiguous(t) ||
          t.ndim != static_cast<int>(shape.size()) || !std::equal(shape.begin(), shape.end(), t.shape)) {
        TVM_FFI_THROW(ValueError) << what << ": expected a compact float" << region_.bits[tensor]
                                  << " host tensor of shape " << ShapeText(shape.data(), shape.size()) << ", got "
                                  << ffi::DLDataTypeToString(t.dtype) << " of shape " << ShapeText(t.shape, t.ndim);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    consts_ = *consts;
    states_.clear();  // new constants: each device copies them again at its next call
  }

  /*! \brief The state of device `dev`, made at its first call (constants uploaded, buffers made). */
  DeviceState& StateFor(int dev) {
    auto it = states_.find(dev);
    if (it != states_.end()) return *it->second;
    const CudaApi& api = Api();
    if (!region_.constants.empty() && !consts_.has_value()) {
      TVM_FFI_THROW(ByocError) << region_.where() << ": called before its constants were given (__init_"
                               << region_.symbol << ")";
    }
    auto state = std::make_unique<DeviceState>();
    state->where.assign(region_.shapes.size(), nullptr);
    for (size_t i = 0; i < region_.constants.size(); ++i) {
      const int t = region_.constants[i].tensor;
      const size_t bytes = region_.Bytes(t);
      state->buffers.push_back(std::make_unique<DeviceBuffer>(bytes));
      const DLTensor& host = *(*consts_)[i].GetDLTensorPtr();
      CheckCuda(api.Memcpy(state->buffers.back()->get(), static_cast<const char*>(host.data) + host.byte_offset,
                           bytes, cudaMemcpyHostToDevice),
                "cuda_vendor backend, copying a constant to the device");
      state->where[t] = state->buffers.back()->get();
    }
    std::vector<bool> is_output(region_.shapes.size(), false);
    for (int t : region_.outputs) is_output[t] = true;
    for (const Node& node : region_.nodes) {
      if (!is_output[node.output]) {
        state->buffers.push_back(std::make_unique<DeviceBuffer>(region_.Bytes(node.output)));
        state->where[node.output] = state->buffers.back()->get();
      }
      state->runners.push_back(state->MakeRunner(node));
    }
    return *states_.emplace(dev, std::move(state)).first->second;
  }

  void Run(const ffi::PackedArgs& args) {
    const size_t num_in = region_.inputs.size(), num_out = region_.outputs.size();
    if (static_cast<size_t>(args.size()) != num_in + num_out) {
      TVM_FFI_THROW(InputError) << region_.where() << ": expected " << num_in << " inputs then " << num_out
                                << " outputs, got " << args.size() << " arguments";
    }
    const CudaApi& api = Api();  // ByocError here when there is no GPU or no library
    std::vector<void*> ptr(region_.shapes.size(), nullptr);
    int dev = -1;
    for (size_t i = 0; i < num_in + num_out; ++i) {
      const int t = i < num_in ? region_.inputs[i] : region_.outputs[i - num_in];
      const std::string what = region_.where() + ": argument " + std::to_string(i);
      const DLTensor& dl = CheckArgument(args[i], region_.shapes[t], region_.bits[t], what);
      if (dev >= 0 && dl.device.device_id != dev) {
        TVM_FFI_THROW(InputError) << what << ": on cuda:" << dl.device.device_id << ", the others on cuda:" << dev;
      }
      dev = dl.device.device_id;
      ptr[t] = static_cast<char*>(dl.data) + dl.byte_offset;
    }
    std::lock_guard<std::mutex> lock(mu_);
    CheckCuda(api.SetDevice(dev), "cuda_vendor backend, cudaSetDevice");
    DeviceState& state = StateFor(dev);
    for (size_t t = 0; t < ptr.size(); ++t) {
      if (ptr[t] == nullptr) ptr[t] = state.where[t];
    }
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, dev));
    for (const auto& runner : state.runners) runner->Run(ptr, stream);
  }

  std::string json_;
  CudaRegion region_;
  ffi::Array<ffi::String> const_names_;
  mutable std::mutex mu_;
  std::optional<ffi::Array<ffi::Tensor>> consts_;
  std::map<int, std::unique_ptr<DeviceState>> states_;
};

ffi::Module LoadFromBytes(const ffi::Bytes& bytes) {
  const std::string text(bytes.data(), bytes.size());
  if (text.compare(0, sizeof(kMagic) - 1, kMagic) != 0) {
    TVM_FFI_THROW(ValueError) << "ffi.Module.load_from_bytes." << kKind << ": expected the magic '" << kMagic
                              << "' at the start of the " << text.size() << " bytes, got '" << text.substr(0, 8) << "'";
  }
  return ffi::Module(ffi::make_object<CudaRegionModuleObj>(text.substr(sizeof(kMagic) - 1)));
}

template <typename F>
void DefineGlobalOnce(const char* name, F&& f) {
  if (ffi::Function::GetGlobal(name).has_value()) return;
  ffi::reflection::GlobalDef().def(name, std::forward<F>(f));
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  DefineGlobalOnce("byoc_hetero.cuda.create", [](const ffi::String& document) {
    return ffi::Module(ffi::make_object<CudaRegionModuleObj>(std::string(document)));
  });
  DefineGlobalOnce("byoc_hetero.cuda.availability", []() { return ffi::String(Availability()); });
  DefineGlobalOnce("ffi.Module.load_from_bytes.byoc_hetero_cuda", LoadFromBytes);
}

}  // namespace cuda
}  // namespace byoc_hetero
