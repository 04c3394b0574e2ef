/*!
 * \file region_module.cc
 * \brief RegionModuleObj: argument checking and the TVM FFI surface of a compiled region.
 */
#include "region_module.h"

#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "kernels/kernel.h"
#include "digest.h"
#include "region_graph.h"
#include "compiled_region.h"
#include "threading.h"
#include "weights.h"

namespace byoc_hetero {

namespace ffi = tvm::ffi;

namespace {

std::string DeviceName(const DLDevice& dev) {
  std::string type;
  switch (dev.device_type) {
    case kDLCPU:
      type = "cpu";
      break;
    case kDLCUDA:
      type = "cuda";
      break;
    case kDLCUDAHost:
      type = "cuda_host";
      break;
    case kDLROCM:
      type = "rocm";
      break;
    case kDLVulkan:
      type = "vulkan";
      break;
    case kDLMetal:
      type = "metal";
      break;
    default:
      type = "device_type " + std::to_string(static_cast<int>(dev.device_type));
  }
  return type + ":" + std::to_string(dev.device_id);
}

std::string ShapeOf(const DLTensor& t) {
  return ShapeToString(std::vector<int64_t>(t.shape, t.shape + t.ndim));
}

/*!
 * \brief Check that t is a CPU compact row-major tensor of the dtype of \p info and, with
 *        \p check_shape, of its shape (a symbolic region's shapes are checked when they bind its
 *        symbols); return its data address.  \p what() names the argument in messages: it is only
 *        called when a check fails, so a call that passes formats no string (this runs for every
 *        argument of every region call).
 */
template <typename What>
void* CheckTensor(const DLTensor& t, const TensorInfo& info, bool check_shape, const What& what) {
  const std::vector<int64_t>& shape = info.shape;
  auto fail = [&](const std::string& expected, const std::string& got) {
    TVM_FFI_THROW(ValueError) << what() << ": expected " << expected << ", got " << got;
  };
  if (t.device.device_type != kDLCPU) fail("a CPU tensor", "a tensor on " + DeviceName(t.device));
  // The region's dtypes as DLPack types, parsed once (not per call).
  static const std::vector<DLDataType> kDLTypes = [] {
    std::vector<DLDataType> types;
    for (DType d : kAllDTypes) {
      types.push_back(ffi::StringToDLDataType(DTypeName(d)));
    }
    return types;
  }();
  const DLDataType want = kDLTypes[static_cast<size_t>(info.dtype)];
  if (t.dtype.code != want.code || t.dtype.bits != want.bits || t.dtype.lanes != want.lanes) {
    fail(std::string("dtype ") + DTypeName(info.dtype), "dtype " + std::string(ffi::DLDataTypeToString(t.dtype)));
  }
  if (check_shape && (t.ndim != static_cast<int>(shape.size()) ||
                      !std::equal(shape.begin(), shape.end(), t.shape))) {
    fail("shape " + ShapeToString(shape), "shape " + ShapeOf(t));
  }
  if (!ffi::IsContiguous(t)) {
    fail("compact row-major strides",
         "strides " + ShapeToString(std::vector<int64_t>(t.strides, t.strides + t.ndim)));
  }
  if (t.data == nullptr) fail("a tensor with data", "a null data pointer");
  char* ptr = static_cast<char*>(t.data) + t.byte_offset;
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  // float32 (and int32/int64) data must be 4-byte aligned (oneDNN's vector loads); bool is bytes
  const uintptr_t align = std::min<size_t>(DTypeSize(info.dtype), alignof(float));
  if (address % align != 0) {
    std::ostringstream got;
    got << "data at address 0x" << std::hex << address << std::dec << " (misaligned by "
        << address % align << " bytes)";
    fail("data aligned to " + std::to_string(align) + " bytes (" + DTypeName(info.dtype) + ")", got.str());
  }
  return ptr;
}

/*!
 * \brief get_runtime_info's JSON: {"threads", "contexts", "shared_bytes", "context_bytes",
 *        "contention_plans", "precision", "precision_requested", "precision_note", "symbols", "plans",
 *        "plans_made", "plan_cache_limit", "bindings"}: how the module runs; contention_plans: the
 *        thread counts of the plans made for contention; plans...bindings: the plan cache of a
 *        symbolic region (its own thread count's).
 */
ffi::String RuntimeInfoJson(const RegionGraph& graph, const CompiledRegion& plan,
                            const ffi::json::Array& contention_plans) {
  ffi::json::Array symbols, bindings;
  for (const auto& name : graph.symbols) symbols.push_back(name);
  for (const auto& key : plan.cached_bindings()) {
    ffi::json::Array values;
    for (int64_t v : key) values.push_back(v);
    bindings.push_back(values);
  }
  // what the plans compute in (the same for every plan: it depends on the request and the
  // machine only, so a symbolic region can say it before its first plan)
  std::string precision_note;
  const std::string precision = EffectivePrecision(graph.precision, &precision_note);
  ffi::json::Object info{{"threads", plan.threads()},
                         {"precision", ffi::String(precision)},
                         {"precision_requested", ffi::String(graph.precision)},
                         {"precision_note", ffi::String(precision_note)},
                         {"contexts", plan.contexts()},
                         {"shared_bytes", plan.shared_bytes()},
                         {"context_bytes", plan.context_bytes()},
                         {"contention_plans", contention_plans},
                         {"symbols", symbols},
                         {"plans", plan.plans()},
                         {"plans_made", plan.plans_made()},
                         {"plan_cache_limit", PlanCacheLimit()},
                         {"bindings", bindings}};
  return ffi::json::Stringify(info);
}

/*! \brief get_profile's JSON: one object per step {phase, label, op, impl, layouts, calls, seconds}. */
ffi::String ProfileJson(const CompiledRegion& plan) {
  ffi::json::Array steps;
  for (const StepProfile& p : plan.Profile()) {
    steps.push_back(ffi::json::Object{{"phase", p.phase},     {"label", p.label},
                                      {"op", p.op},           {"impl", p.impl},
                                      {"layouts", p.layouts}, {"calls", p.calls},
                                      {"seconds", p.seconds}});
  }
  return ffi::json::Stringify(steps);
}

/*!
 * \brief Plans for fewer threads than a module's own (contention, threading.h), by thread count,
 *        each made and filled on first need; they share the module's prepared weights.
 *        oneDNN's OpenMP primitives fix their thread split at creation and ask the OpenMP
 *        runtime for exactly that many threads (num_threads clause), so running the module's
 *        primitives under omp_set_num_threads(1) would still start a team; fewer threads need
 *        primitives (and possibly weight layouts) of their own.
 */
class FewerThreadPlans {
 public:
  explicit FewerThreadPlans(const RegionGraph& graph) : graph_(graph) {}

  /*! \brief The plan made for `threads` (< the module's count); it reads \p main's prepared
   *         weights (a layout both want is one copy) and fills those only it wants at its first call. */
  CompiledRegion& Get(int threads, const CompiledRegion& main) {
    std::lock_guard<std::mutex> lock(fewer_mu_);
    if (fewer_.size() <= static_cast<size_t>(threads)) fewer_.resize(threads + 1);
    if (!fewer_[threads]) fewer_[threads] = std::make_unique<CompiledRegion>(graph_, threads, main.weights());
    return *fewer_[threads];
  }

  /*! \brief The thread counts of the plans made so far. */
  ffi::json::Array ThreadCounts() const {
    ffi::json::Array contention_plans;
    std::lock_guard<std::mutex> lock(fewer_mu_);
    for (size_t n = 0; n < fewer_.size(); ++n) {
      if (fewer_[n]) contention_plans.push_back(static_cast<int64_t>(n));
    }
    return contention_plans;
  }

 private:
  const RegionGraph& graph_;
  mutable std::mutex fewer_mu_;
  std::vector<std::unique_ptr<CompiledRegion>> fewer_;
};

class RegionModuleObj : public ffi::ModuleObj {
 public:
  explicit RegionModuleObj(std::string graph_json)
      : graph_json_(std::move(graph_json)), graph_(ParseRegionGraph(graph_json_)) {
    // a document's "threads" caps the process's count (a tuner measured this region faster so)
    const int threads = graph_.threads > 0 ? std::min(graph_.threads, RegionThreads()) : RegionThreads();
    plan_ = std::make_unique<CompiledRegion>(graph_, threads);
    for (const auto& c : graph_.constants) const_names_.push_back(c.name);
  }

  const char* kind() const final { return "byoc_hetero"; }

  int GetPropertyMask() const final {
    return ffi::Module::kBinarySerializable | ffi::Module::kRunnable;
  }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    ffi::ObjectPtr<ffi::Object> self = ffi::GetObjectPtr<ffi::Object>(this);
    if (name == graph_.symbol) {
      return ffi::Function::FromPacked([self, this](ffi::PackedArgs args, ffi::Any* rv) {
        this->Run(args);
      });
    }
    if (name == "__init_" + graph_.symbol) {
      return ffi::Function::FromPacked([self, this](ffi::PackedArgs args, ffi::Any* rv) {
        this->Init(args);
        *rv = 0;
      });
    }
    if (name == "get_symbol") {
      return ffi::Function::FromTyped([self, this]() { return ffi::String(graph_.symbol); });
    }
    if (name == "get_const_vars") {
      return ffi::Function::FromTyped([self, this]() { return const_names_; });
    }
    if (name == "get_graph_json") {
      return ffi::Function::FromTyped([self, this]() { return ffi::String(graph_json_); });
    }
    if (name == "get_runtime_info") {
      // RuntimeInfoJson: how the module runs
      return ffi::Function::FromTyped(
          [self, this]() { return RuntimeInfoJson(graph_, *plan_, fewer_.ThreadCounts()); });
    }
    if (name == "set_profiling") {
      return ffi::Function::FromTyped([self, this](bool on) {
        profiling_ = on;
        plan_->SetProfiling(on);
      });
    }
    if (name == "reset_profile") {
      return ffi::Function::FromTyped([self, this]() { plan_->ResetProfile(); });
    }
    if (name == "get_profile") {
      return ffi::Function::FromTyped([self, this]() { return ProfileJson(*plan_); });
    }
    if (name == "get_plan") {
      return ffi::Function::FromTyped([self, this]() {
        ffi::Array<ffi::String> lines;
        for (const auto& l : plan_->Describe()) lines.push_back(l);
        return lines;
      });
    }
    return std::nullopt;
  }

  ffi::Bytes SaveToBytes() const final {
    std::string out(kBytesMagic);
    out += DigestHex(Digest(graph_json_.data(), graph_json_.size()));
    out += graph_json_;
    return ffi::Bytes(out);
  }

  ffi::String InspectSource(const ffi::String& format) const final { return graph_json_; }

 private:
  void Run(const ffi::PackedArgs& args) {
    const size_t num_in = graph_.inputs.size(), num_out = graph_.outputs.size();
    const size_t num_shape = graph_.shape_args.size();
    if (static_cast<size_t>(args.size()) != num_in + num_shape + num_out) {
      TVM_FFI_THROW(ValueError) << graph_.where() << ": expected " << num_in + num_shape + num_out
                                << " arguments (" << num_in << " inputs"
                                << (num_shape ? " and " + std::to_string(num_shape) + " shapes" : "")
                                << " then " << num_out << " outputs), got " << args.size();
    }
    CheckConstantsGiven();
    if (graph_.symbolic() && EmptyCall(args)) return;
    std::vector<void*> buffers(num_in + num_out);
    std::vector<std::vector<int64_t>> shapes(num_in + num_out);
    size_t arg = 0;
    for (size_t i = 0; i < buffers.size(); ++i, ++arg) {
      // Shape values (a reshape's symbolic target) are skipped: the tensors bind the symbols.
      for (int p : graph_.shape_args) arg += static_cast<size_t>(p) == arg;
      const bool is_input = i < num_in;
      const int t = is_input ? graph_.inputs[i] : graph_.outputs[i - num_in];
      auto what = [&, i, arg, t] {
        std::ostringstream os;
        os << graph_.where() << ": argument " << arg << " (" << (is_input ? "input " : "output ")
           << (is_input ? i : i - num_in) << ", tensor " << t << ")";
        return os.str();
      };
      std::optional<DLTensor*> dl = args[arg].try_cast<DLTensor*>();
      if (!dl.has_value() || *dl == nullptr) {
        TVM_FFI_THROW(ValueError) << what() << ": expected a Tensor, got "
                                  << args[arg].GetTypeKey();
      }
      const DLTensor& tensor = **dl;
      buffers[i] = CheckTensor(tensor, graph_.tensors[t], !graph_.symbolic(), what);
      if (graph_.symbolic()) shapes[i].assign(tensor.shape, tensor.shape + tensor.ndim);  // static: checked above
    }
    if (profiling_.load(std::memory_order_relaxed)) {
      // A profile counts the steps of the module's own plan: while profiling, every call runs it.
      plan_->Execute(buffers, shapes);
      return;
    }
    // Calls shorter than 200 us are watched one in 16: two getrusage (about 1 us each) would
    // be a visible share of them, and the level they read is shared with the longer calls.
    const bool watch = last_call_ns_.load(std::memory_order_relaxed) >= 200000 ||
                       calls_.fetch_add(1, std::memory_order_relaxed) % 16 == 0;
    const int64_t one_time = OneTimeWorkCount();
    AdaptiveCall call(plan_->threads(), watch);
    (call.threads() == plan_->threads() ? *plan_ : fewer_.Get(call.threads(), *plan_)).Execute(buffers, shapes);
    if (OneTimeWorkCount() != one_time) call.Ignore();  // it planned or prepared weights (threading.h)
    last_call_ns_.store(static_cast<int64_t>(call.elapsed() * 1e9), std::memory_order_relaxed);
  }

  void Init(const ffi::PackedArgs& args) {
    const std::string fn = "__init_" + graph_.symbol;
    if (args.size() != 1) {
      TVM_FFI_THROW(ValueError) << graph_.where() << ": " << fn
                                << " expects one argument (the array of constants), got "
                                << args.size();
    }
    std::optional<ffi::Array<ffi::Tensor>> consts = args[0].try_cast<ffi::Array<ffi::Tensor>>();
    if (!consts.has_value()) {
      TVM_FFI_THROW(ValueError) << graph_.where() << ": " << fn
                                << " expects an array of tensors, got " << args[0].GetTypeKey();
    }
    if (consts->size() != graph_.constants.size()) {
      TVM_FFI_THROW(ValueError) << graph_.where() << ": " << fn << " expected "
                                << graph_.constants.size() << " constants (" << NameList()
                                << "), got " << consts->size();
    }
    if (Placeholders(*consts, fn)) {
      // The library was saved with its constants external (bh.llm: weights.bin): they arrive in a
      // later __init_ (digest-checked then). Placeholders after the real constants change nothing.
      if (!constants_checked_.load()) awaiting_constants_.store(true);
      return;
    }
    std::vector<const void*> data;
    // the digest check reads every constant: the pages of one mapped from a weights file go back right after
    // (bh.llm.load), so they are not all resident at once (weights.h ReleaseFilePages)
    const std::vector<std::pair<uintptr_t, uintptr_t>> mapped =
        constants_checked_.load() ? std::vector<std::pair<uintptr_t, uintptr_t>>() : ReadOnlyFileMappings();
    for (size_t i = 0; i < consts->size(); ++i) {
      const auto& c = graph_.constants[i];
      ffi::Tensor tensor = (*consts)[i];
      std::string what = graph_.where() + ": " + fn + " constant " + std::to_string(i) + " ('" +
                         c.name + "', tensor " + std::to_string(c.tensor) + ")";
      if (!tensor.defined()) TVM_FFI_THROW(ValueError) << what << ": expected a Tensor, got None";
      data.push_back(CheckTensor(*tensor.GetDLTensorPtr(), graph_.tensors[c.tensor], true, [&] { return what; }));
      // The first constants are those exported with the document (TVM's const loader calls __init_
      // once, at the first call): they must match the digests.  A later __init_ replaces them on
      // purpose (docs/region-format.md, "Calling convention") and is not compared.
      if (!constants_checked_.load()) {
        const size_t bytes = CheckConstantDigest(c, *tensor.GetDLTensorPtr(), data.back(), what);
        ReleaseFilePages(data.back(), bytes, mapped);
      }
    }
    // The tensors are kept (a reference, no copy; TVM's const loader holds them too): plans made
    // later, at new shapes of a symbolic region or for fewer threads, prepare their weights from them.
    constants_checked_.store(true);
    auto owner = std::make_shared<ffi::Array<ffi::Tensor>>(*consts);
    plan_->LoadConstants(data, owner);  // the contention plans share its weights (FewerThreadPlans)
    awaiting_constants_.store(false);
  }

  /*! \brief RuntimeError when the constants are external (placeholders came) and were never given. */
  void CheckConstantsGiven() const {
    if (!awaiting_constants_.load(std::memory_order_relaxed)) return;
    TVM_FFI_THROW(RuntimeError) << graph_.where() << ": its " << graph_.constants.size()
                                << " constants are not in the library (saved with them in a file of their own, "
                                   "as the Generator.save of bh.llm writes weights.bin) and were never given: "
                                   "load it with bh.llm.load, or call __init_" << graph_.symbol << " with them";
  }

  /*!
   * \brief Whether \p consts are placeholders: every one a tensor of no elements where the document's
   *        tensor has some (what the const loader of a library saved with its constants external
   *        holds). ValueError when some are and others are not (all or none).
   */
  bool Placeholders(const ffi::Array<ffi::Tensor>& consts, const std::string& fn) const {
    size_t count = 0, first = 0, sized = 0;  // sized: constants the document gives elements
    for (size_t i = 0; i < consts.size(); ++i) {
      const ffi::Tensor& tensor = consts[i];
      if (!tensor.defined() || graph_.tensors[graph_.constants[i].tensor].numel() == 0) continue;
      ++sized;
      const DLTensor* dl = tensor.GetDLTensorPtr();
      int64_t numel = 1;
      for (int d = 0; d < dl->ndim; ++d) numel *= dl->shape[d];
      if (numel == 0 && count++ == 0) first = i;
    }
    if (count != 0 && count != sized) {
      TVM_FFI_THROW(ValueError) << graph_.where() << ": " << fn << " got " << count << " placeholder constants "
                                << "(no elements; the first: " << first << ", '" << graph_.constants[first].name
                                << "') among " << sized << ": expected every constant's data, or a "
                                   "placeholder for every one (a library saved with its constants external)";
    }
    return count != 0;
  }

  /*!
   * \brief Whether a call of a symbolic region has an input with a zero-size dim (a batch of 0):
   *        then every output must be empty too, and there is nothing to compute (the VM allocated
   *        the empty outputs; llvm and ONNX Runtime return such empty results).  An output that
   *        would not be empty (a reduction over the empty axis) is an InputError: the kernels
   *        plan dims >= 1 only (docs/reliability.md).
   */
  bool EmptyCall(const ffi::PackedArgs& args) const {
    const size_t num_in = graph_.inputs.size();
    std::vector<int64_t> numel;
    for (int i = 0; i < args.size(); ++i) {
      std::optional<DLTensor*> dl = args[i].try_cast<DLTensor*>();
      if (!dl.has_value() || *dl == nullptr) continue;  // a shape argument (or a bad one: Run says)
      int64_t n = 1;
      for (int d = 0; d < (*dl)->ndim; ++d) n *= (*dl)->shape[d];
      numel.push_back(n);
    }
    if (numel.size() != num_in + graph_.outputs.size()) return false;  // Run reports the count
    bool empty_input = false;
    for (size_t i = 0; i < num_in; ++i) empty_input |= numel[i] == 0;
    if (!empty_input) return false;
    for (size_t o = 0; o < graph_.outputs.size(); ++o) {
      if (numel[num_in + o] != 0) {
        TVM_FFI_THROW(InputError) << graph_.where() << ": an input has a zero-size dim, but output " << o
                                  << " would hold " << numel[num_in + o]
                                  << " elements; the runtime runs a zero-size batch only when every output "
                                     "of the region is empty too";
      }
    }
    return true;
  }

  /*! \brief A constant whose document carries a digest (version 4) must have exactly those bytes. */
  /*! \return the bytes it read (0 without a digest). */
  static size_t CheckConstantDigest(const ConstantInfo& c, const DLTensor& t, const void* data,
                                    const std::string& what) {
    if (c.digest.empty()) return 0;
    size_t bytes = (t.dtype.bits * t.dtype.lanes + 7) / 8;
    for (int d = 0; d < t.ndim; ++d) bytes *= static_cast<size_t>(t.shape[d]);
    const std::string got = DigestHex(Digest(data, bytes));
    if (got != c.digest) {
      TVM_FFI_THROW(IntegrityError) << what << ": the data are damaged (digest " << got << ", the region document "
                                    << "recorded " << c.digest << " at export); re-export the library";
    }
    return bytes;
  }

  std::string NameList() const {
    std::string s;
    for (const auto& c : graph_.constants) s += (s.empty() ? "" : ", ") + c.name;
    return s.empty() ? "none" : s;
  }

  std::string graph_json_;
  RegionGraph graph_;
  std::unique_ptr<CompiledRegion> plan_;
  ffi::Array<ffi::String> const_names_;
  FewerThreadPlans fewer_{graph_};  // contention (threading.h)
  std::atomic<int64_t> last_call_ns_{0};
  std::atomic<uint32_t> calls_{0};
  std::atomic<bool> profiling_{false};
  std::atomic<bool> constants_checked_{false};  // the first __init_ passed the digests
  std::atomic<bool> awaiting_constants_{false};  // placeholders came, the external constants not yet
};

}  // namespace

ffi::Module CreateRegionModule(const std::string& graph_json) {
  return ffi::Module(ffi::make_object<RegionModuleObj>(graph_json));
}

namespace {

/*! \brief Bytes of a damaged blob made fit for a message (UTF-8): non-printable ones become '?'. */
std::string Printable(const char* data, size_t size) {
  std::string s(data, size);
  for (char& ch : s) ch = (ch >= 32 && ch < 127) ? ch : '?';
  return s;
}

/*!
 * \brief The region's symbol as the (unverified) document text spells it, for naming a damaged
 *        region: printable characters after the first "symbol", at most 200; "?" when none.
 */
std::string SymbolOfDamaged(const std::string& text) {
  const std::string key = "\"symbol\"";
  size_t at = text.find(key);
  if (at == std::string::npos) return "?";
  at = text.find('"', text.find(':', at + key.size()));
  if (at == std::string::npos) return "?";
  std::string name;
  for (size_t i = at + 1; i < text.size() && name.size() < 200 && text[i] != '"'; ++i) {
    name += (text[i] >= 32 && text[i] < 127) ? text[i] : '?';
  }
  return name.empty() ? "?" : name;
}

}  // namespace

ffi::Module LoadRegionModuleFromBytes(const ffi::Bytes& bytes) {
  const size_t magic_len = std::strlen(kBytesMagic), digest_len = 16;
  const std::string head = Printable(bytes.data(), std::min<size_t>(bytes.size(), magic_len));
  if (head == kBytesMagicV1) {
    // a library exported before the digests (format versions 1-3) loads as it did, unchecked: its
    // documents carry no digest (issue 23: libraries exported earlier keep working); a re-export
    // adds them.  Its document follows the magic directly; anything else is damage.
    if (bytes.size() == magic_len || bytes.data()[magic_len] != '{') {
      TVM_FFI_THROW(IntegrityError) << "ffi.Module.load_from_bytes.byoc_hetero: the bytes say '" << kBytesMagicV1
                                    << "' (an older byoc_hetero's format, without digests), but no region "
                                       "document follows: the library is damaged; re-export it";
    }
    return CreateRegionModule(std::string(bytes.data() + magic_len, bytes.size() - magic_len));
  }
  if (bytes.size() < magic_len + digest_len || head != kBytesMagic) {
    TVM_FFI_THROW(IntegrityError) << "ffi.Module.load_from_bytes.byoc_hetero: expected the magic '" << kBytesMagic
                                  << "' and a digest at the start of the " << bytes.size() << " bytes, got '"
                                  << head << "'";
  }
  const std::string recorded = Printable(bytes.data() + magic_len, digest_len);
  std::string text(bytes.data() + magic_len + digest_len, bytes.size() - magic_len - digest_len);
  const std::string got = DigestHex(Digest(text.data(), text.size()));
  if (got != recorded) {
    TVM_FFI_THROW(IntegrityError) << "region '" << SymbolOfDamaged(text)
                                  << "' (name read from the damaged document): the region document is damaged ("
                                  << text.size() << " bytes with digest " << got << ", recorded at export: '"
                                  << recorded << "'); re-export the library";
  }
  return CreateRegionModule(text);
}

namespace {

/*! \brief Register a global once; a second copy of the extension must not abort the process. */
template <typename F>
void DefineGlobalOnce(const char* name, F&& f) {
  if (ffi::Function::GetGlobal(name).has_value()) return;
  tvm::ffi::reflection::GlobalDef().def(name, std::forward<F>(f));
}

/*!
 * \brief byoc_hetero.runtime.check_dim_ranges(tensor, where, shape_text, (axis, symbol, min, max)...)
 *        -> tensor: the check bh.partition puts at the start of a function whose symbolic dims
 *        have declared ranges (byoc_hetero/ranges.py), so that the built module checks them
 *        however it is run (a plain relax.VirtualMachine, after export_library/load_module).
 *        min/max of -1: an open end.  A dim outside its range is an InputError, worded as
 *        byoc_hetero.inputs.check words it; the tensor comes back unchanged (the function's
 *        body reads it, so no pass drops the check or moves a use of the tensor before it).
 */
void CheckDimRanges(ffi::PackedArgs args, ffi::Any* rv) {
  if (args.size() < 3 || (args.size() - 3) % 4 != 0) {
    TVM_FFI_THROW(ValueError) << "byoc_hetero.runtime.check_dim_ranges: expected (tensor, where, shape, "
                                 "then (axis, symbol, min, max) per checked dim), got "
                              << args.size() << " arguments";
  }
  std::optional<DLTensor*> dl = args[0].try_cast<DLTensor*>();
  if (!dl.has_value() || *dl == nullptr) {
    TVM_FFI_THROW(ValueError) << "byoc_hetero.runtime.check_dim_ranges: expected a Tensor first, got "
                              << args[0].GetTypeKey();
  }
  const DLTensor& t = **dl;
  for (int i = 3; i < args.size(); i += 4) {
    const int64_t axis = args[i].cast<int64_t>();
    const int64_t lo = args[i + 2].cast<int64_t>(), hi = args[i + 3].cast<int64_t>();
    if (axis < 0 || axis >= t.ndim) {
      // the VM matched the shape against the signature before: a malformed check, not bad input
      TVM_FFI_THROW(ValueError) << args[1].cast<ffi::String>() << ": the range check names dim " << axis
                                << " of a rank-" << t.ndim << " tensor";
    }
    const int64_t n = t.shape[axis];
    if ((lo != RegionGraph::kNoBound && n < lo) || (hi != RegionGraph::kNoBound && n > hi)) {
      TVM_FFI_THROW(InputError) << args[1].cast<ffi::String>() << ": dim " << axis << " ("
                                << args[i + 1].cast<ffi::String>() << ") is " << n
                                << ", outside its declared range " << RangeText(lo, hi) << " (shape "
                                << args[2].cast<ffi::String>() << ", got " << ShapeOf(t) << ")";
    }
  }
  *rv = args[0];
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  if (!ffi::Function::GetGlobal("byoc_hetero.runtime.check_dim_ranges").has_value()) {
    tvm::ffi::reflection::GlobalDef().def_packed("byoc_hetero.runtime.check_dim_ranges", CheckDimRanges);
  }
  DefineGlobalOnce("byoc_hetero.runtime.create",
                   [](const ffi::String& graph_json) { return CreateRegionModule(graph_json); });
  DefineGlobalOnce("ffi.Module.load_from_bytes.byoc_hetero",
                   [](const ffi::Bytes& bytes) { return LoadRegionModuleFromBytes(bytes); });
  DefineGlobalOnce("byoc_hetero.runtime.save_to_bytes", [](const ffi::Module& mod) {
    if (!(mod->GetPropertyMask() & ffi::Module::kBinarySerializable)) {
      TVM_FFI_THROW(ValueError) << "byoc_hetero.runtime.save_to_bytes: module of kind '"
                                << mod->kind() << "' is not binary serializable";
    }
    return mod->SaveToBytes();
  });
  DefineGlobalOnce("byoc_hetero.runtime.supported_ops", []() {
    ffi::Array<ffi::String> ops;
    for (const auto& op : SupportedOps()) ops.push_back(op);
    return ops;
  });
}

}  // namespace byoc_hetero
