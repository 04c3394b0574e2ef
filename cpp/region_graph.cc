/*!
 * \file region_graph.cc
 * \brief Parser and structural validator of the region document.
 */
#include "region_graph.h"

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>

#include <sstream>
#include <utility>

namespace byoc_hetero {

namespace ffi = tvm::ffi;
using ffi::Any;

namespace {

using JsonObject = ffi::Map<Any, Any>;
using JsonArray = ffi::Array<Any>;

[[noreturn]] void ThrowValueError(const std::string& message) {
  TVM_FFI_THROW(ValueError) << message;
  TVM_FFI_UNREACHABLE();
}

/*! \brief A short rendering of a JSON value for "got ..." parts of messages. */
std::string Render(const Any& value) {
  std::string text;
  try {
    text = std::string(ffi::json::Stringify(value));
  } catch (const std::exception&) {
    text = "<" + value.GetTypeKey() + ">";
  }
  constexpr size_t kMax = 80;
  if (text.size() > kMax) text = text.substr(0, kMax - 3) + "...";
  return text;
}

std::string TypeName(const Any& value) {
  switch (value.type_index()) {
    case ffi::TypeIndex::kTVMFFINone:
      return "null";
    case ffi::TypeIndex::kTVMFFIInt:
      return "integer";
    case ffi::TypeIndex::kTVMFFIBool:
      return "boolean";
    case ffi::TypeIndex::kTVMFFIFloat:
      return "number";
    default:
      break;
  }
  if (value.as<ffi::String>()) return "string";
  if (value.as<JsonArray>()) return "array";
  if (value.as<JsonObject>()) return "object";
  return value.GetTypeKey();
}

/*! \brief Reads one JSON object with typed getters; messages carry "<where>: <path>.<key>". */
class ObjectReader {
 public:
  ObjectReader(std::string where, std::string path, const Any& value)
      : where_(std::move(where)), path_(std::move(path)) {
    auto obj = value.as<JsonObject>();
    if (!obj.has_value()) Fail("", "expected an object, got " + TypeName(value) + " " + Render(value));
    for (const auto& kv : *obj) {
      auto key = kv.first.as<ffi::String>();
      if (!key.has_value()) Fail("", "object keys must be strings");
      fields_.emplace(std::string(*key), kv.second);
    }
  }

  [[noreturn]] void Fail(const std::string& key, const std::string& message) const {
    std::string field = path_;
    if (!key.empty()) field = field.empty() ? key : field + "." + key;
    ThrowValueError(where_ + ": field '" + (field.empty() ? "<root>" : field) + "': " + message);
  }

  bool Has(const std::string& key) const { return fields_.count(key) != 0; }

  const Any& Get(const std::string& key) {
    auto it = fields_.find(key);
    if (it == fields_.end()) Fail(key, "missing");
    read_.insert(key);
    return it->second;
  }

  std::string Str(const std::string& key) {
    const Any& v = Get(key);
    auto s = v.as<ffi::String>();
    if (!s.has_value()) Fail(key, "expected a string, got " + TypeName(v) + " " + Render(v));
    return std::string(*s);
  }

  int64_t Int(const std::string& key) {
    const Any& v = Get(key);
    if (v.type_index() != ffi::TypeIndex::kTVMFFIInt) {
      Fail(key, "expected an integer, got " + TypeName(v) + " " + Render(v));
    }
    return v.cast<int64_t>();
  }

  JsonArray Array(const std::string& key) {
    const Any& v = Get(key);
    auto a = v.as<JsonArray>();
    if (!a.has_value()) Fail(key, "expected an array, got " + TypeName(v) + " " + Render(v));
    return *a;
  }

  std::vector<int64_t> IntArray(const std::string& key) {
    JsonArray arr = Array(key);
    std::vector<int64_t> out;
    out.reserve(arr.size());
    for (size_t i = 0; i < arr.size(); ++i) {
      const Any& v = arr[i];
      if (v.type_index() != ffi::TypeIndex::kTVMFFIInt) {
        Fail(key + "[" + std::to_string(i) + "]",
             "expected an integer, got " + TypeName(v) + " " + Render(v));
      }
      out.push_back(v.cast<int64_t>());
    }
    return out;
  }

  /*! \brief Reject keys that were never read (typos in the codegen must not pass silently). */
  void CheckNoUnknown() const {
    for (const auto& kv : fields_) {
      if (!read_.count(kv.first)) Fail(kv.first, "unknown field");
    }
  }

  const std::map<std::string, Any>& fields() const { return fields_; }
  std::string Path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  std::string where_;
  std::string path_;
  std::map<std::string, Any> fields_;
  std::set<std::string> read_;
};

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kInt64:
      return "int64";
    case DType::kInt32:
      return "int32";
    case DType::kBool:
      return "bool";
    default:
      return "float32";
  }
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
    default:
      return 4;
  }
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string RegionGraph::where() const { return "byoc_hetero region '" + symbol + "'"; }

std::string RegionGraph::where(size_t node_index) const {
  std::string op = node_index < nodes.size() ? nodes[node_index].op : std::string("?");
  return where() + " node " + std::to_string(node_index) + " (" + op + ")";
}

RegionGraph ParseRegionGraph(const std::string& json_text) {
  RegionGraph g;
  g.symbol = "<unknown>";

  ffi::String parse_error;
  Any root = ffi::json::Parse(ffi::String(json_text), &parse_error);
  if (!parse_error.empty()) {
    ThrowValueError(g.where() + ": malformed JSON: " + std::string(parse_error));
  }
  if (!root.as<JsonObject>().has_value()) {
    ThrowValueError(g.where() + ": the document must be a JSON object, got " + TypeName(root));
  }
  // Learn the symbol first so that every later message can name the region.
  {
    ObjectReader peek(g.where(), "", root);
    if (peek.Has("symbol")) {
      if (auto s = peek.fields().at("symbol").as<ffi::String>(); s.has_value() && !s->empty()) {
        g.symbol = std::string(*s);
      }
    }
  }
  ObjectReader doc(g.where(), "", root);

  // Envelope.
  std::string format = doc.Str("format");
  if (format != kRegionFormat) {
    doc.Fail("format", std::string("expected \"") + kRegionFormat + "\", got \"" + format + "\"");
  }
  int64_t version = doc.Int("version");
  if (version != kRegionVersion) {
    doc.Fail("version", "expected " + std::to_string(kRegionVersion) + ", got " +
                            std::to_string(version) + " (this runtime reads version 1 only)");
  }
  std::string symbol = doc.Str("symbol");
  if (symbol.empty()) doc.Fail("symbol", "must be a non-empty string");
  for (char c : symbol) {
    if (static_cast<unsigned char>(c) <= ' ') doc.Fail("symbol", "must not contain whitespace");
  }
  // Optional (absent = f32): an additive field, so version 1 stays; a runtime without it would
  // compute f32, which the bf16 bound covers.
  if (doc.Has("precision")) {
    g.precision = doc.Str("precision");
    if (g.precision != kPrecisionF32 && g.precision != kPrecisionBf16) {
      doc.Fail("precision", std::string("expected \"") + kPrecisionF32 + "\" or \"" + kPrecisionBf16 +
                                "\", got \"" + g.precision + "\"");
    }
  }

  // Tensors.
  JsonArray tensors = doc.Array("tensors");
  if (tensors.empty()) doc.Fail("tensors", "must not be empty");
  for (size_t i = 0; i < tensors.size(); ++i) {
    ObjectReader t(g.where(), "tensors[" + std::to_string(i) + "]", tensors[i]);
    TensorInfo info;
    info.shape = t.IntArray("shape");
    for (size_t d = 0; d < info.shape.size(); ++d) {
      if (info.shape[d] < 1) {
        t.Fail("shape", "static positive dims required, got " + ShapeToString(info.shape));
      }
    }
    // "dtype" is optional (float32); a runtime that predates a dtype rejects it here, by name.
    if (t.Has("dtype")) {
      const std::string dtype = t.Str("dtype");
      bool known = false;
      for (DType d : {DType::kFloat32, DType::kInt64, DType::kInt32, DType::kBool}) {
        if (dtype == DTypeName(d)) {
          info.dtype = d;
          known = true;
        }
      }
      if (!known) {
        t.Fail("dtype", "expected \"float32\", \"int64\", \"int32\" or \"bool\", got \"" + dtype + "\"");
      }
    }
    t.CheckNoUnknown();
    g.tensors.push_back(std::move(info));
  }
  const int num_tensors = static_cast<int>(g.tensors.size());
  g.roles.assign(num_tensors, TensorRole::kUnused);
  g.index_in_role.assign(num_tensors, -1);

  auto check_id = [&](const ObjectReader& r, const std::string& field, int64_t id) -> int {
    if (id < 0 || id >= num_tensors) {
      r.Fail(field, "tensor id " + std::to_string(id) + " out of range [0, " +
                        std::to_string(num_tensors) + ")");
    }
    return static_cast<int>(id);
  };
  auto role_name = [](TensorRole role) -> std::string {
    switch (role) {
      case TensorRole::kInput:
        return "a region input";
      case TensorRole::kConstant:
        return "a constant";
      case TensorRole::kNodeOutput:
        return "a node output";
      default:
        return "unused";
    }
  };

  // Inputs.
  std::vector<int64_t> inputs = doc.IntArray("inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string field = "inputs[" + std::to_string(i) + "]";
    int id = check_id(doc, field, inputs[i]);
    if (g.roles[id] != TensorRole::kUnused) {
      doc.Fail(field, "tensor " + std::to_string(id) + " is listed twice");
    }
    g.roles[id] = TensorRole::kInput;
    g.index_in_role[id] = static_cast<int>(i);
    g.inputs.push_back(id);
  }

  // Constants.
  JsonArray constants = doc.Has("constants") ? doc.Array("constants") : JsonArray();
  std::set<std::string> const_names;
  for (size_t i = 0; i < constants.size(); ++i) {
    ObjectReader c(g.where(), "constants[" + std::to_string(i) + "]", constants[i]);
    int id = check_id(c, "tensor", c.Int("tensor"));
    std::string name = c.Str("name");
    if (name.empty()) c.Fail("name", "must be a non-empty string");
    if (!const_names.insert(name).second) c.Fail("name", "duplicate constant name '" + name + "'");
    if (g.roles[id] != TensorRole::kUnused) {
      c.Fail("tensor", "tensor " + std::to_string(id) + " is already " + role_name(g.roles[id]));
    }
    c.CheckNoUnknown();
    g.roles[id] = TensorRole::kConstant;
    g.index_in_role[id] = static_cast<int>(i);
    g.constants.push_back({id, name});
  }

  // Nodes, in topological order: each reads defined tensors and writes a fresh one.
  JsonArray nodes = doc.Array("nodes");
  if (nodes.empty()) doc.Fail("nodes", "must not be empty");
  for (size_t n = 0; n < nodes.size(); ++n) {
    ObjectReader r(g.where(), "nodes[" + std::to_string(n) + "]", nodes[n]);
    NodeInfo node;
    node.op = r.Str("op");
    std::vector<int64_t> node_inputs = r.IntArray("inputs");
    for (size_t k = 0; k < node_inputs.size(); ++k) {
      std::string field = "inputs[" + std::to_string(k) + "]";
      int id = check_id(r, field, node_inputs[k]);
      if (g.roles[id] == TensorRole::kUnused) {
        r.Fail(field, "tensor " + std::to_string(id) +
                          " is read before it is written (not a region input, a constant or the "
                          "output of an earlier node)");
      }
      node.inputs.push_back(id);
    }
    int out = check_id(r, "output", r.Int("output"));
    if (g.roles[out] != TensorRole::kUnused) {
      std::string owner = role_name(g.roles[out]);
      if (g.roles[out] == TensorRole::kNodeOutput) {
        owner = "written by node " + std::to_string(g.index_in_role[out]);
      } else {
        owner = "already " + owner;
      }
      r.Fail("output", "tensor " + std::to_string(out) + " is " + owner +
                           "; every tensor has exactly one writer");
    }
    if (r.Has("attrs")) {
      ObjectReader attrs(g.where(), r.Path("attrs"), r.Get("attrs"));
      node.attrs = attrs.fields();
    }
    r.CheckNoUnknown();
    node.output = out;
    g.roles[out] = TensorRole::kNodeOutput;
    g.index_in_role[out] = static_cast<int>(n);
    g.nodes.push_back(std::move(node));
  }

  // Outputs: node results, each listed once.
  std::vector<int64_t> outputs = doc.IntArray("outputs");
  if (outputs.empty()) doc.Fail("outputs", "must not be empty");
  std::set<int> seen_outputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string field = "outputs[" + std::to_string(i) + "]";
    int id = check_id(doc, field, outputs[i]);
    if (g.roles[id] != TensorRole::kNodeOutput) {
      doc.Fail(field, "tensor " + std::to_string(id) + " is " + role_name(g.roles[id]) +
                          "; region outputs must be written by a node");
    }
    if (!seen_outputs.insert(id).second) {
      doc.Fail(field, "tensor " + std::to_string(id) + " is listed twice");
    }
    g.outputs.push_back(id);
  }
  // Unknown top-level keys are tolerated (room for metadata such as a producer tag).
  return g;
}

// ---------------------------------------------------------------------------------------------
// AttrReader

AttrReader::AttrReader(const RegionGraph& graph, size_t node_index)
    : graph_(graph), node_index_(node_index) {}

void AttrReader::Fail(const char* key, const std::string& message) const {
  ThrowValueError(graph_.where(node_index_) + ": field 'nodes[" + std::to_string(node_index_) +
                  "].attrs." + key + "': " + message);
}

const Any* AttrReader::Find(const char* key) {
  seen_.insert(key);
  const auto& attrs = graph_.nodes[node_index_].attrs;
  auto it = attrs.find(key);
  return it == attrs.end() ? nullptr : &it->second;
}

int64_t AttrReader::Int(const char* key, int64_t default_value) {
  const Any* v = Find(key);
  if (v == nullptr) return default_value;
  if (v->type_index() != ffi::TypeIndex::kTVMFFIInt) {
    Fail(key, "expected an integer, got " + TypeName(*v) + " " + Render(*v));
  }
  return v->cast<int64_t>();
}

double AttrReader::Float(const char* key, double default_value) {
  const Any* v = Find(key);
  if (v == nullptr) return default_value;
  if (v->type_index() == ffi::TypeIndex::kTVMFFIInt) return static_cast<double>(v->cast<int64_t>());
  if (v->type_index() == ffi::TypeIndex::kTVMFFIFloat) return v->cast<double>();
  Fail(key, "expected a number, got " + TypeName(*v) + " " + Render(*v));
}

std::vector<double> AttrReader::Floats(const char* key, size_t expected_size,
                                       const std::vector<double>& default_value) {
  const Any* v = Find(key);
  if (v == nullptr) return default_value;
  auto arr = v->as<JsonArray>();
  bool ok = arr.has_value() && arr->size() == expected_size;
  std::vector<double> out;
  if (ok) {
    for (const Any& x : *arr) {
      if (x.type_index() == ffi::TypeIndex::kTVMFFIInt) {
        out.push_back(static_cast<double>(x.cast<int64_t>()));
      } else if (x.type_index() == ffi::TypeIndex::kTVMFFIFloat) {
        out.push_back(x.cast<double>());
      } else {
        ok = false;
        break;
      }
    }
  }
  if (!ok) {
    Fail(key, "expected an array of " + std::to_string(expected_size) + " numbers, got " +
                  Render(*v));
  }
  return out;
}

bool AttrReader::Has(const char* key) { return Find(key) != nullptr; }

bool AttrReader::Flag(const char* key, bool default_value) {
  const Any* v = Find(key);
  if (v == nullptr) return default_value;
  if (v->type_index() == ffi::TypeIndex::kTVMFFIBool) return v->cast<bool>();
  if (v->type_index() == ffi::TypeIndex::kTVMFFIInt) {
    int64_t x = v->cast<int64_t>();
    if (x == 0 || x == 1) return x == 1;
  }
  Fail(key, "expected 0/1 or false/true, got " + Render(*v));
}

std::string AttrReader::Str(const char* key, const std::string& default_value) {
  const Any* v = Find(key);
  if (v == nullptr) return default_value;
  auto s = v->as<ffi::String>();
  if (!s.has_value()) Fail(key, "expected a string, got " + TypeName(*v) + " " + Render(*v));
  return std::string(*s);
}

std::vector<int64_t> AttrReader::Ints(const char* key, size_t expected_size,
                                      const std::vector<int64_t>& default_value) {
  const Any* v = Find(key);
  if (v == nullptr) return default_value;
  auto arr = v->as<JsonArray>();
  bool ok = arr.has_value() && arr->size() == expected_size;
  std::vector<int64_t> out;
  if (ok) {
    for (const Any& x : *arr) {
      if (x.type_index() != ffi::TypeIndex::kTVMFFIInt) {
        ok = false;
        break;
      }
      out.push_back(x.cast<int64_t>());
    }
  }
  if (!ok) {
    Fail(key, "expected an array of " + std::to_string(expected_size) + " integers, got " +
                  Render(*v));
  }
  return out;
}

std::string AttrReader::Choice(const char* key, const std::vector<std::string>& allowed,
                               const std::string& default_value) {
  if (default_value.empty() && Find(key) == nullptr) {
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i) list += (i ? ", \"" : "\"") + allowed[i] + "\"";
    Fail(key, "missing (required, one of " + list + ")");
  }
  std::string value = Str(key, default_value);
  for (const auto& a : allowed) {
    if (a == value) return value;
  }
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i) list += (i ? ", \"" : "\"") + allowed[i] + "\"";
  Fail(key, "expected one of " + list + ", got \"" + value + "\"");
}

void AttrReader::CheckNoUnknown() const {
  for (const auto& kv : graph_.nodes[node_index_].attrs) {
    if (!seen_.count(kv.first)) {
      std::string known;
      for (const auto& s : seen_) known += (known.empty() ? "" : ", ") + s;
      Fail(kv.first.c_str(), "unknown attribute for op '" + graph_.nodes[node_index_].op +
                                 "' (known: " + known + ")");
    }
  }
}

}  // namespace byoc_hetero
