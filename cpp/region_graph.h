/*!
 * \file region_graph.h
 * \brief The region document (docs/region-format.md) as plain C++ structs, plus the parser
 *        and structural validator.
 *
 * Parsing checks everything that does not depend on an op's semantics: the envelope
 * (format, version, symbol), tensor descriptions, id ranges, the single-writer rule and the
 * topological order.  Op-specific checks (attrs, shapes) belong to the kernels, which read
 * their attrs through AttrReader so that every message names the region, the node and the field.
 */
#ifndef BYOC_HETERO_REGION_GRAPH_H_
#define BYOC_HETERO_REGION_GRAPH_H_

#include <tvm/ffi/any.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace byoc_hetero {

constexpr const char* kRegionFormat = "byoc_hetero.region";
/*!
 * \brief The newest version this runtime reads (1: static shapes; 2: dims may be symbolic;
 *        3: a version 2 document with declared symbol ranges, "dim_ranges"; 4: a version 3 document
 *        whose every constant carries its "digest", checked when the data arrive).
 */
constexpr int64_t kRegionVersion = 4;
/*! \brief The first version whose constants carry digests (required from it on). */
constexpr int64_t kDigestVersion = 4;

/*!
 * \brief A symbolic dim: an expression over the region's symbols, ints, + - * // and parentheses,
 *        compiled to reverse Polish notation (docs/region-format.md, "Symbolic shapes").
 */
struct DimExpr {
  enum class Kind { kInt, kSymbol, kAdd, kSub, kMul, kFloorDiv };
  struct Token {
    Kind kind;
    int64_t value;  // kInt: the number; kSymbol: the index into RegionGraph::symbols
  };
  std::string text;
  std::vector<Token> rpn;
  /*! \brief The symbol index when the expression is one bare symbol, else -1. */
  int bare_symbol() const { return rpn.size() == 1 && rpn[0].kind == Kind::kSymbol ? static_cast<int>(rpn[0].value) : -1; }
};

/*!
 * \brief The element types a tensor may have (field "dtype", default "float32").  Everything but
 *        float32 is plain memory that only host kernels read or write (take's indices, masks,
 *        casts); bool is one byte per element (0 or 1), as in DLPack.  uint8 / int8 are quantized
 *        values: written by quantize, read by dequantize and by the int8 anchors (conv2d, dense),
 *        pooling and the layout ops (docs/int8.md).
 */
enum class DType { kFloat32, kInt64, kInt32, kBool, kUInt8, kInt8, kFloat16 };
/*! \brief Every dtype, in enum order (what the parser and the calling convention accept). */
inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kInt64, DType::kInt32,
                                       DType::kBool,    DType::kUInt8, DType::kInt8,
                                       DType::kFloat16};
/*! \brief Whether \p dtype is a quantized 8-bit type (uint8 / int8). */
inline bool IsInt8(DType dtype) { return dtype == DType::kUInt8 || dtype == DType::kInt8; }

/*! \brief "float32", "int64", "int32", "bool", "uint8", "int8", "float16". */
const char* DTypeName(DType dtype);
/*! \brief Bytes per element. */
size_t DTypeSize(DType dtype);

/*! \brief One value of the region. */
struct TensorInfo {
  /*! \brief The dims; a symbolic dim holds -1 in a parsed graph, its value in a bound one. */
  std::vector<int64_t> shape;
  /*! \brief Per dim: the expression of a symbolic dim, empty (no rpn) for a static one. */
  std::vector<DimExpr> dims;
  bool symbolic() const;
  DType dtype = DType::kFloat32;
  int64_t numel() const;
  /*! \brief "[N, 3, (H+2)//2]": the dims as written. */
  std::string Describe() const;
};

/*! \brief Where a tensor's data comes from. */
enum class TensorRole { kUnused, kInput, kConstant, kNodeOutput };

struct ConstantInfo {
  int tensor;
  std::string name;
  std::string digest;  // 16 hex digits of digest.h over the data's bytes (version 4); empty before
};

/*! \brief A node as written in the document; attrs stay raw until the kernel reads them. */
struct NodeInfo {
  std::string op;
  std::vector<int> inputs;
  int output;
  std::map<std::string, tvm::ffi::Any> attrs;
};

/*! \brief Values of the optional top-level "precision" (what conv2d/dense/matmul compute in). */
constexpr const char* kPrecisionF32 = "f32";
constexpr const char* kPrecisionBf16 = "bf16";

struct RegionGraph {
  std::string symbol;
  /*! \brief Requested compute precision of the anchors: "f32" (default) or "bf16". */
  std::string precision = kPrecisionF32;
  /*! \brief Optional "threads": at most this many OpenMP threads per call (0: the process's knob). */
  int threads = 0;
  std::vector<TensorInfo> tensors;
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::vector<ConstantInfo> constants;
  std::vector<NodeInfo> nodes;
  /*! \brief Symbol names, in order of first appearance; empty when every shape is static. */
  std::vector<std::string> symbols;
  /*! \brief Positions among a call's leading arguments of shape values (ignored), ascending. */
  std::vector<int> shape_args;
  /*!
   * \brief Per symbol (empty, or one entry per symbol): its declared range {min, max}, inclusive,
   *        kNoBound for an open end (field "dim_ranges", version 3).  BindSymbols enforces it.
   */
  std::vector<std::pair<int64_t, int64_t>> ranges;
  static constexpr int64_t kNoBound = -1;

  // Derived by the parser.
  std::vector<TensorRole> roles;  // per tensor
  std::vector<int> index_in_role; // input position, constant position or producing node

  /*! \brief "byoc_hetero region '<symbol>'" - the prefix of every message about this region. */
  std::string where() const;
  /*! \brief "byoc_hetero region '<symbol>' node <i> (<op>)". */
  std::string where(size_t node_index) const;
  bool symbolic() const { return !symbols.empty(); }

  /*!
   * \brief The symbol values the shapes of a call's arguments (region inputs, then outputs) bind.
   *        Checks ranks, static dims, that every symbolic dim agrees with the bound symbols and
   *        that every symbol lies in its declared range (ranges).
   * \throws tvm::ffi::Error InputError naming the region, the argument, what was expected and
   *         what came.
   */
  std::vector<int64_t> BindSymbols(const std::vector<std::vector<int64_t>>& arg_shapes) const;
  /*!
   * \brief A copy of this graph with every symbolic dim evaluated for \p values (BindSymbols).
   * \throws InputError when a dim evaluates below 1 or overflows, or when the tensors of the
   *         region would need more than \p max_bytes.
   */
  RegionGraph Bound(const std::vector<int64_t>& values, int64_t max_bytes) const;
  /*! \brief "N=3, S=7". */
  std::string DescribeBinding(const std::vector<int64_t>& values) const;
};

/*!
 * \brief Evaluate a dim expression for the symbol values; false (and \p error set) when it
 *        divides by a value < 1 or overflows int64.
 */
bool EvalDim(const DimExpr& e, const std::vector<int64_t>& values, int64_t* result, std::string* error);

/*!
 * \brief Parse and validate a region document.
 * \throws tvm::ffi::Error (ValueError) naming the symbol and the offending field.
 */
RegionGraph ParseRegionGraph(const std::string& json_text);

/*! \brief A declared range as messages show it: "[1, 64]", "[2, ...]" (as byoc_hetero.inputs.range_text). */
std::string RangeText(int64_t lo, int64_t hi);

/*! \brief Render a shape as "[1, 3, 224, 224]". */
std::string ShapeToString(const std::vector<int64_t>& shape);

/*!
 * \brief Typed, checked access to a node's attrs.
 *
 * Every getter takes a default used when the key is absent.  CheckNoUnknown() rejects keys the
 * kernel never asked for, so typos in the codegen fail loudly instead of being ignored.
 */
class AttrReader {
 public:
  AttrReader(const RegionGraph& graph, size_t node_index);

  int64_t Int(const char* key, int64_t default_value);
  /*! \brief A number (integer or floating point JSON value). */
  double Float(const char* key, double default_value);
  bool Flag(const char* key, bool default_value);  // 0/1 or false/true
  std::string Str(const char* key, const std::string& default_value);
  std::vector<int64_t> Ints(const char* key, size_t expected_size,
                            const std::vector<int64_t>& default_value);
  std::vector<double> Floats(const char* key, size_t expected_size,
                             const std::vector<double>& default_value);
  /*! \brief Whether the attribute is present (marks it as known). */
  bool Has(const char* key);
  /*! \brief A string attr restricted to one of \p allowed; an empty default means required. */
  std::string Choice(const char* key, const std::vector<std::string>& allowed,
                     const std::string& default_value);
  /*! \brief Throws if the node has attrs that were never read. */
  void CheckNoUnknown() const;

  /*! \brief Throw a ValueError "<where>: attrs.<key>: <message>". */
  [[noreturn]] void Fail(const char* key, const std::string& message) const;

 private:
  const tvm::ffi::Any* Find(const char* key);

  const RegionGraph& graph_;
  size_t node_index_;
  std::set<std::string> seen_;
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_REGION_GRAPH_H_
