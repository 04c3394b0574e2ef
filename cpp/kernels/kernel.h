/*!
 * \file kernels/kernel.h
 * \brief The interface between the region planner and the per-op kernels.
 *
 * A kernel is built once per node when a module is created: it reads its attrs, checks the
 * shapes, and creates its oneDNN primitive descriptor(s).  It tells the planner, for every
 * node input and for its output, two memory descriptors:
 *
 *   view  the tensor's bytes read as plain (dense, strided) data, with the dims the kernel
 *         reasons in (e.g. dense reads a [B, S, K] input as [B*S, K]; an "NK" dense weight is
 *         [K, N] with strides [1, K]; a grouped conv weight is [G, O/G, I/G, KH, KW]);
 *   want  the layout the primitive reads/writes (usually chosen by oneDNN via format_tag::any,
 *         or, for layout-following ops such as pooling, the layout the producer wrote).
 *
 * The planner owns all memory and all layout changes: it inserts the reorders view -> want
 * (once at __init_ for constants, per call for runtime values), keeps intermediates in the
 * producer's layout, and converts to plain only at the region boundary.  Bind() then maps the
 * planner's memory references onto the primitive's execution arguments.  The planner's jobs live
 * in cpp/plan/ (values.h: the tensor table; buffers.h: slots and buffers; programs.h: the step
 * programs and reorders; layouts.h: layout resolution; concat_in_place.h: producers writing into a
 * concat's buffer; arena.h: arena placement), parts owned by the driver in planner.cc.
 *
 * What a built kernel tells the planner about one node (members of Kernel):
 *   sum_input    a node input (the residual) that the primitive accumulates into its output with
 *                a sum post-op; the planner places that value in the output buffer before the
 *                primitive runs (in place when the residual dies there, else with one copy);
 *   alias_input  the output is the same bytes as this input (reshape); no step runs;
 *   relabel_axes the output is the input's buffer under permuted axes (permute); no step runs.
 *
 * What an op's kernel can do, known before any kernel is built (KernelTraits, declared where the
 * kernel registers; nothing outside the op's own file tests its name):
 *   bf16_input          per input, how a bf16 region reads it (kF32 / kRounds / kLikeOutput):
 *                       decides which values are stored bf16 (OutputOnlyFeedsBf16Convs);
 *   joins_inputs_along  the output is the inputs laid end to end along an axis (concat): their
 *                       producers may write into its buffer (plan/concat_in_place.h);
 *   accepts_int8        reads or writes quantized int8 / uint8 tensors (the int8 kernels);
 *   dynamic_int8_source quantizes a float32 source per call (DynamicQuantizeLinear) itself.
 * An op registered without traits gets the conservative defaults (f32 inputs, no joining, no int8).
 *
 * Adding an op: one file cpp/kernels/<op>.cc holding its builder and the line
 *   BYOC_HETERO_REGISTER_KERNEL("<op>", Build<Op>);            or, with traits,
 *   BYOC_HETERO_REGISTER_KERNEL("<op>", Build<Op>, <Op>Traits());
 * (CMakeLists.txt collects the files; _C.kernels() lists the op, _C.kernel_traits() its traits),
 * and one row in docs/region-format.md describing its inputs and attrs.  Attr names that are
 * string enums shared with Python (activations, algorithms) come from enums.h.
 */
#ifndef BYOC_HETERO_KERNELS_KERNEL_H_
#define BYOC_HETERO_KERNELS_KERNEL_H_

#include <oneapi/dnnl/dnnl.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../enums.h"
#include "../region_graph.h"

namespace byoc_hetero {

using dnnl::memory;

/*! \brief Plain row-major float32 descriptor (a rank-0 shape is read as [1]). */
memory::desc PlainDesc(const memory::dims& dims);
/*!
 * \brief Plain row-major descriptor of a tensor in its own dtype: f32, s32, u8 (bool) and, for
 *        int64, f64 (oneDNN 3.2 has no 64-bit integer type; such bytes are read only by host
 *        kernels, never by a primitive or a reorder).
 */
memory::desc PlainDescOf(const TensorInfo& tensor);

/*!
 * \brief Calls f(T{}) with T the C++ element type of \p dtype (float, int64_t, int32_t, int8_t, or uint8_t for
 *        bool and uint8): the one switch over dtypes that host kernels templated on the element type share.
 */
template <typename F>
decltype(auto) VisitDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(float{});
    case DType::kInt64:
      return f(int64_t{});
    case DType::kInt32:
      return f(int32_t{});
    case DType::kInt8:
      return f(int8_t{});
    default:
      return f(uint8_t{});
  }
}
/*! \brief Float32 descriptor with explicit strides (in elements). */
memory::desc StridedDesc(const memory::dims& dims, const memory::dims& strides);
/*! \brief Descriptor letting oneDNN choose the layout (float32 unless \p dt says otherwise). */
memory::desc AnyDesc(const memory::dims& dims, memory::data_type dt = memory::data_type::f32);
/*! \brief \p md's dims and strides with element type \p dt (e.g. a bf16 copy of a plain view). */
memory::desc WithType(const memory::desc& md, memory::data_type dt);

/*!
 * \brief A matmul whose constant weight oneDNN may lay out (`any`).  Without AVX-512, oneDNN 3.2
 *        runs f32 matmul as its jit SGEMM and keeps such a weight row-major ([..., K, N]); that
 *        SGEMM reads the weight transposed ([..., N, K] rows) 1.1-3x faster (AVX2, 2 threads:
 *        64x784 @ 784x512 303 vs 1157 us; 36 x [196x256 @ 256x256] 5.8 vs 11.5 ms), so then the
 *        weight is asked for transposed.  \p make builds the primitive for a weight descriptor.
 */
dnnl::matmul::primitive_desc MatmulForConstantWeight(
    const std::function<dnnl::matmul::primitive_desc(const memory::desc&)>& make, const memory::dims& wei_dims);
/*! \brief Human-readable descriptor, oneDNN-verbose style: "[1,64,56,56]:aBcd16b" (":bf16" appended
 *         for a non-f32 type, so that prepared-weight keys tell the precisions apart). */
std::string DescribeDesc(const memory::desc& md);

/*! \brief A host (non-oneDNN) step: called with the data pointers of its args, in order. */
using HostFn = std::function<void(const std::vector<void*>& ptrs)>;

/*!
 * \brief How a kernel reads one operand.  With a transform, want is not a relayout of view but
 *        another tensor computed from it (e.g. Winograd-transformed weights): the planner runs
 *        transform({view bytes, want bytes}) instead of a reorder (at __init_ for constants).
 *        With also_reads, the transform reads other inputs of the node as well, each in its plain
 *        layout, between those two: transform({view, input also_reads[0], ..., want}) (dense_wq's codes
 *        with their block scales interleaved: one stream); known at __init_ where the first is.
 */
struct OperandLayout {
  memory::desc view;
  memory::desc want;
  HostFn transform = nullptr;
  std::string transform_name = "";  // tells transformed values apart in the planner's cache
  std::vector<size_t> also_reads;   // node inputs the transform reads too (plain), in this order
};

/*! \brief A memory the planner hands to a kernel: a descriptor over one of its buffers (slots). */
struct MemRef {
  memory::desc md;
  int slot = -1;
};

/*! \brief One execution: a oneDNN primitive (pd set) or a host function (host set). */
struct Step {
  dnnl::primitive_desc_base pd;
  std::vector<std::pair<int, MemRef>> args;  // (DNNL_ARG_*, memory); host steps: order only
  HostFn host;
  std::string label;
  std::string op;  // the node's op, for profiles ("" for planner reorders)
};

/*! \brief An activation (eltwise post-op or eltwise primitive). */
struct Activation {
  std::string name = "none";
  dnnl::algorithm alg = dnnl::algorithm::undef;
  float alpha = 0.f;
  float beta = 0.f;
  bool none() const { return name == "none"; }
};

/*! \brief The epilogue of conv2d / dense / matmul / binary as post-ops. */
struct Epilogue {
  float scale = 1.f;       // matmul: output scaled first (an eltwise_linear post-op), e.g. 1/sqrt(d)
  Activation act;          // after the bias
  bool residual = false;   // sum post-op: output += residual (a node input)
  Activation post_act;     // after the sum
  /*! \brief Non-empty (dense's has_gate): the output times a tensor of these dims (a node input before the
   *         residual), a binary multiply post-op after act and before the sum: a GLU's product. */
  memory::dims gate;
  /*! \brief The index of the gate's multiply among the post-ops MakeAttr appends. */
  int gate_post_op() const { return (scale != 1.f) + !act.none(); }
};

/*! \brief What a kernel builder gets to see. */
struct KernelContext {
  const RegionGraph& graph;
  size_t node_index;
  const dnnl::engine& engine;
  /*! \brief Per node input: the layout its value is stored in when this node runs. */
  std::vector<memory::desc> input_storage;
  /*! \brief Per node input: whether its value is known at __init_ (a constant or folded). */
  std::vector<bool> input_constant;
  /*! \brief This node computes in bf16 (requested by the region or the node's own `precision`,
   *         native, not switched off): anchors read bf16 src/weights, accumulate and write f32
   *         (see NodeComputesBf16). */
  bool bf16 = false;
  /*! \brief A layout the planner would like the output in, or an empty desc: the output's run of
   *         a concat's buffer (plan/concat_in_place.h), which a kernel writing that layout fills in
   *         place.  Kernels free to pick their output layout (host kernels) may follow it. */
  memory::desc output_hint;
  /*! \brief OpenMP threads the plan's primitives are made and run with (a plan per thread count:
   *         the module's own, fewer under contention).  Kernels whose best implementation depends
   *         on it read it here (dense: the inner product only from 2 threads). */
  int threads = 1;

  const NodeInfo& node() const { return graph.nodes[node_index]; }
  const TensorInfo& input(size_t k) const { return graph.tensors[node().inputs[k]]; }
  const TensorInfo& output() const { return graph.tensors[node().output]; }
  /*! \brief "byoc_hetero region '<sym>' node <i> (<op>)". */
  std::string where() const { return graph.where(node_index); }
  /*! \brief Throw a ValueError prefixed with where(). */
  [[noreturn]] void Fail(const std::string& message) const;
  /*! \brief Check the number of node inputs. */
  void ExpectInputCount(size_t expected, const std::string& what) const;
  /*! \brief Check the rank of input k. */
  void ExpectRank(size_t k, const char* name, size_t rank) const;
  /*! \brief Check the output tensor's declared shape against what the op produces. */
  void ExpectOutputShape(const std::vector<int64_t>& produced) const;
  /*! \brief Check that input k has exactly `shape`. */
  void ExpectInputShape(size_t k, const char* name, const std::vector<int64_t>& shape) const;
  /*!
   * \brief The layout input k is stored in, when it has the tensor's dims (else the plain
   *        layout of the tensor's shape): what a layout-following op should read.
   */
  memory::desc InputLayout(size_t k) const;
  /*! \brief Read an activation: attr `key` (default "none") and, for "clip", attr `clip_key`. */
  Activation ReadActivation(AttrReader& attrs, const char* key = "activation",
                            const char* clip_key = "clip") const;
  /*! \brief Read activation/clip, residual (0/1), post_activation/post_clip. */
  Epilogue ReadEpilogue(AttrReader& attrs) const;
  /*! \brief Primitive attributes: user scratchpad and the epilogue's post-ops. */
  dnnl::primitive_attr MakeAttr(const Epilogue& epilogue) const;
  dnnl::primitive_attr MakeAttr() const { return MakeAttr(Epilogue{}); }
};

/*! \brief Attr `epsilon` of a normalization: required, a finite number >= 0. */
double ReadEpsilon(AttrReader& attrs);

/*! \brief Whether oneDNN dispatches AVX-512 (avx512_core or later) kernels on this machine. */
bool IsaHasAvx512();

/*! \brief Whether oneDNN has native bf16 kernels here (effective ISA avx512_core_bf16 or later). */
bool Bf16Native();
/*!
 * \brief The precision a region with \p requested precision computes in, and why it differs:
 *        "bf16" only when requested, native (Bf16Native) and not switched off with
 *        BYOC_HETERO_BF16=off (read when a module is created; tests force the fallback with it).
 *        Without native bf16 oneDNN would emulate it, slower than f32: the region runs f32.
 * \param reason Set to why a bf16 request runs f32 ("" otherwise).
 */
std::string EffectivePrecision(const std::string& requested, std::string* reason = nullptr);

/*!
 * \brief What node \p n of \p g requests: its own attr `precision` ("f32" / "bf16", which a
 *        conv2d, dense or matmul may carry: a tuner's per-node decision) or else the region's.
 *        A value other than "bf16" counts as f32 here; the kernel's ReadNodePrecision rejects it.
 */
std::string RequestedNodePrecision(const RegionGraph& g, size_t n);
/*! \brief Whether node \p n computes in bf16: EffectivePrecision of RequestedNodePrecision. */
bool NodeComputesBf16(const RegionGraph& g, size_t n);
/*!
 * \brief Read (and so validate) the optional node attr `precision` of a conv2d / dense / matmul:
 *        "f32" or "bf16", default the region's. What it computes in is KernelContext::bf16, set
 *        from NodeComputesBf16 before the kernel is built.
 */
std::string ReadNodePrecision(const KernelContext& ctx, AttrReader& attrs);

/*!
 * \brief In a bf16 region, whether node \p ctx's output may be stored as bf16: it is no region
 *        output and every node reading it declares (KernelTraits::bf16_input) that it rounds it to
 *        bf16 anyway (the data of a conv2d, the operands of a dense or a matmul) or reads it like
 *        its own output, which qualifies in turn (a reshape, permute or pool2d; a conv2d's
 *        residual: a bf16 residual stream).  See kernel.cc and the kernels' traits.
 */
bool OutputOnlyFeedsBf16Convs(const KernelContext& ctx);
/*! \brief \p plain as bf16 when OutputOnlyFeedsBf16Convs(ctx), else \p plain itself. */
memory::desc Bf16OutputIfRounded(const KernelContext& ctx, const memory::desc& plain);
/*!
 * \brief make(dst), or make(fallback) when oneDNN has no implementation writing dst (e.g. an
 *        f32 -> bf16 normalization on an older oneDNN): a bf16 destination is an optimization only.
 */
template <typename Make>
auto TryWithType(const Make& make, const memory::desc& dst, const memory::desc& fallback) -> decltype(make(dst)) {
  if (dst == fallback) return make(dst);
  try {
    return make(dst);
  } catch (const dnnl::error&) {
    return make(fallback);
  }
}

/*! \brief aBcd8b / aBcd16b when md is a 4-d f32 tensor in that channel-blocked layout. */
std::optional<memory::format_tag> ChannelBlockedTag(const memory::desc& md);

class Kernel {
 public:
  virtual ~Kernel() = default;
  /*! \brief Layouts, one per node input (same order as the node's inputs). */
  const std::vector<OperandLayout>& inputs() const { return inputs_; }
  const OperandLayout& output() const { return output_; }
  /*! \brief The node input accumulated into the output by a sum post-op, or -1. */
  int sum_input() const { return sum_input_; }
  /*! \brief The node input whose bytes the output is (a reshape), or -1. */
  int alias_input() const { return alias_input_; }
  /*!
   * \brief A permute's axes (output dim i is input dim axes[i]), else empty.  The planner may then
   *        give the output the input's own buffer under a permuted descriptor (oneDNN's
   *        memory::desc::permute_axes) instead of running Bind()'s reorder: a permute of a value
   *        whose storage already has the permuted order (a conv writing NHWC, read as [N,H,W,C])
   *        costs nothing, and any other is paid once by the consumer's reorder, which it needs
   *        anyway when the layouts differ.
   */
  const std::vector<int64_t>& relabel_axes() const { return relabel_axes_; }
  /*!
   * \brief A box of input 0 the output is (a slice): per axis its first element and step, else empty.
   *        The planner may then give the output the input's bytes under strides, with no step
   *        (LayoutResolver::SliceView), where every reader takes strided input (KernelTraits::strided_input).
   */
  struct Box {
    std::vector<int64_t> begin, steps;
  };
  const Box& view_box() const { return view_box_; }
  /*! \brief Declare the output the box \p begin / \p steps of input 0 (view_box). */
  void SetViewBox(std::vector<int64_t> begin, std::vector<int64_t> steps) {
    view_box_ = {std::move(begin), std::move(steps)};
  }
  /*!
   * \brief Hand input \p k over where its value lies: the planner gives the kernel the value's storage
   *        (\p stored, a float32 layout of the tensor's \p plain dims under strides) with no copy, and
   *        Bind passes those bytes to the primitive under the descriptor the operand had as its wanted
   *        layout (the same bytes named by the operand's own dims: a matmul's view composed with the
   *        strides the value is stored under).
   */
  void HandOverStored(size_t k, const memory::desc& plain, const memory::desc& stored);
  /*!
   * \brief Map memories onto execution steps.
   * \param inputs One memory per node input, each with inputs()[k].want as descriptor (for the
   *        sum input: the output memory, already holding the residual).
   * \param output The output memory, with output().want as descriptor.
   * \param temps One memory per entry of temps(), same order.
   */
  virtual std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                                 const std::vector<MemRef>& temps) const = 0;
  /*! \brief Per-call scratch buffers the kernel's steps share (e.g. Winograd tiles), plain. */
  const std::vector<memory::desc>& temps() const { return temps_; }

 protected:
  std::vector<OperandLayout> inputs_;
  std::vector<memory::desc> temps_;
  OperandLayout output_;
  int sum_input_ = -1;
  int alias_input_ = -1;
  std::vector<int64_t> relabel_axes_;
  Box view_box_;
  /*! \brief Per input, the descriptor Bind passes (HandOverStored), or an empty one: the planner's. */
  std::vector<memory::desc> bound_;
  /*! \brief \p m as Bind passes input \p k: under bound_[k] where HandOverStored set it. */
  MemRef BoundInput(size_t k, const MemRef& m) const {
    return k < bound_.size() && !bound_[k].is_zero() ? MemRef{bound_[k], m.slot} : m;
  }
};

/*!
 * \brief A kernel that is a single primitive; node input k is passed as exec arg input_args[k]
 *        (0 = not passed, e.g. the sum input, which lives in the destination).
 */
class PrimitiveKernel : public Kernel {
 public:
  PrimitiveKernel(std::string label, std::string op, dnnl::primitive_desc_base pd,
                  std::vector<int> input_args, std::vector<OperandLayout> inputs,
                  OperandLayout output, int sum_input = -1);
  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override;

 private:
  std::string label_;
  std::string op_;
  dnnl::primitive_desc_base pd_;
  std::vector<int> input_args_;
};

/*!
 * \brief The kernel of an anchor op (conv2d, dense, matmul) built on one primitive: node inputs
 *        are data, weights, [bias,] [gate (epilogue.gate),] [residual]; each is read through its plain
 *        view, and the residual is accumulated in place (the planner puts it in the destination).
 */
std::unique_ptr<Kernel> MakeAnchorKernel(const KernelContext& ctx, const char* op,
                                         dnnl::primitive_desc_base pd, const memory::desc& src_view,
                                         const memory::desc& wei_view, const memory::dims& bias_dims,
                                         bool has_bias, const memory::dims& dst_dims,
                                         const Epilogue& epilogue);

/*! \brief A kernel computed by a host function over plain inputs and a plain output. */
class HostKernel : public Kernel {
 public:
  HostKernel(std::string label, std::string op, HostFn fn, std::vector<memory::desc> inputs,
             memory::desc output);
  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override;
  /*! \brief Read input 0 in layout \p input and write the output in \p output (same dims) instead of
   *         the plain layouts: for element-wise functions that do not care where an element sits. */
  void FollowLayout(const memory::desc& input, const memory::desc& output);
  /*! \brief Read input \p k in layout \p want (its dims) instead of the plain one: the planner
   *         reorders the value there unless it is stored that way. */
  void ReadInputIn(size_t k, const memory::desc& want);

 private:
  std::string label_;
  std::string op_;
  HostFn fn_;
};

/*! \brief A kernel whose output is its input's bytes under another shape (no step). */
class AliasKernel : public Kernel {
 public:
  AliasKernel(memory::desc input_view, memory::desc output_view);
  std::vector<Step> Bind(const std::vector<MemRef>&, const MemRef&,
                         const std::vector<MemRef>&) const override {
    return {};
  }
};

using KernelBuilder = std::unique_ptr<Kernel> (*)(const KernelContext&);

/*! \brief How a node reads one of its inputs in a bf16 region (KernelTraits::bf16_input). */
enum class Bf16Read {
  kF32,         // computes with the f32 value: it must stay f32 (the default)
  kRounds,      // rounds it to bf16 anyway (a conv2d's data, a dense's or a matmul's operands)
  kLikeOutput,  // reads it bf16 exactly when the node's own output is stored bf16 (a reshape, a max pool)
};

/*! \brief How a node reads an input held under strides (a permute's relabelled buffer, a slice's view;
 *         KernelTraits::strided_input). */
enum class StridedRead {
  kCopies,    // reads plain bytes: the planner copies such a value first (the default)
  kInPlace,   // reads it where it lies, under its strides (a matmul's a and b, a slice)
  kPassesOn,  // its output views the same bytes (a reshape, a permute): as its own readers read it
};

/*!
 * \brief What an op's kernel can do, declared where it registers (BYOC_HETERO_REGISTER_KERNEL's
 *        optional third argument), so that the planner and other kernels ask the op instead of
 *        switching on op names.  The defaults are the conservative answers: an op registered
 *        without traits keeps its inputs f32, joins nothing and reads no int8.
 *
 * Per-node facts that depend on a built kernel stay on Kernel (sum_input, alias_input,
 * relabel_axes, each operand's view / want): these traits are what is known before any kernel of
 * the region is built, from the node alone (op and attrs), which is when they are asked.
 */
struct KernelTraits {
  /*!
   * \brief Per node input, how a bf16 region reads it (Bf16Read); nullptr: kF32 for every input.
   *        OutputOnlyFeedsBf16Convs asks it of every reader of a value to decide whether the
   *        producer stores that value bf16; an op answering kLikeOutput for an input must then read
   *        it bf16 (ctx.InputLayout) and write its output bf16 when OutputOnlyFeedsBf16Convs(ctx).
   */
  Bf16Read (*bf16_input)(const NodeInfo& node, size_t k) = nullptr;
  /*!
   * \brief The axis along which the node's output is its inputs laid end to end (a concat), or
   *        nullopt; nullptr: never.  The planner then lets the producers of the inputs write their
   *        slices of the output's buffer in place (plan/concat_in_place.h).
   */
  std::optional<int64_t> (*joins_inputs_along)(const NodeInfo& node) = nullptr;
  /*!
   * \brief The kernel reads or writes quantized int8 / uint8 tensors (conv2d, dense, pool2d,
   *        quantize, dequantize); the planner refuses an 8-bit operand of any other op, whose
   *        kernel would read the bytes as another type.
   */
  bool accepts_int8 = false;
  /*!
   * \brief The int8 kernel can read a float32 source and quantize it per call to uint8 with the
   *        scale and zero point of ONNX's DynamicQuantizeLinear (attr src_dynamic = 1, int8.h):
   *        the region pass fuse_dynamic_int8_sources (ops/qdq_dynamic.py) asks it, not the op name.
   */
  bool dynamic_int8_source = false;
  /*!
   * \brief The kernel reads float16 tensors (dense_wq's scales); the planner refuses a float16
   *        operand of any other op (VisitDType and the float32 kernels do not know the type).
   */
  bool accepts_float16 = false;
  /*!
   * \brief Node inputs the kernel writes in place (kv_attention's KV caches), besides its output.
   *        The planner accepts such an input only as a region input (the caller's buffer, read
   *        zero-copy: the kernel declares it plain), float32, read by no other node and no region
   *        output (CompiledRegion refuses any other document: docs/region-format.md, "Written
   *        inputs").  Empty: the kernel writes only its output.
   */
  std::vector<size_t> writes_inputs;
  /*!
   * \brief Per node input, how the kernel reads a value held under strides (StridedRead); nullptr:
   *        kCopies for every input.  The planner makes a slice a view of its input's bytes
   *        (LayoutResolver::SliceView) only where every reader reads it in place, through views.
   */
  StridedRead (*strided_input)(const NodeInfo& node, size_t k) = nullptr;

  /*! \brief strided_input(node, k), or kCopies when not declared. */
  StridedRead StridedInput(const NodeInfo& node, size_t k) const {
    return strided_input != nullptr ? strided_input(node, k) : StridedRead::kCopies;
  }
  /*! \brief bf16_input(node, k), or kF32 when not declared. */
  Bf16Read Bf16Input(const NodeInfo& node, size_t k) const {
    return bf16_input != nullptr ? bf16_input(node, k) : Bf16Read::kF32;
  }
  /*! \brief joins_inputs_along(node), or nullopt when not declared. */
  std::optional<int64_t> JoinAxis(const NodeInfo& node) const {
    return joins_inputs_along != nullptr ? joins_inputs_along(node) : std::nullopt;
  }
};

/*! \brief A KernelTraits::bf16_input: every input kLikeOutput (reshape, permute, eltwise, pool2d). */
Bf16Read Bf16ReadLikeOutput(const NodeInfo& node, size_t k);
/*! \brief Whether values are read where they lie under strides: BYOC_HETERO_SLICE_VIEWS=on (read at each
 *         call, when a region is planned): slices planned as views (plan/layouts.h SliceView) and a
 *         matmul's a / b read under the strides they are stored with (kernels/matmul.cc).  Opt-in: session 15's
 *         quiet A/B measured it level (0.999x; bench/ZOO.md: oneDNN 3.2's brgemm takes dense strides only). */
bool StridedReadsOn();
/*! \brief A KernelTraits::strided_input: every input kPassesOn (reshape, permute: their output views it). */
StridedRead StridedPassesOn(const NodeInfo& node, size_t k);

/*!
 * \brief Registers a builder for an op when the library is loaded (use the macro below).  Two
 *        builders for one op abort at load: that is a build mistake, not a runtime condition.
 *
 * The kernel objects are linked into the extension as object files (CMakeLists.txt collects
 * every cpp/kernels/ source into the target's sources, not into a static archive), so the linker keeps
 * every registrar; an archive would drop the files nothing else references.
 */
struct KernelRegistrar {
  KernelRegistrar(const char* op, KernelBuilder builder, KernelTraits traits = KernelTraits());
};

#define BYOC_HETERO_KERNEL_CONCAT_(a, b) a##b
#define BYOC_HETERO_KERNEL_CONCAT(a, b) BYOC_HETERO_KERNEL_CONCAT_(a, b)
/*!
 * \brief In a kernels/<op>.cc, at namespace scope: BYOC_HETERO_REGISTER_KERNEL("op", Build); or,
 *        declaring what the kernel can do, BYOC_HETERO_REGISTER_KERNEL("op", Build, OpTraits());
 *        with OpTraits() returning its KernelTraits.
 */
#define BYOC_HETERO_REGISTER_KERNEL(op, ...)                                                       \
  static const ::byoc_hetero::KernelRegistrar BYOC_HETERO_KERNEL_CONCAT(kernel_registrar_, __LINE__)( \
      op, __VA_ARGS__)

/*! \brief The builder for an op, or nullptr. */
KernelBuilder FindKernelBuilder(const std::string& op);
/*! \brief The traits an op's kernel declared (the defaults for an op without a kernel). */
const KernelTraits& FindKernelTraits(const std::string& op);
/*! \brief The ops this runtime can execute, sorted. */
std::vector<std::string> SupportedOps();

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_KERNEL_H_
