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

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
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

/*!
 * \brief Strict parser of a dim expression: expr := term (('+' | '-') term)*,
 *        term := factor (('*' | '//') factor)*, factor := INT | NAME | '(' expr ')'.
 *        Names are [A-Za-z_][A-Za-z0-9_]*; spaces are allowed between tokens; nothing else is.
 */
class DimParser {
 public:
  DimParser(const std::string& text, std::vector<std::string>* symbols) : text_(text), symbols_(symbols) {}

  /*! \brief The compiled expression, or an empty optional with error() set. */
  bool Parse(DimExpr* out) {
    out->text = text_;
    out->rpn.clear();
    rpn_ = &out->rpn;
    if (!Expr()) return false;
    Skip();
    if (pos_ != text_.size()) return Error("unexpected '" + text_.substr(pos_, 1) + "'");
    return true;
  }
  const std::string& error() const { return error_; }

 private:
  bool Error(const std::string& what) {
    if (error_.empty()) error_ = what + " at offset " + std::to_string(pos_);
    return false;
  }
  void Skip() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  bool Expr() {
    if (!Term()) return false;
    for (;;) {
      Skip();
      if (pos_ >= text_.size() || (text_[pos_] != '+' && text_[pos_] != '-')) return true;
      const DimExpr::Kind k = text_[pos_] == '+' ? DimExpr::Kind::kAdd : DimExpr::Kind::kSub;
      ++pos_;
      if (!Term()) return false;
      rpn_->push_back({k, 0});
    }
  }
  bool Term() {
    if (!Factor()) return false;
    for (;;) {
      Skip();
      DimExpr::Kind k;
      if (text_.compare(pos_, 2, "//") == 0) {
        k = DimExpr::Kind::kFloorDiv;
        pos_ += 2;
      } else if (pos_ < text_.size() && text_[pos_] == '*') {
        k = DimExpr::Kind::kMul;
        ++pos_;
      } else {
        return true;
      }
      if (!Factor()) return false;
      rpn_->push_back({k, 0});
    }
  }
  bool Factor() {
    Skip();
    if (pos_ >= text_.size()) return Error("expected a number, a symbol or '('");
    const char c = text_[pos_];
    if (c == '(') {
      ++pos_;
      if (!Expr()) return false;
      Skip();
      if (pos_ >= text_.size() || text_[pos_] != ')') return Error("expected ')'");
      ++pos_;
      return true;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t v = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        if (v > (INT64_MAX - 9) / 10) return Error("number too large");
        v = v * 10 + (text_[pos_++] - '0');
      }
      rpn_->push_back({DimExpr::Kind::kInt, v});
      return true;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos_;
      while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
      const std::string name = text_.substr(start, pos_ - start);
      auto it = std::find(symbols_->begin(), symbols_->end(), name);
      if (it == symbols_->end()) it = symbols_->insert(symbols_->end(), name);
      rpn_->push_back({DimExpr::Kind::kSymbol, static_cast<int64_t>(it - symbols_->begin())});
      return true;
    }
    return Error(std::string("unexpected '") + c + "'");
  }

  const std::string text_;  // a copy: callers pass temporaries
  std::vector<std::string>* symbols_;
  std::vector<DimExpr::Token>* rpn_ = nullptr;
  size_t pos_ = 0;
  std::string error_;
};

[[noreturn]] void ThrowInputError(const std::string& message) {
  TVM_FFI_THROW(InputError) << message;
  TVM_FFI_UNREACHABLE();
}

// ---- the document's sections, in reading order (ParseRegionGraph) ----

/*! \brief What a tensor of \p role is, for messages ("a region input", ...). */
std::string RoleName(TensorRole role) {
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
}

/*! \brief check_id(reader, field, id): \p id as a tensor id of \p g, or a failure naming the field. */
auto IdChecker(const RegionGraph& g) {
  const int num_tensors = static_cast<int>(g.tensors.size());
  return [num_tensors](const ObjectReader& r, const std::string& field, int64_t id) -> int {
    if (id < 0 || id >= num_tensors) {
      r.Fail(field, "tensor id " + std::to_string(id) + " out of range [0, " +
                        std::to_string(num_tensors) + ")");
    }
    return static_cast<int>(id);
  };
}

/*! \brief Envelope: format, version, symbol, precision; returns the version. */
int64_t ReadEnvelope(ObjectReader& doc, RegionGraph& g) {
  std::string format = doc.Str("format");
  if (format != kRegionFormat) {
    doc.Fail("format", std::string("expected \"") + kRegionFormat + "\", got \"" + format + "\"");
  }
  int64_t version = doc.Int("version");
  if (version < 1 || version > kRegionVersion) {
    doc.Fail("version", "expected 1 to " + std::to_string(kRegionVersion) + ", got " +
                            std::to_string(version) + " (this runtime reads versions 1 to 4)");
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
  // Optional (absent = the process's knob): a tuner's per-region choice (bh.tune's threads level).
  if (doc.Has("threads")) {
    int64_t n = doc.Int("threads");
    if (n < 1 || n > 4096) doc.Fail("threads", "expected an integer from 1 to 4096, got " + std::to_string(n));
    g.threads = static_cast<int>(n);
  }
  return version;
}

/*! \brief Tensors: shapes (dims or dim expressions, version 2), dtypes; sizes the roles. */
void ReadTensors(ObjectReader& doc, int64_t version, RegionGraph& g) {
  JsonArray tensors = doc.Array("tensors");
  if (tensors.empty()) doc.Fail("tensors", "must not be empty");
  for (size_t i = 0; i < tensors.size(); ++i) {
    ObjectReader t(g.where(), "tensors[" + std::to_string(i) + "]", tensors[i]);
    TensorInfo info;
    JsonArray dims = t.Array("shape");
    for (size_t d = 0; d < dims.size(); ++d) {
      const std::string field = "shape[" + std::to_string(d) + "]";
      const Any& v = dims[d];
      DimExpr expr;
      if (v.type_index() == ffi::TypeIndex::kTVMFFIInt) {
        const int64_t n = v.cast<int64_t>();
        if (n < 1) t.Fail("shape", "dim " + std::to_string(d) + " must be >= 1, got " + Render(Any(dims)));
        info.shape.push_back(n);
      } else if (auto text = v.as<ffi::String>(); text.has_value()) {
        if (version < 2) {
          t.Fail(field, "symbolic dim \"" + std::string(*text) + "\" needs version 2 of the format");
        }
        DimParser parser(std::string(*text), &g.symbols);
        if (!parser.Parse(&expr)) {
          t.Fail(field, "ill-formed dim expression \"" + std::string(*text) + "\": " + parser.error());
        }
        info.shape.push_back(-1);
      } else {
        t.Fail(field, "expected an integer or a dim expression (string), got " + TypeName(v) + " " + Render(v));
      }
      info.dims.push_back(std::move(expr));
    }
    // "dtype" is optional (float32); a runtime that predates a dtype rejects it here, by name.
    if (t.Has("dtype")) {
      const std::string dtype = t.Str("dtype");
      bool known = false;
      for (DType d : kAllDTypes) {
        if (dtype == DTypeName(d)) {
          info.dtype = d;
          known = true;
        }
      }
      if (!known) {
        t.Fail("dtype", "expected \"float32\", \"int64\", \"int32\", \"bool\", \"uint8\", \"int8\" or \"float16\", got \"" +
                             dtype + "\"");
      }
    }
    t.CheckNoUnknown();
    g.tensors.push_back(std::move(info));
  }
  const int num_tensors = static_cast<int>(g.tensors.size());
  g.roles.assign(num_tensors, TensorRole::kUnused);
  g.index_in_role.assign(num_tensors, -1);
}

/*! \brief Inputs: tensor ids, each listed once. */
void ReadInputs(ObjectReader& doc, RegionGraph& g) {
  auto check_id = IdChecker(g);
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
}

/*! \brief Constants: tensor and unique name each; static shapes. */
void ReadConstants(ObjectReader& doc, int64_t version, RegionGraph& g) {
  auto check_id = IdChecker(g);
  JsonArray constants = doc.Has("constants") ? doc.Array("constants") : JsonArray();
  std::set<std::string> const_names;
  for (size_t i = 0; i < constants.size(); ++i) {
    ObjectReader c(g.where(), "constants[" + std::to_string(i) + "]", constants[i]);
    int id = check_id(c, "tensor", c.Int("tensor"));
    std::string name = c.Str("name");
    if (name.empty()) c.Fail("name", "must be a non-empty string");
    std::string digest;
    if (version >= kDigestVersion) {  // required: a document that lost it must not load unchecked
      digest = c.Str("digest");
      bool hex = digest.size() == 16;
      for (char ch : digest) hex = hex && ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'));
      if (!hex) c.Fail("digest", "expected 16 lower-case hex digits, got '" + digest + "'");
    } else if (c.Has("digest")) {
      c.Fail("digest", "needs version " + std::to_string(kDigestVersion) + " of the format, the document has version " +
                           std::to_string(version));
    }
    if (!const_names.insert(name).second) c.Fail("name", "duplicate constant name '" + name + "'");
    if (g.roles[id] != TensorRole::kUnused) {
      c.Fail("tensor", "tensor " + std::to_string(id) + " is already " + RoleName(g.roles[id]));
    }
    c.CheckNoUnknown();
    if (g.tensors[id].symbolic()) {
      c.Fail("tensor", "constant tensor " + std::to_string(id) + " has the symbolic shape " +
                           g.tensors[id].Describe() + "; constants are static");
    }
    g.roles[id] = TensorRole::kConstant;
    g.index_in_role[id] = static_cast<int>(i);
    g.constants.push_back({id, name, digest});
  }
}

/*! \brief Nodes, in topological order: each reads defined tensors and writes a fresh one. */
void ReadNodes(ObjectReader& doc, RegionGraph& g) {
  auto check_id = IdChecker(g);
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
      std::string owner = RoleName(g.roles[out]);
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
}

/*! \brief Outputs: node results, each listed once. */
void ReadOutputs(ObjectReader& doc, RegionGraph& g) {
  auto check_id = IdChecker(g);
  std::vector<int64_t> outputs = doc.IntArray("outputs");
  if (outputs.empty()) doc.Fail("outputs", "must not be empty");
  std::set<int> seen_outputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string field = "outputs[" + std::to_string(i) + "]";
    int id = check_id(doc, field, outputs[i]);
    if (g.roles[id] != TensorRole::kNodeOutput) {
      doc.Fail(field, "tensor " + std::to_string(id) + " is " + RoleName(g.roles[id]) +
                          "; region outputs must be written by a node");
    }
    if (!seen_outputs.insert(id).second) {
      doc.Fail(field, "tensor " + std::to_string(id) + " is listed twice");
    }
    g.outputs.push_back(id);
  }
}

/*! \brief Shape arguments: positions among the inputs and themselves, where the VM passes a shape. */
void ReadShapeArgs(ObjectReader& doc, RegionGraph& g) {
  if (doc.Has("shape_args")) {
    std::vector<int64_t> positions = doc.IntArray("shape_args");
    const int64_t leading = static_cast<int64_t>(g.inputs.size() + positions.size());
    for (size_t i = 0; i < positions.size(); ++i) {
      if (positions[i] < 0 || positions[i] >= leading || (i > 0 && positions[i] <= positions[i - 1])) {
        doc.Fail("shape_args[" + std::to_string(i) + "]",
                 "expected ascending positions in [0, " + std::to_string(leading) + "), got " +
                     std::to_string(positions[i]));
      }
      g.shape_args.push_back(static_cast<int>(positions[i]));
    }
  }
}

/*! \brief Every symbol must be a bare dim of an argument, so that a call's shapes bind it. */
void CheckSymbolsBound(ObjectReader& doc, const RegionGraph& g) {
  std::vector<bool> bound(g.symbols.size(), false);
  for (const std::vector<int>* ids : {&g.inputs, &g.outputs}) {
    for (int id : *ids) {
      for (const DimExpr& d : g.tensors[id].dims) {
        if (d.bare_symbol() >= 0) bound[d.bare_symbol()] = true;
      }
    }
  }
  for (size_t k = 0; k < g.symbols.size(); ++k) {
    if (!bound[k]) {
      doc.Fail("tensors", "unknown symbol '" + g.symbols[k] +
                              "': it is no dim of its own in any region input or output, so no call can bind it");
    }
  }
}

/*!
 * \brief Declared ranges (version 3): {"N": [1, 64], "S": [null, 512]}, each key a symbol of the region.
 *        A version of its own, not an additive field: a runtime that predates it tolerates unknown
 *        top-level keys and would run out-of-range calls unchecked; it rejects version 3 instead.
 */
void ReadDimRanges(ObjectReader& doc, int64_t version, RegionGraph& g) {
  if (doc.Has("dim_ranges")) {
    if (version < 3) {
      doc.Fail("dim_ranges", "needs version 3 of the format, the document has version " + std::to_string(version));
    }
    const Any& value = doc.Get("dim_ranges");
    auto obj = value.as<JsonObject>();
    if (!obj.has_value()) {
      doc.Fail("dim_ranges", "expected an object {symbol: [min, max]}, got " + TypeName(value) + " " + Render(value));
    }
    g.ranges.assign(g.symbols.size(), {RegionGraph::kNoBound, RegionGraph::kNoBound});
    for (const auto& kv : *obj) {
      const std::string name = std::string(kv.first.cast<ffi::String>());
      const std::string field = "dim_ranges." + name;
      auto it = std::find(g.symbols.begin(), g.symbols.end(), name);
      if (it == g.symbols.end()) {
        std::string known;
        for (const auto& s : g.symbols) known += (known.empty() ? "" : ", ") + s;
        doc.Fail(field, "'" + name + "' is no symbol of the region (its symbols: " + (known.empty() ? "none" : known) +
                            ")");
      }
      auto pair = kv.second.as<JsonArray>();
      if (!pair.has_value() || pair->size() != 2) {
        doc.Fail(field, "expected [min, max] (integers >= 1 or null), got " + TypeName(kv.second) + " " +
                            Render(kv.second));
      }
      int64_t bounds[2];
      for (int side = 0; side < 2; ++side) {
        const Any& b = (*pair)[side];
        if (b.type_index() == ffi::TypeIndex::kTVMFFINone) {
          bounds[side] = RegionGraph::kNoBound;
        } else if (b.type_index() == ffi::TypeIndex::kTVMFFIInt && b.cast<int64_t>() >= 1) {
          bounds[side] = b.cast<int64_t>();
        } else {
          doc.Fail(field, "expected [min, max] (integers >= 1 or null), got " + Render(kv.second));
        }
      }
      if (bounds[0] != RegionGraph::kNoBound && bounds[1] != RegionGraph::kNoBound && bounds[0] > bounds[1]) {
        doc.Fail(field, "expected min <= max, got " + Render(kv.second));
      }
      g.ranges[it - g.symbols.begin()] = {bounds[0], bounds[1]};
    }
  }
}
}  // namespace

std::string RangeText(int64_t lo, int64_t hi) {
  auto end = [](int64_t v) { return v == RegionGraph::kNoBound ? std::string("...") : std::to_string(v); };
  return "[" + end(lo) + ", " + end(hi) + "]";
}

bool EvalDim(const DimExpr& e, const std::vector<int64_t>& values, int64_t* result, std::string* error) {
  std::vector<int64_t> stack;
  for (const DimExpr::Token& t : e.rpn) {
    if (t.kind == DimExpr::Kind::kInt) {
      stack.push_back(t.value);
      continue;
    }
    if (t.kind == DimExpr::Kind::kSymbol) {
      stack.push_back(values.at(static_cast<size_t>(t.value)));
      continue;
    }
    const int64_t b = stack.back();
    stack.pop_back();
    int64_t& a = stack.back();
    bool overflow = false;
    switch (t.kind) {
      case DimExpr::Kind::kAdd:
        overflow = __builtin_add_overflow(a, b, &a);
        break;
      case DimExpr::Kind::kSub:
        overflow = __builtin_sub_overflow(a, b, &a);
        break;
      case DimExpr::Kind::kMul:
        overflow = __builtin_mul_overflow(a, b, &a);
        break;
      default:  // floor division (Python's //), by a positive divisor only
        if (b < 1) {
          *error = "'" + e.text + "' divides by " + std::to_string(b);
          return false;
        }
        a = a >= 0 ? a / b : -((-a + b - 1) / b);
        break;
    }
    if (overflow) {
      *error = "'" + e.text + "' overflows int64";
      return false;
    }
  }
  *result = stack.back();
  return true;
}

bool TensorInfo::symbolic() const {
  for (const DimExpr& d : dims) {
    if (!d.rpn.empty()) return true;
  }
  return false;
}

std::string TensorInfo::Describe() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    os << (i ? ", " : "");
    if (i < dims.size() && !dims[i].rpn.empty()) {
      os << dims[i].text;
    } else {
      os << shape[i];
    }
  }
  os << "]";
  return os.str();
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kInt64:
      return "int64";
    case DType::kInt32:
      return "int32";
    case DType::kBool:
      return "bool";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kFloat16:
      return "float16";
    default:
      return "float32";
  }
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
      return 2;
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
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

  const int64_t version = ReadEnvelope(doc, g);
  ReadTensors(doc, version, g);
  ReadInputs(doc, g);
  ReadConstants(doc, version, g);
  ReadNodes(doc, g);
  ReadOutputs(doc, g);
  ReadShapeArgs(doc, g);
  CheckSymbolsBound(doc, g);
  ReadDimRanges(doc, version, g);
  // Unknown top-level keys are tolerated (room for metadata such as a producer tag).
  return g;
}

std::vector<int64_t> RegionGraph::BindSymbols(const std::vector<std::vector<int64_t>>& arg_shapes) const {
  std::vector<int64_t> values(symbols.size(), -1);
  std::vector<int> bound_by(symbols.size(), -1);
  std::vector<size_t> bound_dim(symbols.size(), 0);
  const size_t num_in = inputs.size();
  auto arg_name = [&](size_t i) {
    return "argument " + std::to_string(i) + " (" + (i < num_in ? "input " + std::to_string(i) : "output " + std::to_string(i - num_in)) + ")";
  };
  auto tensor_of = [&](size_t i) { return i < num_in ? inputs[i] : outputs[i - num_in]; };
  // Bare symbols bind first (inputs, then outputs); every other dim is checked afterwards.
  for (size_t i = 0; i < arg_shapes.size(); ++i) {
    const TensorInfo& t = tensors[tensor_of(i)];
    const std::vector<int64_t>& got = arg_shapes[i];
    if (got.size() != t.shape.size()) {
      ThrowInputError(where() + ": " + arg_name(i) + ": expected rank " + std::to_string(t.shape.size()) + " shape " +
                      t.Describe() + ", got shape " + ShapeToString(got));
    }
    for (size_t d = 0; d < got.size(); ++d) {
      const int k = t.dims[d].bare_symbol();
      if (k < 0) continue;
      if (got[d] < 1) {
        ThrowInputError(where() + ": " + arg_name(i) + ": dim " + std::to_string(d) + " (" + symbols[k] +
                        ") must be >= 1, got shape " + ShapeToString(got));
      }
      if (values[k] < 0) {
        values[k] = got[d];
        bound_by[k] = static_cast<int>(i);
        bound_dim[k] = d;
      } else if (values[k] != got[d]) {
        ThrowInputError(where() + ": " + arg_name(i) + ": dim " + std::to_string(d) + " is symbol " + symbols[k] +
                        ", which " + arg_name(bound_by[k]) + " bound to " + std::to_string(values[k]) +
                        "; got shape " + ShapeToString(got));
      }
    }
  }
  for (size_t k = 0; k < symbols.size(); ++k) {
    if (values[k] < 0) {
      ThrowInputError(where() + ": symbol " + symbols[k] + " is a dim of no argument among the " +
                      std::to_string(arg_shapes.size()) + " shapes given");
    }
  }
  // Declared ranges (a range can guard what the model computes beyond its ops, e.g. a table it
  // slices by the sequence length; it is checked where the symbol binds, once per new shape).
  for (size_t k = 0; k < ranges.size() && k < symbols.size(); ++k) {
    const auto [lo, hi] = ranges[k];
    if ((lo != kNoBound && values[k] < lo) || (hi != kNoBound && values[k] > hi)) {
      ThrowInputError(where() + ": " + arg_name(bound_by[k]) + ": dim " + std::to_string(bound_dim[k]) + " (" +
                      symbols[k] + ") is " + std::to_string(values[k]) + ", outside its declared range " +
                      RangeText(lo, hi) + " (got shape " + ShapeToString(arg_shapes[bound_by[k]]) + ")");
    }
  }
  for (size_t i = 0; i < arg_shapes.size(); ++i) {
    const TensorInfo& t = tensors[tensor_of(i)];
    for (size_t d = 0; d < t.shape.size(); ++d) {
      int64_t want = t.shape[d];
      std::string error;
      if (!t.dims[d].rpn.empty() && !EvalDim(t.dims[d], values, &want, &error)) {
        ThrowInputError(where() + ": " + arg_name(i) + " of shape " + t.Describe() + " at " +
                        DescribeBinding(values) + ": " + error);
      }
      if (arg_shapes[i][d] != want) {
        ThrowInputError(where() + ": " + arg_name(i) + ": expected shape " + t.Describe() +
                        (symbols.empty() ? "" : " with " + DescribeBinding(values)) + ", got shape " +
                        ShapeToString(arg_shapes[i]) + " (dim " + std::to_string(d) + " should be " +
                        std::to_string(want) + ")");
      }
    }
  }
  return values;
}

RegionGraph RegionGraph::Bound(const std::vector<int64_t>& values, int64_t max_bytes) const {
  RegionGraph g = *this;
  g.symbols.clear();
  g.ranges.clear();
  int64_t total_bytes = 0;
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    TensorInfo& info = g.tensors[t];
    int64_t numel = 1;
    for (size_t d = 0; d < info.shape.size(); ++d) {
      if (!info.dims[d].rpn.empty()) {
        std::string error;
        if (!EvalDim(info.dims[d], values, &info.shape[d], &error)) {
          ThrowInputError(where() + ": tensor " + std::to_string(t) + " of shape " + tensors[t].Describe() +
                          " at " + DescribeBinding(values) + ": " + error);
        }
        info.dims[d] = DimExpr();  // the bound graph is static
        if (info.shape[d] < 1) {
          ThrowInputError(where() + ": tensor " + std::to_string(t) + " of shape " + tensors[t].Describe() +
                          " has dim " + std::to_string(d) + " = " + std::to_string(info.shape[d]) + " at " +
                          DescribeBinding(values) + "; the inputs are too small for the region's ops");
        }
      }
      if (__builtin_mul_overflow(numel, info.shape[d], &numel)) numel = INT64_MAX;
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(DTypeSize(info.dtype)), &bytes) ||
        __builtin_add_overflow(total_bytes, bytes, &total_bytes) || total_bytes > max_bytes) {
      ThrowInputError(where() + ": at " + DescribeBinding(values) + " the region's tensors need more than " +
                      std::to_string(max_bytes) + " bytes (tensor " + std::to_string(t) + " alone: " +
                      tensors[t].Describe() + " = " + ShapeToString(info.shape) +
                      "); this machine cannot hold them");
    }
  }
  return g;
}

std::string RegionGraph::DescribeBinding(const std::vector<int64_t>& values) const {
  std::string s;
  for (size_t k = 0; k < symbols.size() && k < values.size(); ++k) {
    s += (s.empty() ? "" : ", ") + symbols[k] + "=" + std::to_string(values[k]);
  }
  return s.empty() ? "static shapes" : s;
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
