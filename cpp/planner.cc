/*!
 * \file planner.cc
 * \brief The planner (see planner.h): layouts, slots, reorders, the arena.
 *
 * Every tensor of the region gets a ValueState:
 *   storage     the slot its value lives in during a run, in storage_md (the producer's layout,
 *               possibly blocked; plain for region inputs and constants);
 *   plain       a slot holding the same value in plain row-major bytes (plain_md), when one
 *               exists: region inputs/outputs (the caller's buffers), constants, intermediates
 *               whose producer writes plain, or a plain copy made on demand.
 * A consumer asks for (view, want).  The planner hands it the storage directly when the layouts
 * agree, and otherwise inserts one reorder.  A value known at __init_ (a constant, or the output
 * of a node whose inputs are all such values) is converted in the init program, once; everything
 * else goes to the run program, in node order.
 *
 * A sum post-op (residual add) accumulates into the destination: the planner reuses the
 * residual's own buffer as the destination when the residual is an intermediate in the same
 * layout that no later node reads, and otherwise copies the residual into the destination first.
 */
#include "planner.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "threading.h"

namespace byoc_hetero {

std::string DnnlStatusName(dnnl_status_t s) {
  switch (s) {
    case dnnl_out_of_memory:
      return "out_of_memory";
    case dnnl_invalid_arguments:
      return "invalid_arguments";
    case dnnl_unimplemented:
      return "unimplemented";
    case dnnl_runtime_error:
      return "runtime_error";
    default:
      return "status " + std::to_string(static_cast<int>(s));
  }
}

void ThrowDnnlError(const std::string& where, const char* action, const dnnl::error& e) {
  TVM_FFI_THROW(RuntimeError) << where << ": oneDNN failed to " << action << ": " << e.what() << " ("
                              << DnnlStatusName(e.status) << ")";
  TVM_FFI_UNREACHABLE();
}

int64_t Plan::shared_bytes() const {
  int64_t total = 0;
  for (const SharedBuffer& b : shared) total += static_cast<int64_t>(b.bytes);
  return total;
}

std::vector<std::string> Plan::Describe() const {
  std::vector<std::string> lines;
  for (const auto* steps : {&init_steps, &run_steps}) {
    const char* phase = steps == &init_steps ? "init" : "run";
    for (const PlannedStep& s : *steps) lines.push_back(std::string(phase) + " | " + s.label + " | " + s.impl + s.layouts);
  }
  for (const std::string& note : notes) lines.push_back("note | " + note);
  return lines;
}

namespace {

struct ValueState {
  bool is_const = false;       // known at __init_
  bool aliased = false;        // its storage slot is also another value's (reshape)
  // Values of one order id hold their elements in the same row-major order (a value and its
  // reshapes); -1: the value's own tensor id. A permute keeps the storage slot but not the order.
  int order = -1;
  bool region_output = false;
  int last_use = -1;           // last node reading it
  int storage = -1;
  memory::desc storage_md;
  memory::desc plain_md;
  int plain = -1;
};

/*! \brief A step and the shared buffer it completes (init program), before compilation. */
struct Pending {
  Step step;
  int writes = -1;
};

/*! \brief " src=... wei=... dst=..." for a primitive, " in=... out=..." for a host step. */
std::string StepLayouts(const PlannedStep& s) {
  std::ostringstream os;
  if (s.host) {
    for (size_t k = 0; k < s.args.size(); ++k) {
      os << (k + 1 == s.args.size() ? " out=" : " in=") << DescribeDesc(s.args[k].second.md);
    }
    return os.str();
  }
  const std::pair<int, const char*> names[] = {{DNNL_ARG_SRC, "src"},     {DNNL_ARG_SRC_1, "src1"},
                                               {DNNL_ARG_WEIGHTS, "wei"}, {DNNL_ARG_BIAS, "bia"},
                                               {DNNL_ARG_DST, "dst"}};
  for (const auto& [arg, name] : names) {
    for (const auto& [a, ref] : s.args) {
      if (a == arg) os << " " << name << "=" << DescribeDesc(ref.md);
    }
  }
  return os.str();
}

class Planner {
 public:
  Planner(const RegionGraph& g, const dnnl::engine& engine, Plan* plan)
      : g_(g), engine_(engine), plan_(*plan) {}

  void Run() {
    plan_.where = g_.where();
    plan_.symbol = g_.symbol;
    plan_.num_constants = g_.constants.size();
    plan_.precision = EffectivePrecision(g_.precision, &plan_.precision_note);
    for (int t : g_.outputs) plan_.output_shapes.push_back(g_.tensors[t].shape);

    for (size_t i = 0; i < plan_.num_buffers(); ++i) run_arg_slot_.push_back(NewSlot(SlotKind::kRunArg, i));
    for (size_t i = 0; i < g_.constants.size(); ++i) const_arg_slot_.push_back(NewSlot(SlotKind::kConstArg, i));
    scratch_slot_ = NewSlot(SlotKind::kScratch, 0);

    values_.resize(g_.tensors.size());
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      for (int t : g_.nodes[n].inputs) values_[t].last_use = static_cast<int>(n);
    }
    for (int t : g_.outputs) values_[t].region_output = true;
    FindConcatSlices();
    for (size_t i = 0; i < g_.inputs.size(); ++i) {
      ValueState& v = values_[g_.inputs[i]];
      v.plain_md = v.storage_md = PlainDescOf(g_.tensors[g_.inputs[i]]);
      v.storage = v.plain = run_arg_slot_[i];
    }
    for (size_t i = 0; i < g_.constants.size(); ++i) {
      ValueState& v = values_[g_.constants[i].tensor];
      v.is_const = true;
      v.plain_md = v.storage_md = PlainDescOf(g_.tensors[g_.constants[i].tensor]);
      v.storage = v.plain = const_arg_slot_[i];
    }

    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const NodeInfo& node = g_.nodes[n];
      KernelBuilder builder = FindKernelBuilder(node.op);
      if (builder == nullptr) {
        std::string ops;
        for (const auto& op : SupportedOps()) ops += (ops.empty() ? "" : ", ") + op;
        TVM_FFI_THROW(ValueError) << g_.where() << ": field 'nodes[" << n << "].op': unknown op '"
                                  << node.op << "' (supported: " << ops << ")";
      }
      KernelContext ctx{g_, n, engine_, {}, {}, plan_.precision == kPrecisionBf16};
      bool all_const = !node.inputs.empty();
      for (int t : node.inputs) {
        ctx.input_storage.push_back(values_[t].storage_md);
        ctx.input_constant.push_back(values_[t].is_const);
        all_const = all_const && values_[t].is_const;
      }
      std::unique_ptr<Kernel> kernel;
      try {
        kernel = builder(ctx);
      } catch (const dnnl::error& e) {
        // A float32 kernel handed a non-float32 tensor fails in oneDNN first: say why.
        for (int t : node.inputs) {
          if (g_.tensors[t].dtype != DType::kFloat32) {
            TVM_FFI_THROW(ValueError) << g_.where(n) << ": tensor " << t << " has dtype "
                                      << DTypeName(g_.tensors[t].dtype) << ", which this op does not read"
                                      << " (it runs on float32 tensors)";
          }
        }
        ThrowDnnlError(g_.where(n), "create the primitive", e);
      }
      if (kernel->inputs().size() != node.inputs.size()) {
        TVM_FFI_THROW(InternalError) << g_.where(n) << ": kernel declared " << kernel->inputs().size()
                                     << " operands for " << node.inputs.size() << " inputs";
      }
      // A kernel reads each tensor in the tensor's own dtype; a float32-only kernel handed an int64
      // tensor (a codegen bug, or a hand-written document) must fail here, not read wrong bytes.
      for (size_t k = 0; k <= node.inputs.size(); ++k) {
        const int t = k < node.inputs.size() ? node.inputs[k] : node.output;
        const memory::desc& view = k < node.inputs.size() ? kernel->inputs()[k].view : kernel->output().view;
        if (view.get_data_type() != PlainDescOf(g_.tensors[t]).get_data_type()) {
          TVM_FFI_THROW(ValueError) << g_.where(n) << ": tensor " << t << " has dtype "
                                    << DTypeName(g_.tensors[t].dtype) << ", which this op does not read"
                                    << " (it runs on float32 tensors)";
        }
      }
      const bool at_init = all_const && !values_[node.output].region_output;
      node_where_ = g_.where(n);
      GuardDnnl(g_.where(n), "set up buffers and reorders", [&] { PlanNode(n, *kernel, at_init); });
    }
    Compile(&init_, &plan_.init_steps, &plan_.init_scratch_bytes);
    Compile(&run_, &plan_.run_steps, &plan_.run_scratch_bytes);
    PlaceIntermediates();
  }

 private:
  // ---- slots ---------------------------------------------------------------------------------
  int NewSlot(SlotKind kind, size_t index) {
    plan_.slots.push_back({kind, static_cast<int>(index)});
    return static_cast<int>(plan_.slots.size()) - 1;
  }
  /*!
   * \brief A slot for a value computed at init (a shared buffer named \p key) or per call (a
   *        private buffer).  Asking twice for one key gives one buffer.
   */
  int OwnSlot(bool at_init, const memory::desc& md, const std::string& key) {
    if (at_init) {
      for (size_t s = 0; s < plan_.slots.size(); ++s) {
        const Slot& slot = plan_.slots[s];
        if (slot.kind == SlotKind::kShared && plan_.shared[slot.index].key == key) return static_cast<int>(s);
      }
      plan_.shared.push_back({md.get_size(), key, node_where_});
      return NewSlot(SlotKind::kShared, plan_.shared.size() - 1);
    }
    size_t numel = 1;
    for (auto d : md.get_dims()) numel *= static_cast<size_t>(d);
    plan_.privates.push_back({md.get_size(), md.get_size() != numel * memory::data_type_size(md.get_data_type())});
    return NewSlot(SlotKind::kPrivate, plan_.privates.size() - 1);
  }
  static std::string Key(int t, const memory::desc& view, const memory::desc& want,
                         const std::string& transform = "") {
    return "tensor " + std::to_string(t) + " " + DescribeDesc(view) + " -> " + DescribeDesc(want) +
           (transform.empty() ? "" : " " + transform);
  }
  /*! \brief The shared buffer a slot is, or -1. */
  int SharedIndex(int slot) const {
    return plan_.slots[slot].kind == SlotKind::kShared ? plan_.slots[slot].index : -1;
  }

  Step MakeReorder(const MemRef& src, const MemRef& dst, const std::string& label) {
    const memory::data_type dt = src.md.get_data_type();
    // u8 / s8 bytes: oneDNN reorders them (an int8 weight into its blocked layout with the
    // compensation the int8 conv reads; activations between layouts)
    const bool int8 = dt == memory::data_type::u8 || dt == memory::data_type::s8;
    if (dt != memory::data_type::f32 && dt != memory::data_type::bf16 && !(int8 && dst.md.get_data_type() == dt)) {
      // int64 / int32 / bool bytes (f64 / s32 / u8 descriptors, PlainDescOf): oneDNN 3.2 has no
      // reorder for f64 (an int64 constant failed to plan with "unimplemented"), and a value
      // conversion is never wanted here: the bytes are copied as they are, on the host.
      return MakeHostCopy(src, dst, label);
    }
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    Step step;
    step.label = label;
    step.pd = GuardDnnl(label, "create a reorder", [&] {
      return dnnl::reorder::primitive_desc(engine_, src.md, engine_, dst.md, attr);
    });
    step.args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    return step;
  }
  /*!
   * \brief A host step copying src's elements into dst as raw bytes: both plain strided (no
   *        blocking), same dims and element type; dense equal layouts copy in one memcpy.
   */
  Step MakeHostCopy(const MemRef& src, const MemRef& dst, const std::string& label) {
    const memory::desc& s = src.md;
    const memory::desc& d = dst.md;
    if (s.get_data_type() != d.get_data_type() || s.get_dims() != d.get_dims() ||
        s.get_format_kind() != memory::format_kind::blocked || d.get_format_kind() != memory::format_kind::blocked ||
        s.get_inner_nblks() != 0 || d.get_inner_nblks() != 0) {
      TVM_FFI_THROW(InternalError) << label << ": a copy of integer/bool bytes needs two plain strided "
                                   << "descriptors of one type and shape, got " << DescribeDesc(s) << " -> "
                                   << DescribeDesc(d);
    }
    const size_t esize = memory::data_type_size(s.get_data_type());
    const memory::dims dims = s.get_dims();
    const memory::dims ss = s.get_strides();
    const memory::dims ds = d.get_strides();
    const int64_t s_off = s.get_submemory_offset();
    const int64_t d_off = d.get_submemory_offset();
    int64_t numel = 1;
    for (auto x : dims) numel *= x;
    // Dense row-major on both sides: one memcpy.
    bool dense = true;
    int64_t expect = 1;
    for (size_t i = dims.size(); i-- > 0;) {
      if (dims[i] != 1 && (ss[i] != expect || ds[i] != expect)) dense = false;
      expect *= dims[i];
    }
    Step step;
    step.label = label;
    step.args = {{0, src}, {1, dst}};
    step.host = [=](const std::vector<void*>& ptrs) {
      const char* from = static_cast<const char*>(ptrs[0]) + s_off * esize;
      char* to = static_cast<char*>(ptrs[1]) + d_off * esize;
      if (numel == 0) return;
      if (dense) {
        std::memcpy(to, from, static_cast<size_t>(numel) * esize);
        return;
      }
      std::vector<int64_t> idx(dims.size(), 0);
      for (int64_t e = 0; e < numel; ++e) {
        int64_t so = 0, dof = 0;
        for (size_t i = 0; i < dims.size(); ++i) {
          so += idx[i] * ss[i];
          dof += idx[i] * ds[i];
        }
        std::memcpy(to + dof * esize, from + so * esize, esize);
        for (size_t i = dims.size(); i-- > 0;) {
          if (++idx[i] < dims[i]) break;
          idx[i] = 0;
        }
      }
    };
    return step;
  }
  void Add(bool at_init, Step step, int writes_slot) {
    if (at_init) {
      init_.push_back({std::move(step), writes_slot >= 0 ? SharedIndex(writes_slot) : -1});
    } else {
      run_.push_back({std::move(step), -1});
    }
  }
  void AddReorder(bool at_init, const MemRef& src, const MemRef& dst, const std::string& label) {
    Add(at_init, MakeReorder(src, dst, label), dst.slot);
  }

  // ---- planning ------------------------------------------------------------------------------
  /*!
   * \brief A memory with layout.want holding tensor t, for node `consumer`.
   * \param init_consumer The consumer runs in the init program: a constant's own data may be
   *        handed over without a copy.
   */
  MemRef Resolve(int t, const OperandLayout& layout, size_t consumer, bool init_consumer) {
    for (const auto& e : resolved_) {
      // Reshapes of one value (BERT's Q/K/V denses each read their own reshape of one layer norm)
      // are the same bytes: one conversion serves them all. Aliased storage is never written in
      // place (a residual sum reuses only unaliased buffers), so the bytes stay that value's.
      // A permute of such a value shares its slot too but reads its elements in another order: a
      // plain [M, K] view of the one is not a view of the other.
      const bool same_bytes = e.tensor == t || (values_[t].aliased && values_[e.tensor].aliased &&
                                                values_[t].storage == values_[e.tensor].storage &&
                                                OrderOf(t) == OrderOf(e.tensor));
      if (same_bytes && e.view == layout.view && e.want == layout.want &&
          e.transform == layout.transform_name && (!e.init_only || init_consumer)) {
        return e.mem;
      }
    }
    ValueState& v = values_[t];
    const bool at_init = v.is_const;
    if (layout.transform) {
      // Another tensor computed from the plain value (at __init_ when the value is known then).
      const MemRef src = Resolve(t, {layout.view, layout.view}, consumer, /*init_consumer=*/at_init);
      const MemRef result{layout.want,
                          OwnSlot(at_init, layout.want, Key(t, layout.view, layout.want, layout.transform_name))};
      Step step;
      step.host = layout.transform;
      step.label = g_.where(consumer) + ": " + layout.transform_name + " from tensor " + std::to_string(t);
      step.args = {{0, src}, {1, result}};
      Add(at_init, std::move(step), result.slot);
      resolved_.push_back({t, layout.view, layout.want, layout.transform_name, result, false});
      return result;
    }
    const std::string label = g_.where(consumer) + ": reorder of tensor " + std::to_string(t) + " " +
                              DescribeDesc(layout.view) + " -> " + DescribeDesc(layout.want);
    if (layout.view.get_size() != v.plain_md.get_size()) {
      TVM_FFI_THROW(InternalError) << g_.where(consumer) << ": kernel views tensor " << t << " as "
                                   << DescribeDesc(layout.view) << ", which does not cover its "
                                   << DescribeDesc(v.plain_md);
    }
    const std::string key = Key(t, layout.view, layout.want);
    MemRef result;
    bool init_only = false;
    if (g_.roles[t] == TensorRole::kConstant) {
      const MemRef src{layout.view, v.storage};
      if (init_consumer && layout.want == layout.view) {
        result = src;  // read in place during __init_
        init_only = true;
      } else {
        result = {layout.want, OwnSlot(true, layout.want, key)};
        AddReorder(true, src, result, label);
      }
    } else if (layout.view == v.plain_md && layout.want == v.storage_md) {
      result = {v.storage_md, v.storage};  // zero-copy
    } else if (layout.view == v.plain_md && v.plain < 0) {
      result = {layout.want, OwnSlot(at_init, layout.want, key)};  // blocked -> other layout
      AddReorder(at_init, {v.storage_md, v.storage}, result, label);
    } else if (v.plain < 0 && v.storage_md == WithType(v.plain_md, memory::data_type::bf16) &&
               layout.view.get_data_type() == memory::data_type::f32) {
      // Plain bf16 bytes read through another view (a dense's [M, K], a matmul's strides): the
      // same view over the bf16 bytes, no f32 copy.
      const MemRef src{WithType(layout.view, memory::data_type::bf16), v.storage};
      if (layout.want == src.md) {
        result = src;
      } else {
        result = {layout.want, OwnSlot(at_init, layout.want, key)};
        AddReorder(at_init, src, result, label);
      }
    } else {
      if (v.plain < 0) {
        // The consumer reads the bytes differently (e.g. flattened): materialize plain bytes.
        v.plain = OwnSlot(at_init, v.plain_md, Key(t, v.storage_md, v.plain_md));
        AddReorder(at_init, {v.storage_md, v.storage}, {v.plain_md, v.plain},
                   g_.where(consumer) + ": plain copy of tensor " + std::to_string(t));
      }
      const MemRef src{layout.view, v.plain};
      if (layout.want == layout.view) {
        result = src;
      } else {
        result = {layout.want, OwnSlot(at_init, layout.want, key)};
        AddReorder(at_init, src, result, label);
      }
    }
    resolved_.push_back({t, layout.view, layout.want, "", result, init_only});
    return result;
  }

  /*! \brief The order id of tensor t (ValueState::order). */
  int OrderOf(int t) const { return values_[t].order >= 0 ? values_[t].order : t; }

  int OutputPosition(int t) const {
    for (size_t i = 0; i < g_.outputs.size(); ++i) {
      if (g_.outputs[i] == t) return static_cast<int>(i);
    }
    return -1;
  }

  /*!
   * \brief Decide where node n's output lives; returns the memory the kernel writes.
   * \param reuse A private slot the output may take over (a dying residual), or -1.
   */
  MemRef DefineOutput(size_t n, const OperandLayout& layout, bool at_init, int reuse, std::vector<Step>* trailing) {
    const int t = g_.nodes[n].output;
    ValueState& v = values_[t];
    const memory::desc tensor_plain = PlainDescOf(g_.tensors[t]);
    if (layout.view.get_size() != tensor_plain.get_size()) {
      TVM_FFI_THROW(InternalError) << g_.where(n) << ": kernel output view " << DescribeDesc(layout.view)
                                   << " does not cover tensor " << t;
    }
    v.is_const = at_init;
    v.plain_md = layout.view;
    v.storage_md = layout.want;
    const int out_pos = OutputPosition(t);
    if (out_pos >= 0) {
      const int user = run_arg_slot_[g_.inputs.size() + out_pos];
      v.plain = user;
      if (layout.want == layout.view) {
        v.storage = user;  // the kernel writes straight into the caller's buffer
      } else {
        v.storage = reuse >= 0 ? reuse : OwnSlot(false, layout.want, "");
        trailing->push_back(MakeReorder({layout.want, v.storage}, {layout.view, user},
                                        g_.where(n) + ": output tensor " + std::to_string(t) + " " +
                                            DescribeDesc(layout.want) + " -> plain"));
      }
    } else {
      v.storage = reuse >= 0 ? reuse : OwnSlot(at_init, layout.want, Key(t, layout.view, layout.want));
      if (layout.want == layout.view) v.plain = v.storage;
    }
    return {layout.want, v.storage};
  }

  /*!
   * \brief Plan a permute (Kernel::relabel_axes) as a new descriptor over its input's buffer,
   *        with no step: returns false (plan it as a reorder) for a value known at __init_ (a
   *        constant's data is reachable only there, and the reorder runs once anyway), a non-f32
   *        value, or one whose storage has other dims (a dense's [B*S, N]) and no plain copy.
   *        The output's storage is the input's storage (blocked or not) with its axes permuted;
   *        it counts as plain only when that is row-major for the output's dims (NHWC bytes read
   *        as [N,H,W,C]).  A consumer wanting another layout pays one reorder, the one the
   *        permute's own step would have cost.
   */
  bool Relabel(size_t n, const Kernel& kernel) {
    const NodeInfo& node = g_.nodes[n];
    const int t_in = node.inputs[0], t_out = node.output;
    ValueState& in = values_[t_in];
    const memory::desc in_plain = PlainDescOf(g_.tensors[t_in]);
    if (in.is_const || in_plain.get_data_type() != memory::data_type::f32) return false;
    MemRef src;
    if (in.storage_md.get_dims() == in_plain.get_dims() &&
        in.storage_md.get_format_kind() == memory::format_kind::blocked) {
      src = {in.storage_md, in.storage};
    } else if (in.plain >= 0 && in.plain_md == PlainDesc(in.plain_md.get_dims())) {
      src = {in_plain, in.plain};  // row-major bytes, read under the tensor's own dims
    } else {
      return false;
    }
    const std::vector<int64_t>& axes = kernel.relabel_axes();
    std::vector<int> perm(axes.size());  // oneDNN's: input dim i becomes output dim perm[i]
    for (size_t i = 0; i < axes.size(); ++i) perm[static_cast<size_t>(axes[i])] = static_cast<int>(i);
    const memory::desc md = src.md.permute_axes(perm, /*allow_empty=*/true);
    if (md.get_ndims() == 0) return false;
    ValueState& v = values_[t_out];
    v.is_const = false;
    v.plain_md = kernel.output().view;
    const int out_pos = OutputPosition(t_out);
    if (out_pos >= 0) {
      const int user = run_arg_slot_[g_.inputs.size() + out_pos];
      AddReorder(false, {md, src.slot}, {v.plain_md, user},
                 g_.where(n) + ": output tensor " + std::to_string(t_out) + " " + DescribeDesc(md) + " -> plain");
      v.storage_md = v.plain_md;
      v.storage = v.plain = user;
      return true;
    }
    v.storage_md = md;
    v.storage = src.slot;
    v.plain = md == v.plain_md ? src.slot : -1;
    v.aliased = in.aliased = true;
    return true;
  }

  /*!
   * \brief Whether every value living in \p slot (a value and its relabels: reshapes, permutes)
   *        is read for the last time by node n at the latest, and none is a region output: then
   *        node n may overwrite the slot (a sum post-op accumulating into its residual).
   */
  bool SlotDiesAt(int slot, size_t n) const {
    for (const ValueState& v : values_) {
      if ((v.storage == slot || v.plain == slot) && (v.region_output || v.last_use > static_cast<int>(n))) {
        return false;
      }
    }
    return true;
  }

  // ---- concat without copies ----------------------------------------------------------------
  /*! \brief A layout whose slices along one axis are contiguous runs of bytes. */
  enum class SliceLayout { kPlain, kBlocked8, kBlocked16 };

  /*! \brief A concat input its producer may write straight into the concat's buffer. */
  struct SliceTarget {
    size_t concat;      // the concat node
    int64_t offset;     // where the input starts along the axis
  };
  /*! \brief The buffer of a concat some producer writes into (decided by the first such producer). */
  struct ConcatBuffer {
    memory::desc md;
    SliceLayout layout;
    int slot;
  };

  /*!
   * \brief The concats whose inputs may be written in place: every dim before the axis is 1 (so
   *        that in a plain or channel-blocked layout each input is one contiguous run of the
   *        output's bytes) and the output is no region output.  An input qualifies when it is
   *        the output of a node, read by nothing else, and no region output; whether its producer
   *        writes it in place is decided when the producer is planned (WriteIntoConcat).
   */
  void FindConcatSlices() {
    std::vector<int> reads(g_.tensors.size(), 0);
    for (const NodeInfo& node : g_.nodes) {
      for (int t : node.inputs) ++reads[t];
    }
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const NodeInfo& node = g_.nodes[n];
      if (node.op != "concat" || values_[node.output].region_output) continue;
      auto axis_attr = node.attrs.find("axis");
      if (axis_attr == node.attrs.end()) continue;
      const std::optional<int64_t> axis = axis_attr->second.as<int64_t>();
      const std::vector<int64_t>& out_shape = g_.tensors[node.output].shape;
      const int64_t rank = static_cast<int64_t>(out_shape.size());
      if (!axis || *axis < 0 || *axis >= rank || g_.tensors[node.output].dtype != DType::kFloat32) continue;
      bool leading_ones = true;
      for (int64_t d = 0; d < *axis; ++d) leading_ones = leading_ones && out_shape[d] == 1;
      if (!leading_ones) continue;
      int64_t offset = 0;
      for (int t : node.inputs) {
        const std::vector<int64_t>& shape = g_.tensors[t].shape;
        if (static_cast<int64_t>(shape.size()) != rank) break;  // the kernel rejects it
        if (g_.roles[t] == TensorRole::kNodeOutput && reads[t] == 1 && !values_[t].region_output) {
          slice_targets_[t] = {n, offset};
        }
        offset += shape[*axis];
      }
      concat_axis_[n] = *axis;
    }
  }

  /*! \brief The SliceLayout \p md is in (f32, dims as they are), if any. */
  static std::optional<SliceLayout> SliceLayoutOf(const memory::desc& md, int64_t axis) {
    if (md.get_data_type() != memory::data_type::f32 || md.get_format_kind() != memory::format_kind::blocked) {
      return std::nullopt;
    }
    if (md == PlainDesc(md.get_dims())) return SliceLayout::kPlain;
    if (axis != 1) return std::nullopt;  // channel blocks slice contiguously along the channels only
    const std::optional<memory::format_tag> tag = ChannelBlockedTag(md);
    if (!tag) return std::nullopt;
    return *tag == memory::format_tag::aBcd8b ? SliceLayout::kBlocked8 : SliceLayout::kBlocked16;
  }
  static memory::desc SliceLayoutDesc(const memory::dims& dims, SliceLayout layout) {
    switch (layout) {
      case SliceLayout::kBlocked8:
        return memory::desc(dims, memory::data_type::f32, memory::format_tag::aBcd8b);
      case SliceLayout::kBlocked16:
        return memory::desc(dims, memory::data_type::f32, memory::format_tag::aBcd16b);
      default:
        return PlainDesc(dims);
    }
  }

  /*!
   * \brief Node n's output is a concat input (FindConcatSlices) and the kernel writes it in a
   *        layout whose slice of the concat's buffer is a contiguous run: give the kernel that
   *        run (a slice buffer, PrivateBuffer::parent) as its output.  The first producer decides
   *        the concat's buffer layout (its own); later ones must write the same.  In a
   *        channel-blocked layout, the slice's offset and extent must be whole blocks.
   */
  bool WriteIntoConcat(size_t n, const OperandLayout& layout, MemRef* out) {
    const int t = g_.nodes[n].output;
    auto target = slice_targets_.find(t);
    if (target == slice_targets_.end()) return false;
    const size_t c = target->second.concat;
    const int64_t axis = concat_axis_.at(c);
    const std::optional<SliceLayout> kind = SliceLayoutOf(layout.want, axis);
    if (!kind) return false;
    const NodeInfo& concat = g_.nodes[c];
    const std::vector<int64_t>& out_shape = g_.tensors[concat.output].shape;
    const memory::dims out_dims(out_shape.begin(), out_shape.end());
    const int64_t block = *kind == SliceLayout::kBlocked8 ? 8 : *kind == SliceLayout::kBlocked16 ? 16 : 1;
    auto whole_blocks = [&](int64_t v) { return v % block == 0; };
    if (!whole_blocks(target->second.offset) || !whole_blocks(g_.tensors[t].shape[axis])) return false;
    auto found = concat_out_.find(c);
    if (found == concat_out_.end()) {
      // every input's run must be whole blocks too (the copied ones are written through
      // sub-memories), and the buffer must have no padding
      for (int in : concat.inputs) {
        if (!whole_blocks(g_.tensors[in].shape[axis])) return false;
      }
      const memory::desc md = SliceLayoutDesc(out_dims, *kind);
      if (md.get_size() != static_cast<size_t>(g_.tensors[concat.output].numel()) * sizeof(float)) return false;
      found = concat_out_.emplace(c, ConcatBuffer{md, *kind, OwnSlot(false, md, "")}).first;
    } else if (found->second.layout != *kind) {
      return false;
    }
    int64_t inner = 1;  // elements per unit of the axis (the leading dims are 1)
    for (size_t d = static_cast<size_t>(axis) + 1; d < out_shape.size(); ++d) inner *= out_shape[d];
    PrivateBuffer slice{layout.want.get_size(), false};
    slice.parent = plan_.slots[found->second.slot].index;
    slice.parent_offset = static_cast<size_t>(target->second.offset * inner) * sizeof(float);
    plan_.privates.push_back(slice);
    const int slot = NewSlot(SlotKind::kPrivate, plan_.privates.size() - 1);
    ValueState& v = values_[t];
    v.is_const = false;
    v.plain_md = layout.view;
    v.storage_md = layout.want;
    v.storage = slot;
    v.plain = layout.want == layout.view ? slot : -1;
    written_in_place_.insert(t);
    *out = {layout.want, slot};
    return true;
  }

  /*!
   * \brief A concat some of whose producers wrote in place (WriteIntoConcat): the inputs they
   *        did not write (read elsewhere too, region inputs, constants, another layout) are
   *        reordered into their sub-memory of the buffer; the rest costs nothing.
   */
  void PlanConcat(size_t n, const Kernel& kernel) {
    const NodeInfo& node = g_.nodes[n];
    const ConcatBuffer& buffer = concat_out_.at(n);
    const int64_t axis = concat_axis_.at(n);
    ValueState& v = values_[node.output];
    v.is_const = false;
    v.plain_md = kernel.output().view;
    v.storage_md = buffer.md;
    v.storage = buffer.slot;
    v.plain = buffer.md == v.plain_md ? buffer.slot : -1;
    std::string free_inputs, copied;
    int64_t offset = 0;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const int t = node.inputs[k];
      const std::vector<int64_t>& shape = g_.tensors[t].shape;
      const memory::dims dims(shape.begin(), shape.end());
      if (written_in_place_.count(t) != 0) {
        free_inputs += (free_inputs.empty() ? "" : ", ") + std::to_string(k);
      } else {
        memory::dims offsets(dims.size(), 0);
        offsets[axis] = offset;
        const MemRef dst{buffer.md.submemory_desc(dims, offsets), buffer.slot};
        const ValueState& in = values_[t];
        MemRef src;
        if (!in.is_const && in.storage_md.get_dims() == dims) {
          src = {in.storage_md, in.storage};  // straight from the producer's layout
        } else {
          const memory::desc plain = PlainDesc(dims);
          src = Resolve(t, {plain, plain}, n, /*init_consumer=*/false);
        }
        AddReorder(false, src, dst, g_.where(n) + ": input " + std::to_string(k) + " (tensor " + std::to_string(t) +
                                        ") copied into the output " + DescribeDesc(src.md) + " -> " +
                                        DescribeDesc(dst.md));
        copied += (copied.empty() ? "" : ", ") + std::to_string(k);
      }
      offset += shape[axis];
    }
    plan_.notes.push_back(g_.where(n) + ": output " + DescribeDesc(buffer.md) + "; inputs written in place by their producers: [" +
                          free_inputs + "]; copied: [" + copied + "]");
  }

  /*! \brief Plan one node: resolve its inputs, place its output, append its steps. */
  void PlanNode(size_t n, const Kernel& kernel, bool at_init) {
    const NodeInfo& node = g_.nodes[n];
    const int t_out = node.output;

    if (kernel.alias_input() >= 0) {
      const size_t k = static_cast<size_t>(kernel.alias_input());
      const int t_in = node.inputs[k];
      // A value stored bf16 (only where every reader rounds it: OutputOnlyFeedsBf16Convs) is
      // aliased as plain bf16 bytes, so the readers of the reshape still read it without a reorder.
      OperandLayout in_layout = kernel.inputs()[k];
      const bool bf16 = values_[t_in].storage_md.get_data_type() == memory::data_type::bf16 &&
                        in_layout.view.get_data_type() == memory::data_type::f32;
      if (bf16) in_layout.want = WithType(in_layout.view, memory::data_type::bf16);
      // Plain bytes of the input that outlive __init_ (never a constant's own data).
      const MemRef src = Resolve(t_in, in_layout, n, /*init_consumer=*/false);
      ValueState& v = values_[t_out];
      v.is_const = values_[t_in].is_const;
      v.plain_md = v.storage_md = kernel.output().view;
      if (bf16) v.storage_md = WithType(v.plain_md, memory::data_type::bf16);
      const int out_pos = OutputPosition(t_out);
      if (out_pos >= 0) {
        const int user = run_arg_slot_[g_.inputs.size() + out_pos];
        AddReorder(false, {v.storage_md, src.slot}, {kernel.output().view, user},
                   g_.where(n) + ": output tensor " + std::to_string(t_out) + " copied out");
        v.storage = v.plain = user;
        v.storage_md = v.plain_md;
      } else {
        v.storage = src.slot;
        v.plain = bf16 ? -1 : src.slot;
        v.aliased = values_[t_in].aliased = true;
        v.order = OrderOf(t_in);
      }
      return;
    }

    if (!kernel.relabel_axes().empty() && Relabel(n, kernel)) return;
    if (concat_out_.count(n) != 0) {
      PlanConcat(n, kernel);
      return;
    }

    std::vector<MemRef> ins(node.inputs.size());
    const int sum = kernel.sum_input();
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      if (static_cast<int>(k) == sum) continue;
      ins[k] = Resolve(node.inputs[k], kernel.inputs()[k], n, at_init);
    }
    int reuse = -1;
    int residual = -1;
    if (sum >= 0) {
      residual = node.inputs[sum];
      const ValueState& r = values_[residual];
      int reads = 0;
      for (int in : node.inputs) reads += in == residual;
      const memory::desc& want = kernel.output().want;
      // the same bytes: equal descriptors, or both row-major over the same number of elements (a
      // residual relabelled [N,H,W,C] read by a dense writing [N*H*W, C])
      const bool same_bytes = r.storage_md == want ||
                              (r.storage_md == PlainDesc(r.storage_md.get_dims()) && want == PlainDesc(want.get_dims()) &&
                               r.storage_md.get_size() == want.get_size());
      const bool dies = r.aliased ? SlotDiesAt(r.storage, n) : r.last_use == static_cast<int>(n);
      if (!at_init && !r.is_const && g_.roles[residual] == TensorRole::kNodeOutput && !r.region_output && dies &&
          reads == 1 && plan_.slots[r.storage].kind == SlotKind::kPrivate && same_bytes) {
        reuse = r.storage;  // the residual dies here: accumulate into its own buffer
      }
    }
    std::vector<Step> trailing;
    MemRef out;
    if (at_init || reuse >= 0 || !WriteIntoConcat(n, kernel.output(), &out)) {
      out = DefineOutput(n, kernel.output(), at_init, reuse, &trailing);
    }
    if (sum >= 0) {
      if (out.slot != reuse || reuse < 0) {
        const MemRef res = Resolve(residual, kernel.inputs()[sum], n, at_init);
        AddReorder(at_init, res, out,
                   g_.where(n) + ": residual tensor " + std::to_string(residual) + " copied into the output");
      }
      ins[sum] = out;
    }
    std::vector<MemRef> temps;
    for (size_t k = 0; k < kernel.temps().size(); ++k) {
      const memory::desc& md = kernel.temps()[k];
      temps.push_back({md, OwnSlot(at_init, md, g_.where(n) + " temp " + std::to_string(k))});
    }
    std::vector<Step> steps = kernel.Bind(ins, out, temps);
    // At init, the kernel's last step completes its output; earlier ones fill temps (always run).
    for (size_t i = 0; i < steps.size(); ++i) Add(at_init, std::move(steps[i]), i + 1 == steps.size() ? out.slot : -1);
    for (Step& s : trailing) Add(false, std::move(s), -1);
  }

  /*! \brief Steps -> planned steps: implementation names, layouts, scratchpad sizes. */
  void Compile(std::vector<Pending>* pending, std::vector<PlannedStep>* out, size_t* scratch) {
    for (Pending& p : *pending) {
      PlannedStep s;
      s.label = std::move(p.step.label);
      s.op = std::move(p.step.op);
      s.args = std::move(p.step.args);
      s.writes = p.writes;
      if (p.step.host) {
        s.host = std::move(p.step.host);
        s.impl = "host";
      } else {
        s.pd = std::move(p.step.pd);
        s.impl = s.pd.impl_info_str();
      }
      s.layouts = StepLayouts(s);
      if (!s.host) {
        const memory::desc sp = s.pd.scratchpad_desc();
        if (sp.get_size() > 0) {
          *scratch = std::max(*scratch, sp.get_size());
          s.args.emplace_back(DNNL_ARG_SCRATCHPAD, MemRef{sp, scratch_slot_});
        }
      }
      out->push_back(std::move(s));
    }
    pending->clear();
  }

  /*!
   * \brief Lay the private buffers out in one arena: buffers live from the first to the last
   *        run step that uses them; two whose lifetimes overlap never overlap in memory.
   *        Greedy, largest first, lowest offset that fits.
   */
  void PlaceIntermediates() {
    std::vector<PrivateBuffer>& bufs = plan_.privates;
    const size_t n = bufs.size();
    const int forever = static_cast<int>(plan_.run_steps.size());
    for (PrivateBuffer& b : bufs) b.first = forever + 1;
    for (size_t i = 0; i < plan_.run_steps.size(); ++i) {
      for (const auto& [arg, ref] : plan_.run_steps[i].args) {
        const Slot& slot = plan_.slots[ref.slot];
        if (slot.kind != SlotKind::kPrivate) continue;
        bufs[slot.index].first = std::min(bufs[slot.index].first, static_cast<int>(i));
        bufs[slot.index].last = std::max(bufs[slot.index].last, static_cast<int>(i));
      }
    }
    // a slice (a concat input written in place) keeps its parent alive while it is used
    for (PrivateBuffer& b : bufs) {
      if (b.parent < 0 || b.last < 0) continue;
      PrivateBuffer& parent = bufs[b.parent];
      parent.first = std::min(parent.first, b.first);
      parent.last = std::max(parent.last, b.last);
    }
    for (PrivateBuffer& b : bufs) {
      if (b.parent < 0 && (b.padded || b.last < 0)) {  // padded: alone for the whole run
        b.first = -1;
        b.last = forever;
      }
    }
    auto round_up = [](size_t b) { return (b + 63) / 64 * 64; };
    std::vector<size_t> order(n);
    for (size_t k = 0; k < n; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bufs[a].bytes > bufs[b].bytes; });
    std::vector<size_t> placed;
    for (size_t k : order) {
      if (bufs[k].parent >= 0) continue;  // placed with its parent, below
      const size_t size = round_up(bufs[k].bytes);
      // intervals [offset, offset + size) taken by buffers alive at the same time
      std::vector<std::pair<size_t, size_t>> taken;
      for (size_t j : placed) {
        if (bufs[j].first <= bufs[k].last && bufs[k].first <= bufs[j].last) {
          taken.emplace_back(bufs[j].offset, bufs[j].offset + round_up(bufs[j].bytes));
        }
      }
      std::sort(taken.begin(), taken.end());
      size_t offset = 0;
      for (const auto& [lo, hi] : taken) {
        if (offset + size <= lo) break;
        offset = std::max(offset, hi);
      }
      bufs[k].offset = offset;
      plan_.arena_bytes = std::max(plan_.arena_bytes, offset + size);
      placed.push_back(k);
    }
    for (PrivateBuffer& b : bufs) {
      if (b.parent >= 0) b.offset = bufs[b.parent].offset + b.parent_offset;
    }
  }

  struct Resolved {
    int tensor;
    memory::desc view, want;
    std::string transform;
    MemRef mem;
    bool init_only;
  };

  const RegionGraph& g_;
  const dnnl::engine& engine_;
  Plan& plan_;
  std::vector<int> run_arg_slot_, const_arg_slot_;
  int scratch_slot_ = -1;
  std::string node_where_;  // the node being planned
  std::vector<ValueState> values_;
  std::vector<Resolved> resolved_;
  std::vector<Pending> init_, run_;
  std::map<int, SliceTarget> slice_targets_;     // tensor -> the concat it may be written into
  std::map<size_t, int64_t> concat_axis_;        // concat node -> its axis (those considered)
  std::map<size_t, ConcatBuffer> concat_out_;    // concat node -> its buffer, once a producer wrote into it
  std::set<int> written_in_place_;               // tensors their producer wrote into a concat's buffer
};

}  // namespace

std::shared_ptr<const Plan> MakePlan(const RegionGraph& graph, const PlanRequest& request,
                                     const dnnl::engine& engine) {
  auto plan = std::make_shared<Plan>();
  plan->threads = request.threads;
  if (graph.symbolic()) {
    // A symbolic region is planned for one binding of its symbols: the graph with every dim
    // evaluated is an ordinary static graph, so the kernels check and build exactly as for a
    // static region of those shapes (their output-shape checks also catch a wrong expression).
    // Every problem with the shapes asked for is an InputError (the caller's input), whether the
    // binding finds it or an op of the bound graph rejects the shapes (a window larger than the
    // input): _C.plan_region and a region call raise the same class for the same shapes.
    if (request.input_shapes.size() !=
        graph.inputs.size() + (request.with_output_shapes ? graph.outputs.size() : 0)) {
      TVM_FFI_THROW(InputError) << graph.where() << ": the region has symbolic dims ("
                                << graph.tensors[graph.inputs.empty() ? 0 : graph.inputs[0]].Describe()
                                << ", ...); planning it needs the shapes of its " << graph.inputs.size()
                                << " inputs, got " << request.input_shapes.size();
    }
    const std::vector<int64_t> values = graph.BindSymbols(request.input_shapes);
    const RegionGraph bound = graph.Bound(values, request.max_bytes);
    std::shared_ptr<const Plan> made;
    try {
      PlanRequest declared;  // the bound graph's own shapes; named fields, not positions
      declared.threads = request.threads;
      declared.max_bytes = request.max_bytes;
      made = MakePlan(bound, declared, engine);
    } catch (const tvm::ffi::Error& e) {
      if (e.kind() != "ValueError") throw;
      TVM_FFI_THROW(InputError) << "at " << graph.DescribeBinding(values) << ": " << e.message();
    }
    auto result = std::make_shared<Plan>(std::move(*std::const_pointer_cast<Plan>(made)));
    result->symbol_values = values;
    return result;
  }
  for (int t : graph.inputs) plan->input_shapes.push_back(graph.tensors[t].shape);
  if (!request.input_shapes.empty() && request.input_shapes != plan->input_shapes) {
    std::string want, got;
    for (const auto& s : plan->input_shapes) want += (want.empty() ? "" : ", ") + ShapeToString(s);
    for (const auto& s : request.input_shapes) got += (got.empty() ? "" : ", ") + ShapeToString(s);
    TVM_FFI_THROW(InputError) << graph.where() << ": cannot plan input shapes (" << got
                              << "): the region declares static shapes (" << want << ")";
  }
  OmpThreadsScope omp(plan->threads);  // oneDNN sizes some primitives for the threads at creation
  Planner(graph, engine, plan.get()).Run();
  return plan;
}

}  // namespace byoc_hetero
