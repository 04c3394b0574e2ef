/*!
 * \file region_plan.cc
 * \brief Planner and executor of a region: layouts, buffers, reorders, primitives.
 *
 * Every tensor of the region gets a ValueState:
 *   storage     where the value lives during a run, in storage_md (the producer's layout,
 *               possibly blocked; plain for region inputs and constants);
 *   plain       a buffer holding the same value in plain row-major bytes (plain_md), when one
 *               exists: region inputs/outputs (the caller's buffers), constants, intermediates
 *               whose producer writes plain, or a plain copy made on demand.
 * A consumer asks for (view, want).  The planner hands it the storage directly when the layouts
 * agree, and otherwise inserts one reorder.  Reorders of constants go to the init program (run
 * once by __init_); all others go to the run program, in node order.
 */
#include "region_plan.h"

#include <tvm/ffi/error.h>

#include <atomic>
#include <mutex>
#include <sstream>
#include <utility>

#include "kernels/kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief Where a buffer's address comes from. */
struct Buffer {
  enum Kind { kRunArg, kConstArg, kOwned } kind = kOwned;
  int index = -1;       // kRunArg: position in Execute's buffers; kConstArg: constant position
  void* ptr = nullptr;  // kOwned
};

struct ValueState {
  bool defined = false;
  Buffer storage;
  memory::desc storage_md;
  memory::desc plain_md;
  bool has_plain = false;
  Buffer plain;
};

struct Exec {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  std::string label;
  std::string impl;
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

  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};

  std::vector<std::unique_ptr<Kernel>> kernels;
  std::vector<ValueState> values;
  std::vector<memory> owned;  // keeps module-owned buffers alive
  std::vector<std::pair<int, memory>> run_bindings;
  std::vector<std::pair<int, memory>> const_bindings;
  struct CacheEntry {
    int tensor;
    memory::desc view, want;
    memory mem;
  };
  std::vector<CacheEntry> resolved;
  std::vector<Step> init_steps, run_steps;

  std::vector<Exec> init_prog, run_prog;
  memory scratch;
  std::mutex mu;
  std::atomic<bool> ready{false};

  // ---- buffers -------------------------------------------------------------------------------
  memory Own(const memory::desc& md) {
    memory m(md, engine);
    owned.push_back(m);
    return m;
  }
  Buffer OwnBuffer(const memory::desc& md) { return Buffer{Buffer::kOwned, -1, Own(md).get_data_handle()}; }
  /*! \brief A memory object with descriptor md over the bytes of b. */
  memory Alias(const Buffer& b, const memory::desc& md) {
    if (b.kind == Buffer::kOwned) return memory(md, engine, b.ptr);
    memory m(md, engine, DNNL_MEMORY_NONE);
    (b.kind == Buffer::kRunArg ? run_bindings : const_bindings).emplace_back(b.index, m);
    return m;
  }

  Step MakeReorder(const memory& src, const memory& dst, const std::string& label) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    Step step;
    step.label = label;
    step.pd = GuardDnnl(label, "create a reorder", [&] {
      return dnnl::reorder::primitive_desc(engine, src.get_desc(), engine, dst.get_desc(), attr);
    });
    step.args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    return step;
  }
  void AddReorder(bool init, const memory& src, const memory& dst, const std::string& label) {
    (init ? init_steps : run_steps).push_back(MakeReorder(src, dst, label));
  }

  // ---- planning ------------------------------------------------------------------------------
  /*! \brief A memory with layout.want holding tensor t, for node `consumer`. */
  memory Resolve(const RegionGraph& g, int t, const OperandLayout& layout, size_t consumer) {
    for (const auto& e : resolved) {
      if (e.tensor == t && e.view == layout.view && e.want == layout.want) return e.mem;
    }
    ValueState& v = values[t];
    const std::string label = g.where(consumer) + ": reorder of tensor " + std::to_string(t) + " " +
                              DescribeDesc(layout.view) + " -> " + DescribeDesc(layout.want);
    if (layout.view.get_size() != v.plain_md.get_size()) {
      TVM_FFI_THROW(InternalError) << g.where(consumer) << ": kernel views tensor " << t << " as "
                                   << DescribeDesc(layout.view) << ", which does not cover its "
                                   << DescribeDesc(v.plain_md);
    }
    memory result;
    if (g.roles[t] == TensorRole::kConstant) {
      // Constant data is only reachable during __init_: always copy into an owned buffer.
      result = Own(layout.want);
      AddReorder(/*init=*/true, Alias(v.storage, layout.view), result, label);
    } else if (layout.view == v.plain_md && layout.want == v.storage_md) {
      result = Alias(v.storage, v.storage_md);  // zero-copy
    } else if (layout.view == v.plain_md && !v.has_plain) {
      result = Own(layout.want);  // blocked -> other blocked, same logical dims
      AddReorder(false, Alias(v.storage, v.storage_md), result, label);
    } else {
      if (!v.has_plain) {
        // The consumer reads the bytes differently (e.g. flattened): materialize plain bytes.
        v.plain = OwnBuffer(v.plain_md);
        v.has_plain = true;
        AddReorder(false, Alias(v.storage, v.storage_md), Alias(v.plain, v.plain_md),
                   g.where(consumer) + ": plain copy of tensor " + std::to_string(t));
      }
      memory src = Alias(v.plain, layout.view);
      if (layout.want == layout.view) {
        result = src;
      } else {
        result = Own(layout.want);
        AddReorder(false, src, result, label);
      }
    }
    resolved.push_back({t, layout.view, layout.want, result});
    return result;
  }

  /*! \brief Decide where node n's output lives; returns the memory the kernel writes. */
  memory DefineOutput(const RegionGraph& g, size_t n, const OperandLayout& layout,
                      std::vector<Step>* trailing) {
    const int t = g.nodes[n].output;
    ValueState& v = values[t];
    const memory::desc tensor_plain = PlainDesc(g.tensors[t].shape);
    if (layout.view.get_size() != tensor_plain.get_size()) {
      TVM_FFI_THROW(InternalError) << g.where(n) << ": kernel output view "
                                   << DescribeDesc(layout.view) << " does not cover tensor " << t;
    }
    v.defined = true;
    v.plain_md = layout.view;
    v.storage_md = layout.want;
    int out_pos = -1;
    for (size_t i = 0; i < g.outputs.size(); ++i) {
      if (g.outputs[i] == t) out_pos = static_cast<int>(i);
    }
    if (out_pos >= 0) {
      Buffer user{Buffer::kRunArg, static_cast<int>(num_inputs) + out_pos, nullptr};
      v.plain = user;
      v.has_plain = true;
      if (layout.want == layout.view) {
        v.storage = user;  // the kernel writes straight into the caller's buffer
      } else {
        v.storage = OwnBuffer(layout.want);
        trailing->push_back(MakeReorder(Alias(v.storage, layout.want), Alias(user, layout.view),
                                        g.where(n) + ": output tensor " + std::to_string(t) + " " +
                                            DescribeDesc(layout.want) + " -> plain"));
      }
    } else {
      v.storage = OwnBuffer(layout.want);
      if (layout.want == layout.view) {
        v.plain = v.storage;
        v.has_plain = true;
      }
    }
    return Alias(v.storage, layout.want);
  }

  void Build(const RegionGraph& g) {
    where = g.where();
    symbol = g.symbol;
    num_inputs = g.inputs.size();
    num_buffers = g.inputs.size() + g.outputs.size();
    num_constants = g.constants.size();
    values.resize(g.tensors.size());
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      ValueState& v = values[g.inputs[i]];
      v.defined = v.has_plain = true;
      v.plain_md = v.storage_md = PlainDesc(g.tensors[g.inputs[i]].shape);
      v.storage = v.plain = Buffer{Buffer::kRunArg, static_cast<int>(i), nullptr};
    }
    for (size_t i = 0; i < g.constants.size(); ++i) {
      ValueState& v = values[g.constants[i].tensor];
      v.defined = v.has_plain = true;
      v.plain_md = v.storage_md = PlainDesc(g.tensors[g.constants[i].tensor].shape);
      v.storage = v.plain = Buffer{Buffer::kConstArg, static_cast<int>(i), nullptr};
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
      KernelContext ctx{g, n, engine};
      std::unique_ptr<Kernel> kernel =
          GuardDnnl(g.where(n), "create the primitive", [&] { return builder(ctx); });
      if (kernel->inputs().size() != node.inputs.size()) {
        TVM_FFI_THROW(InternalError) << g.where(n) << ": kernel declared "
                                     << kernel->inputs().size() << " operands for "
                                     << node.inputs.size() << " inputs";
      }
      GuardDnnl(g.where(n), "set up buffers and reorders", [&] {
        std::vector<memory> ins;
        for (size_t k = 0; k < node.inputs.size(); ++k) {
          ins.push_back(Resolve(g, node.inputs[k], kernel->inputs()[k], n));
        }
        std::vector<Step> trailing;
        memory out = DefineOutput(g, n, kernel->output(), &trailing);
        for (Step& s : kernel->Bind(ins, out)) run_steps.push_back(std::move(s));
        for (Step& s : trailing) run_steps.push_back(std::move(s));
      });
      kernels.push_back(std::move(kernel));
    }
    GuardDnnl(where, "allocate the scratchpad or create a primitive", [&] { Finalize(); });
  }

  /*! \brief Size the shared scratchpad, create the primitives. */
  void Finalize() {
    size_t scratch_size = 0;
    for (auto* steps : {&init_steps, &run_steps}) {
      for (const Step& s : *steps) scratch_size = std::max(scratch_size, s.pd.scratchpad_desc().get_size());
    }
    if (scratch_size > 0) {
      scratch = Own(memory::desc({static_cast<memory::dim>(scratch_size)}, memory::data_type::u8,
                                 memory::format_tag::a));
    }
    auto compile = [&](std::vector<Step>& steps, std::vector<Exec>* prog) {
      for (Step& s : steps) {
        Exec e;
        e.label = s.label;
        e.impl = s.pd.impl_info_str();
        e.args = std::move(s.args);
        memory::desc sp = s.pd.scratchpad_desc();
        if (sp.get_size() > 0) e.args[DNNL_ARG_SCRATCHPAD] = memory(sp, engine, scratch.get_data_handle());
        e.prim = GuardDnnl(s.label, "create the primitive", [&] { return dnnl::primitive(s.pd.get()); });
        prog->push_back(std::move(e));
      }
      steps.clear();
    };
    compile(init_steps, &init_prog);
    compile(run_steps, &run_prog);
    resolved.clear();
    ready = num_constants == 0;
  }

  void RunProgram(std::vector<Exec>& prog) {
    for (Exec& e : prog) {
      GuardDnnl(e.label, "execute", [&] { e.prim.execute(stream, e.args); });
    }
    GuardDnnl(where, "wait for the stream", [&] { stream.wait(); });
  }
};

CompiledRegion::CompiledRegion(const RegionGraph& graph) : impl_(std::make_unique<Impl>()) {
  impl_->Build(graph);
}

CompiledRegion::~CompiledRegion() = default;

void CompiledRegion::LoadConstants(const std::vector<const void*>& data) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (data.size() != impl_->num_constants) {
    TVM_FFI_THROW(InternalError) << impl_->where << ": LoadConstants got " << data.size()
                                 << " buffers for " << impl_->num_constants << " constants";
  }
  impl_->ready = false;
  for (auto& [index, mem] : impl_->const_bindings) mem.set_data_handle(const_cast<void*>(data[index]));
  impl_->RunProgram(impl_->init_prog);
  for (auto& [index, mem] : impl_->const_bindings) mem.set_data_handle(DNNL_MEMORY_NONE);
  impl_->ready = true;
}

bool CompiledRegion::ready() const { return impl_->ready; }

void CompiledRegion::Execute(const std::vector<void*>& buffers) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->ready) {
    TVM_FFI_THROW(RuntimeError) << impl_->where << ": the region has " << impl_->num_constants
                                << " constants but __init_" << impl_->symbol
                                << " was never called (or failed); initialize the module with "
                                   "its constants before running it";
  }
  if (buffers.size() != impl_->num_buffers) {
    TVM_FFI_THROW(InternalError) << impl_->where << ": Execute got " << buffers.size()
                                 << " buffers, expected " << impl_->num_buffers;
  }
  for (auto& [index, mem] : impl_->run_bindings) mem.set_data_handle(buffers[index]);
  impl_->RunProgram(impl_->run_prog);
}

std::vector<std::string> CompiledRegion::Describe() const {
  std::vector<std::string> lines;
  auto describe = [&](const char* phase, const std::vector<Exec>& prog) {
    for (const Exec& e : prog) {
      std::ostringstream os;
      os << phase << " | " << e.label << " | " << e.impl;
      const std::pair<int, const char*> names[] = {{DNNL_ARG_SRC, "src"},
                                                   {DNNL_ARG_WEIGHTS, "wei"},
                                                   {DNNL_ARG_BIAS, "bia"},
                                                   {DNNL_ARG_DST, "dst"}};
      for (const auto& [arg, name] : names) {
        auto it = e.args.find(arg);
        if (it != e.args.end()) os << " " << name << "=" << DescribeDesc(it->second.get_desc());
      }
      lines.push_back(os.str());
    }
  };
  describe("init", impl_->init_prog);
  describe("run", impl_->run_prog);
  return lines;
}

}  // namespace byoc_hetero
