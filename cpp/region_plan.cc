/*!
 * \file region_plan.cc
 * \brief Planner and executor of a region: layouts, buffers, reorders, primitives, contexts.
 *
 * Buffers are named by slots:
 *   run arg    a caller's buffer (region input or output), bound on every call;
 *   const arg  a constant's data, reachable only during __init_;
 *   shared     module-wide, filled by the init program (reordered constants, folded values),
 *              read-only while running;
 *   private    one per execution context: intermediates of the run program.  Private buffers
 *              whose lifetimes (first to last step using them) do not overlap share memory: they
 *              are laid out in one arena per context (buffers with blocked-layout padding, which
 *              must stay zero, are never shared);
 *   scratch    one per execution context: oneDNN's scratchpad, shared by all steps.
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
#include "region_plan.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <utility>

#include "kernels/kernel.h"
#include "threading.h"

namespace byoc_hetero {

namespace {

enum class SlotKind { kRunArg, kConstArg, kShared, kPrivate, kScratch };

struct Slot {
  SlotKind kind;
  int index;     // run arg / const arg position, or buffer index within its kind
  size_t bytes;  // shared / private
};

/*! \brief 64-byte aligned, zero-filled bytes (zero padding of blocked layouts starts valid). */
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(size_t bytes, const std::string& what) {
    if (bytes == 0) return;
    const size_t rounded = (bytes + 63) / 64 * 64;
    ptr_.reset(std::aligned_alloc(64, rounded));
    if (!ptr_) {
      TVM_FFI_THROW(RuntimeError) << what << ": out of memory: cannot allocate " << bytes << " bytes";
    }
    std::memset(ptr_.get(), 0, rounded);
  }
  void* get() const { return ptr_.get(); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
};

struct ValueState {
  bool defined = false;
  bool is_const = false;       // known at __init_
  bool aliased = false;        // its storage slot is also another value's (reshape)
  bool region_output = false;
  int last_use = -1;           // last node reading it
  int storage = -1;
  memory::desc storage_md;
  memory::desc plain_md;
  int plain = -1;
};

struct Exec {
  dnnl::primitive prim;  // empty for host steps
  HostFn host;
  std::vector<std::pair<int, MemRef>> args;
  std::string label;
  std::string op;
  std::string impl;
};

struct ExecCounters {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> nanos{0};
};

/*! \brief Everything a running call writes. */
struct Context {
  dnnl::stream stream;
  AlignedBuffer arena;  // the private buffers, at private_offsets
  AlignedBuffer scratch;
  struct Bound {
    std::vector<memory> mems;
    std::vector<dnnl_exec_arg_t> cargs;
    std::vector<void*> ptrs;  // host steps
  };
  std::vector<Bound> execs;
  std::vector<std::pair<int, memory>> bindings;  // (run/const arg position, memory)
  int64_t bytes = 0;
};

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

/*! \brief Run f, turning a dnnl::error into a RuntimeError that says where and what. */
template <typename F>
auto GuardDnnl(const std::string& where, const char* action, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    TVM_FFI_THROW(RuntimeError) << where << ": oneDNN failed to " << action << ": " << e.what()
                                << " (" << DnnlStatusName(e.status) << ")";
    TVM_FFI_UNREACHABLE();
  }
}

}  // namespace

struct CompiledRegion::Impl {
  std::string where;
  std::string symbol;
  size_t num_inputs = 0;
  size_t num_buffers = 0;
  size_t num_constants = 0;
  int threads = 1;

  dnnl::engine engine{dnnl::engine::kind::cpu, 0};

  // ---- slots ---------------------------------------------------------------------------------
  std::vector<Slot> slots;
  std::vector<int> run_arg_slot, const_arg_slot;
  int scratch_slot = -1;
  std::vector<size_t> shared_sizes, private_sizes;
  std::vector<bool> private_padded;        // blocked layout with zero padding: not shared
  std::vector<size_t> private_offsets;     // offset of each private buffer in a context's arena
  size_t arena_bytes = 0;
  std::vector<std::string> shared_what;  // who asked for each shared buffer (messages)
  std::string planning_where;                          // the node being planned
  std::vector<AlignedBuffer> shared;

  // ---- planning state ------------------------------------------------------------------------
  std::vector<ValueState> values;
  struct CacheEntry {
    int tensor;
    memory::desc view, want;
    std::string transform;
    MemRef mem;
    bool init_only;
  };
  std::vector<CacheEntry> resolved;
  std::vector<Step> init_steps, run_steps;

  // ---- compiled programs and contexts --------------------------------------------------------
  std::vector<Exec> init_prog, run_prog;
  std::unique_ptr<ExecCounters[]> init_counters, run_counters;
  size_t init_scratch = 0, run_scratch = 0;
  std::unique_ptr<Context> init_ctx;
  std::mutex pool_mu;
  std::vector<std::unique_ptr<Context>> pool;
  std::atomic<int> contexts_created{0};
  int64_t context_bytes = 0;
  std::shared_mutex consts_mu;  // shared: running calls; exclusive: LoadConstants
  std::atomic<bool> ready{false};
  std::atomic<bool> profiling{false};

  // ---- slots ---------------------------------------------------------------------------------
  int NewArgSlot(SlotKind kind, int index) {
    slots.push_back({kind, index, 0});
    return static_cast<int>(slots.size()) - 1;
  }
  int NewSlot(SlotKind kind, size_t bytes) {
    int index = 0;
    if (kind == SlotKind::kShared) {
      index = static_cast<int>(shared_sizes.size());
      shared_sizes.push_back(bytes);
      shared_what.push_back(planning_where);
    } else if (kind == SlotKind::kPrivate) {
      index = static_cast<int>(private_sizes.size());
      private_sizes.push_back(bytes);
    }
    slots.push_back({kind, index, bytes});
    return static_cast<int>(slots.size()) - 1;
  }
  /*! \brief A slot for a value computed at init (shared) or per call (private). */
  int OwnSlot(bool at_init, const memory::desc& md) {
    const int slot = NewSlot(at_init ? SlotKind::kShared : SlotKind::kPrivate, md.get_size());
    if (!at_init) {
      size_t numel = 1;
      for (auto d : md.get_dims()) numel *= static_cast<size_t>(d);
      private_padded.push_back(md.get_size() != numel * sizeof(float));
    }
    return slot;
  }

  Step MakeReorder(const MemRef& src, const MemRef& dst, const std::string& label) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    Step step;
    step.label = label;
    step.pd = GuardDnnl(label, "create a reorder", [&] {
      return dnnl::reorder::primitive_desc(engine, src.md, engine, dst.md, attr);
    });
    step.args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    return step;
  }
  void AddReorder(bool init, const MemRef& src, const MemRef& dst, const std::string& label) {
    (init ? init_steps : run_steps).push_back(MakeReorder(src, dst, label));
  }

  // ---- planning ------------------------------------------------------------------------------
  /*!
   * \brief A memory with layout.want holding tensor t, for node `consumer`.
   * \param init_consumer The consumer runs in the init program: a constant's own data may be
   *        handed over without a copy.
   */
  MemRef Resolve(const RegionGraph& g, int t, const OperandLayout& layout, size_t consumer,
                 bool init_consumer) {
    for (const auto& e : resolved) {
      if (e.tensor == t && e.view == layout.view && e.want == layout.want &&
          e.transform == layout.transform_name && (!e.init_only || init_consumer)) {
        return e.mem;
      }
    }
    ValueState& v = values[t];
    if (layout.transform) {
      // Another tensor computed from the plain value (at __init_ when the value is known then).
      const bool at_init = v.is_const;
      const MemRef src = Resolve(g, t, {layout.view, layout.view}, consumer, /*init_consumer=*/at_init);
      const MemRef result{layout.want, OwnSlot(at_init, layout.want)};
      Step step;
      step.host = layout.transform;
      step.label = g.where(consumer) + ": " + layout.transform_name + " from tensor " + std::to_string(t);
      step.args = {{0, src}, {1, result}};
      (at_init ? init_steps : run_steps).push_back(std::move(step));
      resolved.push_back({t, layout.view, layout.want, layout.transform_name, result, false});
      return result;
    }
    const std::string label = g.where(consumer) + ": reorder of tensor " + std::to_string(t) + " " +
                              DescribeDesc(layout.view) + " -> " + DescribeDesc(layout.want);
    if (layout.view.get_size() != v.plain_md.get_size()) {
      TVM_FFI_THROW(InternalError) << g.where(consumer) << ": kernel views tensor " << t << " as "
                                   << DescribeDesc(layout.view) << ", which does not cover its "
                                   << DescribeDesc(v.plain_md);
    }
    const bool at_init = v.is_const;
    MemRef result;
    bool init_only = false;
    if (g.roles[t] == TensorRole::kConstant) {
      const MemRef src{layout.view, v.storage};
      if (init_consumer && layout.want == layout.view) {
        result = src;  // read in place during __init_
        init_only = true;
      } else {
        result = {layout.want, OwnSlot(true, layout.want)};
        AddReorder(true, src, result, label);
      }
    } else if (layout.view == v.plain_md && layout.want == v.storage_md) {
      result = {v.storage_md, v.storage};  // zero-copy
    } else if (layout.view == v.plain_md && v.plain < 0) {
      result = {layout.want, OwnSlot(at_init, layout.want)};  // blocked -> other layout
      AddReorder(at_init, {v.storage_md, v.storage}, result, label);
    } else {
      if (v.plain < 0) {
        // The consumer reads the bytes differently (e.g. flattened): materialize plain bytes.
        v.plain = OwnSlot(at_init, v.plain_md);
        AddReorder(at_init, {v.storage_md, v.storage}, {v.plain_md, v.plain},
                   g.where(consumer) + ": plain copy of tensor " + std::to_string(t));
      }
      const MemRef src{layout.view, v.plain};
      if (layout.want == layout.view) {
        result = src;
      } else {
        result = {layout.want, OwnSlot(at_init, layout.want)};
        AddReorder(at_init, src, result, label);
      }
    }
    resolved.push_back({t, layout.view, layout.want, "", result, init_only});
    return result;
  }

  int OutputPosition(const RegionGraph& g, int t) const {
    for (size_t i = 0; i < g.outputs.size(); ++i) {
      if (g.outputs[i] == t) return static_cast<int>(i);
    }
    return -1;
  }

  /*!
   * \brief Decide where node n's output lives; returns the memory the kernel writes.
   * \param reuse A private slot the output may take over (a dying residual), or -1.
   */
  MemRef DefineOutput(const RegionGraph& g, size_t n, const OperandLayout& layout, bool at_init,
                      int reuse, std::vector<Step>* trailing) {
    const int t = g.nodes[n].output;
    ValueState& v = values[t];
    const memory::desc tensor_plain = PlainDesc(g.tensors[t].shape);
    if (layout.view.get_size() != tensor_plain.get_size()) {
      TVM_FFI_THROW(InternalError) << g.where(n) << ": kernel output view "
                                   << DescribeDesc(layout.view) << " does not cover tensor " << t;
    }
    v.defined = true;
    v.is_const = at_init;
    v.plain_md = layout.view;
    v.storage_md = layout.want;
    const int out_pos = OutputPosition(g, t);
    if (out_pos >= 0) {
      const int user = run_arg_slot[num_inputs + out_pos];
      v.plain = user;
      if (layout.want == layout.view) {
        v.storage = user;  // the kernel writes straight into the caller's buffer
      } else {
        v.storage = reuse >= 0 ? reuse : OwnSlot(false, layout.want);
        trailing->push_back(MakeReorder({layout.want, v.storage}, {layout.view, user},
                                        g.where(n) + ": output tensor " + std::to_string(t) + " " +
                                            DescribeDesc(layout.want) + " -> plain"));
      }
    } else {
      v.storage = reuse >= 0 ? reuse : OwnSlot(at_init, layout.want);
      if (layout.want == layout.view) v.plain = v.storage;
    }
    return {layout.want, v.storage};
  }

  /*! \brief Plan one node: resolve its inputs, place its output, append its steps. */
  void PlanNode(const RegionGraph& g, size_t n, const Kernel& kernel, bool at_init) {
    const NodeInfo& node = g.nodes[n];
    const int t_out = node.output;

    if (kernel.alias_input() >= 0) {
      const size_t k = static_cast<size_t>(kernel.alias_input());
      const int t_in = node.inputs[k];
      // Plain bytes of the input that outlive __init_ (never a constant's own data).
      const MemRef src = Resolve(g, t_in, kernel.inputs()[k], n, /*init_consumer=*/false);
      ValueState& v = values[t_out];
      v.defined = true;
      v.is_const = values[t_in].is_const;
      v.plain_md = v.storage_md = kernel.output().view;
      const int out_pos = OutputPosition(g, t_out);
      if (out_pos >= 0) {
        const int user = run_arg_slot[num_inputs + out_pos];
        run_steps.push_back(MakeReorder({kernel.output().view, src.slot}, {kernel.output().view, user},
                                        g.where(n) + ": output tensor " + std::to_string(t_out) +
                                            " copied out"));
        v.storage = v.plain = user;
      } else {
        v.storage = v.plain = src.slot;
        v.aliased = values[t_in].aliased = true;
      }
      return;
    }

    std::vector<MemRef> ins(node.inputs.size());
    const int sum = kernel.sum_input();
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      if (static_cast<int>(k) == sum) continue;
      ins[k] = Resolve(g, node.inputs[k], kernel.inputs()[k], n, at_init);
    }
    int reuse = -1;
    int residual = -1;
    if (sum >= 0) {
      residual = node.inputs[sum];
      const ValueState& r = values[residual];
      int reads = 0;
      for (int in : node.inputs) reads += in == residual;
      if (!at_init && !r.is_const && g.roles[residual] == TensorRole::kNodeOutput &&
          !r.region_output && !r.aliased && r.last_use == static_cast<int>(n) && reads == 1 &&
          slots[r.storage].kind == SlotKind::kPrivate && r.storage_md == kernel.output().want) {
        reuse = r.storage;  // the residual dies here: accumulate into its own buffer
      }
    }
    std::vector<Step> trailing;
    const MemRef out = DefineOutput(g, n, kernel.output(), at_init, reuse, &trailing);
    std::vector<Step>& steps = at_init ? init_steps : run_steps;
    if (sum >= 0) {
      if (out.slot != reuse || reuse < 0) {
        const MemRef res = Resolve(g, residual, kernel.inputs()[sum], n, at_init);
        steps.push_back(MakeReorder(res, out, g.where(n) + ": residual tensor " +
                                                  std::to_string(residual) + " copied into the output"));
      }
      ins[sum] = out;
    }
    std::vector<MemRef> temps;
    for (const memory::desc& md : kernel.temps()) temps.push_back({md, OwnSlot(at_init, md)});
    for (Step& s : kernel.Bind(ins, out, temps)) steps.push_back(std::move(s));
    for (Step& s : trailing) steps.push_back(std::move(s));
  }

  void Build(const RegionGraph& g) {
    where = g.where();
    symbol = g.symbol;
    num_inputs = g.inputs.size();
    num_buffers = g.inputs.size() + g.outputs.size();
    num_constants = g.constants.size();
    OmpThreadsScope omp(threads);  // oneDNN sizes some primitives for the threads at creation

    for (size_t i = 0; i < num_buffers; ++i) {
      run_arg_slot.push_back(NewArgSlot(SlotKind::kRunArg, static_cast<int>(i)));
    }
    for (size_t i = 0; i < num_constants; ++i) {
      const_arg_slot.push_back(NewArgSlot(SlotKind::kConstArg, static_cast<int>(i)));
    }
    scratch_slot = NewArgSlot(SlotKind::kScratch, 0);

    values.resize(g.tensors.size());
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      for (int t : g.nodes[n].inputs) values[t].last_use = static_cast<int>(n);
    }
    for (int t : g.outputs) values[t].region_output = true;
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      ValueState& v = values[g.inputs[i]];
      v.defined = true;
      v.plain_md = v.storage_md = PlainDesc(g.tensors[g.inputs[i]].shape);
      v.storage = v.plain = run_arg_slot[i];
    }
    for (size_t i = 0; i < g.constants.size(); ++i) {
      ValueState& v = values[g.constants[i].tensor];
      v.defined = v.is_const = true;
      v.plain_md = v.storage_md = PlainDesc(g.tensors[g.constants[i].tensor].shape);
      v.storage = v.plain = const_arg_slot[i];
    }

    for (size_t n = 0; n < g.nodes.size(); ++n) {
      const NodeInfo& node = g.nodes[n];
      KernelBuilder builder = FindKernelBuilder(node.op);
      if (builder == nullptr) {
        std::string ops;
        for (const auto& op : SupportedOps()) ops += (ops.empty() ? "" : ", ") + op;
        TVM_FFI_THROW(ValueError) << g.where() << ": field 'nodes[" << n << "].op': unknown op '"
                                  << node.op << "' (supported: " << ops << ")";
      }
      KernelContext ctx{g, n, engine, {}, {}};
      bool all_const = !node.inputs.empty();
      for (int t : node.inputs) {
        ctx.input_storage.push_back(values[t].storage_md);
        ctx.input_constant.push_back(values[t].is_const);
        all_const = all_const && values[t].is_const;
      }
      std::unique_ptr<Kernel> kernel =
          GuardDnnl(g.where(n), "create the primitive", [&] { return builder(ctx); });
      if (kernel->inputs().size() != node.inputs.size()) {
        TVM_FFI_THROW(InternalError) << g.where(n) << ": kernel declared "
                                     << kernel->inputs().size() << " operands for "
                                     << node.inputs.size() << " inputs";
      }
      const bool at_init = all_const && !values[node.output].region_output;
      planning_where = g.where(n);
      GuardDnnl(g.where(n), "set up buffers and reorders", [&] { PlanNode(g, n, *kernel, at_init); });
    }
    GuardDnnl(where, "allocate buffers or create a primitive", [&] { Finalize(); });
  }

  /*! \brief Create the primitives, size the scratchpads, allocate shared buffers, first context. */
  void Finalize() {
    auto compile = [&](std::vector<Step>& steps, std::vector<Exec>* prog, size_t* scratch) {
      for (Step& s : steps) {
        Exec e;
        e.label = s.label;
        e.op = s.op;
        e.args = std::move(s.args);
        if (s.host) {
          e.host = std::move(s.host);
          e.impl = "host";
        } else {
          e.impl = s.pd.impl_info_str();
          const memory::desc sp = s.pd.scratchpad_desc();
          if (sp.get_size() > 0) {
            *scratch = std::max(*scratch, sp.get_size());
            e.args.emplace_back(DNNL_ARG_SCRATCHPAD, MemRef{sp, scratch_slot});
          }
          e.prim = GuardDnnl(s.label, "create the primitive", [&] { return dnnl::primitive(s.pd.get()); });
        }
        prog->push_back(std::move(e));
      }
      steps.clear();
    };
    compile(init_steps, &init_prog, &init_scratch);
    compile(run_steps, &run_prog, &run_scratch);
    PlaceIntermediates();
    init_counters = std::make_unique<ExecCounters[]>(init_prog.size());
    run_counters = std::make_unique<ExecCounters[]>(run_prog.size());
    resolved.clear();
    for (size_t i = 0; i < shared_sizes.size(); ++i) shared.emplace_back(shared_sizes[i], shared_what[i]);
    init_ctx = MakeContext(init_prog, init_scratch, /*with_private=*/false);
    std::unique_ptr<Context> first = MakeContext(run_prog, run_scratch, /*with_private=*/true);
    context_bytes = first->bytes;
    pool.push_back(std::move(first));
    ready = num_constants == 0;
  }

  /*!
   * \brief Lay the private buffers out in one arena: buffers live from the first to the last
   *        run step that uses them; two whose lifetimes overlap never overlap in memory.
   *        Greedy, largest first, lowest offset that fits.
   */
  void PlaceIntermediates() {
    const size_t n = private_sizes.size();
    const int forever = static_cast<int>(run_prog.size());
    std::vector<int> first(n, forever + 1), last(n, -1);
    for (size_t i = 0; i < run_prog.size(); ++i) {
      for (const auto& [arg, ref] : run_prog[i].args) {
        const Slot& slot = slots[ref.slot];
        if (slot.kind != SlotKind::kPrivate) continue;
        first[slot.index] = std::min(first[slot.index], static_cast<int>(i));
        last[slot.index] = std::max(last[slot.index], static_cast<int>(i));
      }
    }
    for (size_t k = 0; k < n; ++k) {
      if (private_padded[k] || last[k] < 0) {  // padded: alone for the whole run
        first[k] = -1;
        last[k] = forever;
      }
    }
    auto round_up = [](size_t b) { return (b + 63) / 64 * 64; };
    std::vector<size_t> order(n);
    for (size_t k = 0; k < n; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return private_sizes[a] > private_sizes[b]; });
    private_offsets.assign(n, 0);
    std::vector<size_t> placed;
    arena_bytes = 0;
    for (size_t k : order) {
      const size_t size = round_up(private_sizes[k]);
      // intervals [offset, offset + size) taken by buffers alive at the same time
      std::vector<std::pair<size_t, size_t>> taken;
      for (size_t j : placed) {
        if (first[j] <= last[k] && first[k] <= last[j]) {
          taken.emplace_back(private_offsets[j], private_offsets[j] + round_up(private_sizes[j]));
        }
      }
      std::sort(taken.begin(), taken.end());
      size_t offset = 0;
      for (const auto& [lo, hi] : taken) {
        if (offset + size <= lo) break;
        offset = std::max(offset, hi);
      }
      private_offsets[k] = offset;
      arena_bytes = std::max(arena_bytes, offset + size);
      placed.push_back(k);
    }
  }

  std::unique_ptr<Context> MakeContext(const std::vector<Exec>& prog, size_t scratch_bytes,
                                       bool with_private) {
    auto ctx = std::make_unique<Context>();
    ctx->stream = dnnl::stream(engine);
    if (with_private) {
      ctx->arena = AlignedBuffer(arena_bytes, where + " (intermediates)");
      ctx->bytes += static_cast<int64_t>(arena_bytes);
    }
    ctx->scratch = AlignedBuffer(scratch_bytes, where + " (scratchpad)");
    ctx->bytes += static_cast<int64_t>(scratch_bytes);
    for (const Exec& e : prog) {
      Context::Bound b;
      for (const auto& [arg, ref] : e.args) {
        const Slot& slot = slots[ref.slot];
        void* ptr = nullptr;
        switch (slot.kind) {
          case SlotKind::kShared:
            ptr = shared[slot.index].get();
            break;
          case SlotKind::kPrivate:
            if (!with_private) {
              TVM_FFI_THROW(InternalError) << where << ": step '" << e.label
                                           << "' of the init program uses a per-call buffer";
            }
            ptr = static_cast<char*>(ctx->arena.get()) + private_offsets[slot.index];
            break;
          case SlotKind::kScratch:
            ptr = ctx->scratch.get();
            break;
          default:
            break;  // bound per call
        }
        memory mem(ref.md, engine, ptr);
        if (slot.kind == SlotKind::kRunArg || slot.kind == SlotKind::kConstArg) {
          ctx->bindings.emplace_back(slot.index, mem);
        }
        b.mems.push_back(mem);
        b.cargs.push_back({arg, mem.get()});
      }
      b.ptrs.resize(b.mems.size());
      ctx->execs.push_back(std::move(b));
    }
    return ctx;
  }

  void RunProgram(const std::vector<Exec>& prog, ExecCounters* counters, Context& ctx) {
    const bool timed = profiling.load(std::memory_order_relaxed);
    for (size_t i = 0; i < prog.size(); ++i) {
      const Exec& e = prog[i];
      Context::Bound& b = ctx.execs[i];
      std::chrono::steady_clock::time_point start;
      if (timed) start = std::chrono::steady_clock::now();
      if (e.host) {
        for (size_t k = 0; k < b.mems.size(); ++k) b.ptrs[k] = b.mems[k].get_data_handle();
        e.host(b.ptrs);
      } else {
        dnnl_status_t status = dnnl_primitive_execute(e.prim.get(), ctx.stream.get(),
                                                      static_cast<int>(b.cargs.size()), b.cargs.data());
        if (status != dnnl_success) {
          TVM_FFI_THROW(RuntimeError) << e.label << ": oneDNN failed to execute ("
                                      << DnnlStatusName(status) << ")";
        }
      }
      if (timed) {
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
        counters[i].calls.fetch_add(1, std::memory_order_relaxed);
        counters[i].nanos.fetch_add(ns, std::memory_order_relaxed);
      }
    }
    dnnl_status_t status = dnnl_stream_wait(ctx.stream.get());
    if (status != dnnl_success) {
      TVM_FFI_THROW(RuntimeError) << where << ": oneDNN failed to wait for the stream ("
                                  << DnnlStatusName(status) << ")";
    }
  }

  std::unique_ptr<Context> Acquire() {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (!pool.empty()) {
        std::unique_ptr<Context> ctx = std::move(pool.back());
        pool.pop_back();
        return ctx;
      }
    }
    contexts_created.fetch_add(1);
    return MakeContext(run_prog, run_scratch, /*with_private=*/true);
  }

  void Release(std::unique_ptr<Context> ctx) {
    std::lock_guard<std::mutex> lock(pool_mu);
    pool.push_back(std::move(ctx));
  }
};

CompiledRegion::CompiledRegion(const RegionGraph& graph, int threads) : impl_(std::make_unique<Impl>()) {
  impl_->contexts_created = 1;
  impl_->threads = std::max(1, threads);
  impl_->Build(graph);
}

CompiledRegion::~CompiledRegion() = default;

void CompiledRegion::LoadConstants(const std::vector<const void*>& data) {
  Impl& s = *impl_;
  std::unique_lock<std::shared_mutex> lock(s.consts_mu);
  if (data.size() != s.num_constants) {
    TVM_FFI_THROW(InternalError) << s.where << ": LoadConstants got " << data.size()
                                 << " buffers for " << s.num_constants << " constants";
  }
  s.ready = false;
  OmpThreadsScope omp(s.threads);
  for (auto& [index, mem] : s.init_ctx->bindings) mem.set_data_handle(const_cast<void*>(data[index]));
  try {
    s.RunProgram(s.init_prog, s.init_counters.get(), *s.init_ctx);
  } catch (...) {
    for (auto& [index, mem] : s.init_ctx->bindings) mem.set_data_handle(nullptr);
    throw;
  }
  for (auto& [index, mem] : s.init_ctx->bindings) mem.set_data_handle(nullptr);
  s.ready = true;
}

bool CompiledRegion::ready() const { return impl_->ready; }

void CompiledRegion::Execute(const std::vector<void*>& buffers) {
  Impl& s = *impl_;
  std::shared_lock<std::shared_mutex> lock(s.consts_mu);
  if (!s.ready) {
    TVM_FFI_THROW(RuntimeError) << s.where << ": the region has " << s.num_constants
                                << " constants but __init_" << s.symbol
                                << " was never called (or failed); initialize the module with "
                                   "its constants before running it";
  }
  if (buffers.size() != s.num_buffers) {
    TVM_FFI_THROW(InternalError) << s.where << ": Execute got " << buffers.size()
                                 << " buffers, expected " << s.num_buffers;
  }
  std::unique_ptr<Context> ctx = s.Acquire();
  struct GiveBack {
    Impl& s;
    std::unique_ptr<Context>& ctx;
    ~GiveBack() { s.Release(std::move(ctx)); }
  } give_back{s, ctx};
  for (auto& [index, mem] : ctx->bindings) mem.set_data_handle(buffers[index]);
  OmpThreadsScope omp(s.threads);
  ExecutionSlot slot(s.threads);
  s.RunProgram(s.run_prog, s.run_counters.get(), *ctx);
}

std::vector<std::string> CompiledRegion::Describe() const {
  std::vector<std::string> lines;
  for (const StepProfile& p : Profile()) {
    lines.push_back(p.phase + " | " + p.label + " | " + p.impl + p.layouts);
  }
  return lines;
}

std::vector<StepProfile> CompiledRegion::Profile() const {
  std::vector<StepProfile> out;
  auto add = [&](const char* phase, const std::vector<Exec>& prog, const ExecCounters* counters) {
    for (size_t i = 0; i < prog.size(); ++i) {
      const Exec& e = prog[i];
      StepProfile p;
      p.phase = phase;
      p.label = e.label;
      p.op = e.op;
      p.impl = e.impl;
      std::ostringstream os;
      if (e.host) {
        for (size_t k = 0; k < e.args.size(); ++k) {
          os << (k + 1 == e.args.size() ? " out=" : " in=") << DescribeDesc(e.args[k].second.md);
        }
      } else {
        const std::pair<int, const char*> names[] = {{DNNL_ARG_SRC, "src"},     {DNNL_ARG_SRC_1, "src1"},
                                                     {DNNL_ARG_WEIGHTS, "wei"}, {DNNL_ARG_BIAS, "bia"},
                                                     {DNNL_ARG_DST, "dst"}};
        for (const auto& [arg, name] : names) {
          for (const auto& [a, ref] : e.args) {
            if (a == arg) os << " " << name << "=" << DescribeDesc(ref.md);
          }
        }
      }
      p.layouts = os.str();
      p.calls = counters[i].calls.load();
      p.seconds = static_cast<double>(counters[i].nanos.load()) * 1e-9;
      out.push_back(std::move(p));
    }
  };
  add("init", impl_->init_prog, impl_->init_counters.get());
  add("run", impl_->run_prog, impl_->run_counters.get());
  return out;
}

int CompiledRegion::threads() const { return impl_->threads; }
int CompiledRegion::contexts() const { return impl_->contexts_created.load(); }
int64_t CompiledRegion::context_bytes() const { return impl_->context_bytes; }
int64_t CompiledRegion::shared_bytes() const {
  int64_t total = 0;
  for (size_t b : impl_->shared_sizes) total += static_cast<int64_t>(b);
  return total;
}

void CompiledRegion::SetProfiling(bool on) { impl_->profiling = on; }

void CompiledRegion::ResetProfile() {
  for (size_t i = 0; i < impl_->init_prog.size(); ++i) {
    impl_->init_counters[i].calls = 0;
    impl_->init_counters[i].nanos = 0;
  }
  for (size_t i = 0; i < impl_->run_prog.size(); ++i) {
    impl_->run_counters[i].calls = 0;
    impl_->run_counters[i].nanos = 0;
  }
}

}  // namespace byoc_hetero
