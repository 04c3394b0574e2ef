/*!
 * \file cuda/cuda_region.cc
 * \brief Parsing and checking a cuda region document (cuda_region.h).
 */
#include "cuda/cuda_region.h"

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>

#include <set>
#include <string>
#include <utility>

namespace byoc_hetero {
namespace cuda {

namespace ffi = tvm::ffi;
using JsonObject = ffi::Map<ffi::Any, ffi::Any>;
using JsonArray = ffi::Array<ffi::Any>;

namespace {

/*! \brief Field access with messages naming the region and the field. */
class Reader {
 public:
  Reader(const CudaRegion& region, std::string path, const ffi::Any& value) : region_(region), path_(std::move(path)) {
    auto obj = value.as<JsonObject>();
    if (!obj.has_value()) Fail("expected a JSON object");
    obj_ = *obj;
  }
  [[noreturn]] void Fail(const std::string& what) const {
    TVM_FFI_THROW(ValueError) << region_.where() << ": " << (path_.empty() ? "document" : path_) << ": " << what;
  }
  bool Has(const char* key) const { return obj_.count(ffi::String(key)) != 0; }
  ffi::Any Get(const char* key) const {
    if (!Has(key)) Fail(std::string("missing field '") + key + "'");
    return obj_.at(ffi::String(key));
  }
  std::string Str(const char* key) const {
    auto s = Get(key).as<ffi::String>();
    if (!s.has_value()) Fail(std::string("field '") + key + "' must be a string");
    return std::string(*s);
  }
  int64_t Int(const char* key) const {
    ffi::Any v = Get(key);
    if (v.type_index() != ffi::TypeIndex::kTVMFFIInt) Fail(std::string("field '") + key + "' must be an integer");
    return v.cast<int64_t>();
  }
  JsonArray Arr(const char* key) const {
    auto a = Get(key).as<JsonArray>();
    if (!a.has_value()) Fail(std::string("field '") + key + "' must be an array");
    return *a;
  }
  std::vector<int64_t> Ints(const char* key) const {
    std::vector<int64_t> out;
    for (const ffi::Any& v : Arr(key)) {
      if (v.type_index() != ffi::TypeIndex::kTVMFFIInt) Fail(std::string("field '") + key + "' must hold integers");
      out.push_back(v.cast<int64_t>());
    }
    return out;
  }
  const std::string& path() const { return path_; }

 private:
  const CudaRegion& region_;
  std::string path_;
  JsonObject obj_;
};

int TensorId(const Reader& at, const CudaRegion& g, int64_t id) {
  if (id < 0 || id >= static_cast<int64_t>(g.shapes.size())) {
    at.Fail("tensor id " + std::to_string(id) + " out of range (" + std::to_string(g.shapes.size()) + " tensors)");
  }
  return static_cast<int>(id);
}

void ReadTensors(const Reader& doc, CudaRegion* g) {
  const JsonArray tensors = doc.Arr("tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    Reader t(*g, "tensors[" + std::to_string(i) + "]", tensors[i]);
    if (t.Str("dtype") != "float32") t.Fail("dtype '" + t.Str("dtype") + "' (the cuda_vendor backend runs float32)");
    std::vector<int64_t> shape = t.Ints("shape");
    for (int64_t d : shape) {
      if (d < 1) t.Fail("a dim of " + std::to_string(d) + " (static dims >= 1 only)");
    }
    g->shapes.push_back(std::move(shape));
  }
}

GemmShape ReadGemm(const Reader& attrs, size_t num_inputs) {
  GemmShape s;
  s.batch = attrs.Int("batch");
  s.m = attrs.Int("m");
  s.n = attrs.Int("n");
  s.k = attrs.Int("k");
  s.transpose_b = attrs.Int("transpose_b") != 0;
  s.batched_weight = attrs.Int("batched_weight") != 0;
  s.activation = attrs.Str("activation");
  s.has_bias = num_inputs == 3;
  if (s.batch < 1 || s.m < 1 || s.n < 1 || s.k < 1) attrs.Fail("batch, m, n, k must be >= 1");
  s.Epilogue();  // checks the activation
  return s;
}

/*! \brief Each operand's element count must be what the gemm reads or writes. */
void CheckGemmOperands(const Reader& at, const CudaRegion& g, const GemmNode& node) {
  const GemmShape& s = node.shape;
  const int64_t want[] = {s.batch * s.m * s.k, (s.batched_weight ? s.batch : 1) * s.n * s.k, s.n};
  const char* names[] = {"data", "weight", "bias"};
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (g.Numel(node.inputs[i]) != want[i]) {
      at.Fail(std::string(names[i]) + " (tensor " + std::to_string(node.inputs[i]) + ") has " +
              std::to_string(g.Numel(node.inputs[i])) + " elements, " + s.Text() + " reads " +
              std::to_string(want[i]));
    }
  }
  if (g.Numel(node.output) != s.batch * s.m * s.n) {
    at.Fail("output (tensor " + std::to_string(node.output) + ") has " + std::to_string(g.Numel(node.output)) +
            " elements, " + s.Text() + " writes " + std::to_string(s.batch * s.m * s.n));
  }
}

void ReadNodes(const Reader& doc, CudaRegion* g, std::set<int>* defined) {
  const JsonArray nodes = doc.Arr("nodes");
  for (size_t i = 0; i < nodes.size(); ++i) {
    Reader n(*g, "nodes[" + std::to_string(i) + "]", nodes[i]);
    if (n.Str("op") != "gemm") n.Fail("op '" + n.Str("op") + "' (the cuda_vendor backend runs gemm nodes)");
    GemmNode node;
    for (int64_t id : n.Ints("inputs")) {
      node.inputs.push_back(TensorId(n, *g, id));
      if (!defined->count(node.inputs.back())) n.Fail("reads tensor " + std::to_string(id) + " before it is written");
    }
    if (node.inputs.size() != 2 && node.inputs.size() != 3) n.Fail("expected inputs (data, weight[, bias])");
    node.output = TensorId(n, *g, n.Int("output"));
    if (!defined->insert(node.output).second) n.Fail("writes tensor " + std::to_string(node.output) + " twice");
    node.shape = ReadGemm(Reader(*g, n.path() + ".attrs", n.Get("attrs")), node.inputs.size());
    CheckGemmOperands(n, *g, node);
    g->nodes.push_back(std::move(node));
  }
}

}  // namespace

int64_t CudaRegion::Numel(int t) const {
  int64_t n = 1;
  for (int64_t d : shapes[t]) n *= d;
  return n;
}

CudaRegion ParseCudaRegion(const std::string& json_text) {
  CudaRegion g;
  ffi::String error;
  ffi::Any root = ffi::json::Parse(ffi::String(json_text), &error);
  if (!error.empty()) TVM_FFI_THROW(ValueError) << g.where() << ": malformed JSON: " << std::string(error);
  Reader doc(g, "", root);
  if (doc.Has("symbol")) g.symbol = doc.Str("symbol");
  if (doc.Str("format") != "byoc_hetero.cuda_region" || doc.Int("version") != 1) {
    doc.Fail("expected format 'byoc_hetero.cuda_region' version 1, got '" + doc.Str("format") + "' version " +
             std::to_string(doc.Int("version")));
  }
  ReadTensors(doc, &g);
  std::set<int> defined;
  for (int64_t id : doc.Ints("inputs")) defined.insert(g.inputs.emplace_back(TensorId(doc, g, id)));
  const JsonArray consts = doc.Arr("constants");
  for (size_t i = 0; i < consts.size(); ++i) {
    Reader c(g, "constants[" + std::to_string(i) + "]", consts[i]);
    g.constants.push_back({c.Str("name"), TensorId(c, g, c.Int("tensor"))});
    defined.insert(g.constants.back().tensor);
  }
  ReadNodes(doc, &g, &defined);
  for (int64_t id : doc.Ints("outputs")) {
    g.outputs.push_back(TensorId(doc, g, id));
    bool written = false;
    for (const auto& n : g.nodes) written |= n.output == g.outputs.back();
    if (!written) doc.Fail("output tensor " + std::to_string(id) + " is written by no node");
  }
  return g;
}

}  // namespace cuda
}  // namespace byoc_hetero
