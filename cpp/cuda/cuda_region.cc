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

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

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
    const std::string dtype = t.Str("dtype");
    if (dtype != "float32" && dtype != "float16") {
      t.Fail("dtype '" + dtype + "' (the cuda_vendor backend runs float32, and float16 gemms)");
    }
    g->bits.push_back(dtype == "float32" ? 32 : 16);
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
  if (attrs.Has("compute")) s.compute = attrs.Str("compute");  // version 1: fp32
  s.has_bias = num_inputs == 3;
  if (s.batch < 1 || s.m < 1 || s.n < 1 || s.k < 1) attrs.Fail("batch, m, n, k must be >= 1");
  s.Epilogue();  // checks the activation
  return s;
}

/*! \brief The bits of every tensor a node reads and writes (32 or 16); they must agree. */
int NodeBits(const Reader& at, const CudaRegion& g, const Node& node) {
  const int bits = g.bits[node.output];
  for (int t : node.inputs) {
    if (g.bits[t] != bits) {
      at.Fail("tensor " + std::to_string(t) + " is float" + std::to_string(g.bits[t]) + ", the output float" +
              std::to_string(bits) + ": a node reads and writes one dtype");
    }
  }
  return bits;
}

/*! \brief A gemm node: inputs (data, weight[, bias]), each operand's element count what it reads or writes. */
void ReadGemmNode(const Reader& at, const CudaRegion& g, Node* node) {
  if (node->inputs.size() != 2 && node->inputs.size() != 3) at.Fail("expected inputs (data, weight[, bias])");
  node->gemm = ReadGemm(Reader(g, at.path() + ".attrs", at.Get("attrs")), node->inputs.size());
  node->gemm.bits = NodeBits(at, g, *node);
  const std::string& compute = node->gemm.compute;
  if (compute != "fp32" && (node->gemm.bits != 32 || (compute != "tf32" && compute != "fp16"))) {
    at.Fail("compute '" + compute + "' on float" + std::to_string(node->gemm.bits) +
            " tensors (expected fp32, or tf32 / fp16 for float32 tensors)");
  }
  const GemmShape& s = node->gemm;
  const int64_t want[] = {s.batch * s.m * s.k, (s.batched_weight ? s.batch : 1) * s.n * s.k, s.n};
  const char* names[] = {"data", "weight", "bias"};
  for (size_t i = 0; i < node->inputs.size(); ++i) {
    if (g.Numel(node->inputs[i]) != want[i]) {
      at.Fail(std::string(names[i]) + " (tensor " + std::to_string(node->inputs[i]) + ") has " +
              std::to_string(g.Numel(node->inputs[i])) + " elements, " + s.Text() + " reads " +
              std::to_string(want[i]));
    }
  }
  if (g.Numel(node->output) != s.batch * s.m * s.n) {
    at.Fail("output (tensor " + std::to_string(node->output) + ") has " + std::to_string(g.Numel(node->output)) +
            " elements, " + s.Text() + " writes " + std::to_string(s.batch * s.m * s.n));
  }
}

/*! \brief Two integers of field key (a conv2d's [h, w] strides, padding, dilation). */
std::pair<int64_t, int64_t> Pair(const Reader& attrs, const char* key) {
  std::vector<int64_t> v = attrs.Ints(key);
  if (v.size() != 2) attrs.Fail(std::string("field '") + key + "' must hold 2 integers ([h, w])");
  return {v[0], v[1]};
}

/*! \brief Tensor t's shape must be want (a conv2d operand). */
void ExpectShape(const Reader& at, const CudaRegion& g, int t, const std::vector<int64_t>& want, const char* name,
                 const ConvShape& s) {
  if (g.shapes[t] != want) {
    at.Fail(std::string(name) + " (tensor " + std::to_string(t) + ") has shape " + ShapeText(g.shapes[t]) + ", " +
            s.Text() + " expects " + ShapeText(want));
  }
}

/*! \brief A conv2d node: inputs (data, weight[, bias][, residual]); dims from its tensors, the rest
 *         (strides, padding, dilation, groups, activation, bias, residual) from its attrs. */
void ReadConvNode(const Reader& at, const CudaRegion& g, Node* node) {
  const Reader attrs(g, at.path() + ".attrs", at.Get("attrs"));
  ConvShape& s = node->conv;
  s.has_bias = attrs.Int("bias") != 0;
  s.has_residual = attrs.Int("residual") != 0;
  const size_t want_inputs = 2 + s.has_bias + s.has_residual;
  if (node->inputs.size() != want_inputs) {
    at.Fail("expected " + std::to_string(want_inputs) + " inputs (data, weight" + (s.has_bias ? ", bias" : "") +
            (s.has_residual ? ", residual" : "") + "), got " + std::to_string(node->inputs.size()));
  }
  if (NodeBits(at, g, *node) != 32) at.Fail("a float16 conv2d (the cuda_vendor backend runs conv2d in float32)");
  const auto& data = g.shapes[node->inputs[0]];
  const auto& weight = g.shapes[node->inputs[1]];
  const auto& out = g.shapes[node->output];
  if (data.size() != 4 || weight.size() != 4 || out.size() != 4) at.Fail("conv2d needs 4-D data, weight and output");
  std::tie(s.n, s.c, s.h, s.w) = std::make_tuple(data[0], data[1], data[2], data[3]);
  std::tie(s.k, s.r, s.s) = std::make_tuple(weight[0], weight[2], weight[3]);
  std::tie(s.out_h, s.out_w) = std::make_pair(out[2], out[3]);
  std::tie(s.stride_h, s.stride_w) = Pair(attrs, "strides");
  std::tie(s.pad_h, s.pad_w) = Pair(attrs, "padding");
  std::tie(s.dilation_h, s.dilation_w) = Pair(attrs, "dilation");
  s.groups = attrs.Int("groups");
  s.activation = attrs.Str("activation");
  if (std::string why = s.Problem(); !why.empty()) attrs.Fail(s.Text() + ": " + why);
  ExpectShape(at, g, node->inputs[1], s.WeightShape(), "weight", s);
  ExpectShape(at, g, node->output, s.OutShape(), "output", s);
  if (s.has_bias && g.Numel(node->inputs[2]) != s.k) {
    at.Fail("bias (tensor " + std::to_string(node->inputs[2]) + ") has " + std::to_string(g.Numel(node->inputs[2])) +
            " elements, one per output channel (" + std::to_string(s.k) + ") expected");
  }
  if (s.has_residual) ExpectShape(at, g, node->inputs.back(), s.OutShape(), "residual", s);
}

using NodeReader = void (*)(const Reader&, const CudaRegion&, Node*);

/*! \brief The node ops a document of `version` may hold, and how each is read. */
const std::map<std::string, NodeReader>& NodeReaders(int64_t version) {
  static const std::map<std::string, NodeReader> v1{{"gemm", ReadGemmNode}};
  static const std::map<std::string, NodeReader> v2{{"gemm", ReadGemmNode}, {"conv2d", ReadConvNode}};
  return version == 1 ? v1 : v2;
}

void ReadNodes(const Reader& doc, int64_t version, CudaRegion* g, std::set<int>* defined) {
  const auto& readers = NodeReaders(version);
  const JsonArray nodes = doc.Arr("nodes");
  for (size_t i = 0; i < nodes.size(); ++i) {
    Reader n(*g, "nodes[" + std::to_string(i) + "]", nodes[i]);
    Node node;
    node.op = n.Str("op");
    auto reader = readers.find(node.op);
    if (reader == readers.end()) {
      n.Fail("op '" + node.op + "' (a version " + std::to_string(version) + " document holds " +
             (version == 1 ? "gemm nodes" : "gemm and conv2d nodes") + ")");
    }
    for (int64_t id : n.Ints("inputs")) {
      node.inputs.push_back(TensorId(n, *g, id));
      if (!defined->count(node.inputs.back())) n.Fail("reads tensor " + std::to_string(id) + " before it is written");
    }
    node.output = TensorId(n, *g, n.Int("output"));
    if (!defined->insert(node.output).second) n.Fail("writes tensor " + std::to_string(node.output) + " twice");
    reader->second(n, *g, &node);
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
  const int64_t version = doc.Int("version");
  if (doc.Str("format") != "byoc_hetero.cuda_region" || (version != 1 && version != 2)) {
    doc.Fail("expected format 'byoc_hetero.cuda_region' version 2 (or 1: gemm nodes only), got '" +
             doc.Str("format") + "' version " + std::to_string(version));
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
  ReadNodes(doc, version, &g, &defined);
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
