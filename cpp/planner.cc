/*!
 * \file planner.cc
 * \brief The planner (see planner.h): builds each node's kernel and plans it.
 *
 * The Planner is the per-node driver; it owns the parts that do each job, each holding a
 * reference to the parts it needs (none shares another's state):
 *   ValueTable      plan/values.h           where each tensor's value lives (ValueStates);
 *   Buffers         plan/buffers.h          the slots and the buffers behind them (buffer assignment);
 *   Programs        plan/programs.h         the init and run step programs, reorders, host byte copies;
 *   LayoutResolver  plan/layouts.h          which layout each value lives in, and the reorders (or
 *                                           zero-copy views: reshapes, permutes) a consumer needs;
 *   ConcatInPlace   plan/concat_in_place.h  producers writing into a concat's buffer, and the notes;
 *   PlaceIntermediates  plan/arena.h        the arena offsets of the private buffers, at the end.
 * The Planner builds each node's kernel (checking its operands) and plans the node with them.
 *
 * A sum post-op (residual add) accumulates into the destination: the planner reuses the
 * residual's own buffer as the destination when the residual is an intermediate in the same
 * layout that no later node reads, and otherwise copies the residual into the destination first.
 */
#include "planner.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <utility>

#include "plan/arena.h"
#include "plan/buffers.h"
#include "plan/concat_in_place.h"
#include "plan/layouts.h"
#include "plan/programs.h"
#include "plan/values.h"
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
  for (const SharedBuffer& b : shared) total += b.constant < 0 ? static_cast<int64_t>(b.bytes) : 0;
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

using planning::ValueState;

class Planner {
 public:
  Planner(const RegionGraph& g, const dnnl::engine& engine, Plan* plan)
      : g_(g),
        engine_(engine),
        plan_(*plan),
        values_(g),
        buffers_(g, plan),
        programs_(engine, buffers_),
        layouts_(g, &values_, &buffers_, &programs_),
        concats_(g, &values_, &buffers_, &programs_, &layouts_) {}

  void Run() {
    SetUpValues();
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      const NodeInfo& node = g_.nodes[n];
      CheckQuantizedOperands(n);
      CheckWrittenInputs(n);
      bool all_const = !node.inputs.empty();
      for (int t : node.inputs) all_const = all_const && values_[t].is_const;
      const std::unique_ptr<Kernel> kernel = MakeKernel(n);
      const bool at_init = all_const && !values_[node.output].region_output;
      if (!at_init && kernel->alias_input() < 0) concats_.ClaimChannelsLast(n, kernel->output());
      buffers_.SetNode(g_.where(n));
      GuardDnnl(g_.where(n), "set up buffers and reorders", [&] { PlanNode(n, *kernel, at_init); });
    }
    programs_.Compile(&plan_);
    buffers_.MarkReadByRun(plan_.run_steps);
    planning::PlaceIntermediates(plan_);
  }

 private:
  /*! \brief The plan's header, the concats written in place, and the state of each region input and constant. */
  void SetUpValues() {
    plan_.where = g_.where();
    plan_.symbol = g_.symbol;
    plan_.num_constants = g_.constants.size();
    plan_.precision = EffectivePrecision(g_.precision, &plan_.precision_note);
    for (int t : g_.outputs) plan_.output_shapes.push_back(g_.tensors[t].shape);
    // the argument slots (Buffers) and every value's last reader (ValueTable) exist already
    concats_.FindConcatSlices();
    for (size_t i = 0; i < g_.inputs.size(); ++i) {
      ValueState& v = values_[g_.inputs[i]];
      v.plain_md = v.storage_md = PlainDescOf(g_.tensors[g_.inputs[i]]);
      v.storage = v.plain = buffers_.RunArg(i);
    }
    for (size_t i = 0; i < g_.constants.size(); ++i) {
      ValueState& v = values_[g_.constants[i].tensor];
      v.is_const = true;
      v.plain_md = v.storage_md = PlainDescOf(g_.tensors[g_.constants[i].tensor]);
      v.storage = v.plain = buffers_.ConstArg(i);
    }
  }

  /*! \brief Node \p n's kernel, built from its context; the operands it declares checked against the
   *         node's inputs and their dtypes. */
  std::unique_ptr<Kernel> MakeKernel(size_t n) {
    const NodeInfo& node = g_.nodes[n];
    KernelBuilder builder = FindKernelBuilder(node.op);
    if (builder == nullptr) {
      std::string ops;
      for (const auto& op : SupportedOps()) ops += (ops.empty() ? "" : ", ") + op;
      TVM_FFI_THROW(ValueError) << g_.where() << ": field 'nodes[" << n << "].op': unknown op '"
                                << node.op << "' (supported: " << ops << ")";
    }
    KernelContext ctx{g_, n, engine_, {}, {}, NodeComputesBf16(g_, n)};
    ctx.output_hint = concats_.ConcatSliceLayout(n);
    if (ctx.output_hint.is_zero()) ctx.output_hint = layouts_.PermutedOutputLayout(n);
    ctx.threads = plan_.threads;
    for (int t : node.inputs) {
      ctx.input_storage.push_back(values_[t].storage_md);
      ctx.input_constant.push_back(values_[t].is_const);
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
    return kernel;
  }

  /*! \brief An input the kernel writes in place (KernelTraits::writes_inputs) is the caller's own buffer:
   *         a float32 region input, read by no other node, no region output. */
  void CheckWrittenInputs(size_t n) const {
    const NodeInfo& node = g_.nodes[n];
    for (size_t k : FindKernelTraits(node.op).writes_inputs) {
      if (k >= node.inputs.size()) continue;  // the kernel reports the input count
      const int t = node.inputs[k];
      size_t readers = 0;
      for (const NodeInfo& other : g_.nodes) readers += std::count(other.inputs.begin(), other.inputs.end(), t);
      std::string why;  // the first reason that applies
      if (g_.roles[t] != TensorRole::kInput) {
        why = "is no region input";
      } else if (g_.tensors[t].dtype != DType::kFloat32) {
        why = "is not float32";
      } else if (std::count(g_.outputs.begin(), g_.outputs.end(), t) > 0) {
        why = "is also a region output";
      } else if (readers != 1) {
        why = "is read by " + std::to_string(readers) + " node inputs";
      }
      if (!why.empty()) {
        TVM_FFI_THROW(ValueError) << g_.where(n) << ": input " << k << " (tensor " << t << ") is written in place by '"
                                  << node.op << "' and so must be a float32 region input read by this node only; it "
                                  << why;
      }
    }
  }

  /*! \brief An 8-bit (u8/s8) operand reaches only a kernel that declares it reads them. */
  void CheckQuantizedOperands(size_t n) const {
    const NodeInfo& node = g_.nodes[n];
    for (size_t k = 0; k <= node.inputs.size() && !FindKernelTraits(node.op).accepts_float16; ++k) {
      const int t = k < node.inputs.size() ? node.inputs[k] : node.output;
      if (g_.tensors[t].dtype == DType::kFloat16) {
        TVM_FFI_THROW(ValueError) << g_.where(n) << ": tensor " << t << " has dtype float16, which op '" << node.op
                                  << "' does not read (float16 tensors go to the scales of dense_wq and take_wq)";
      }
    }
    if (FindKernelTraits(node.op).accepts_int8) return;
    for (size_t k = 0; k <= node.inputs.size(); ++k) {
      const int t = k < node.inputs.size() ? node.inputs[k] : node.output;
      if (IsInt8(g_.tensors[t].dtype)) {
        TVM_FFI_THROW(ValueError) << g_.where(n) << ": tensor " << t << " has dtype " << DTypeName(g_.tensors[t].dtype)
                                  << ", which op '" << node.op << "' does not read (8-bit tensors go to conv2d, "
                                  << "dense, pool2d, quantize and dequantize)";
      }
    }
  }

  /*! \brief The slot of node \p n's residual (its sum input) when the node may accumulate into it
   *         in place (the residual dies here, private, same bytes as the output), else -1. */
  int ReusableResidual(size_t n, const Kernel& kernel, bool at_init) {
    const NodeInfo& node = g_.nodes[n];
    const int residual = node.inputs[kernel.sum_input()];
    const ValueState& r = values_[residual];
    int reads = 0;
    for (int in : node.inputs) reads += in == residual;
    const memory::desc& want = kernel.output().want;
    // the same bytes: equal descriptors, or both row-major over the same number of elements (a
    // residual relabelled [N,H,W,C] read by a dense writing [N*H*W, C])
    const bool same_bytes = r.storage_md == want ||
                            (r.storage_md == PlainDesc(r.storage_md.get_dims()) && want == PlainDesc(want.get_dims()) &&
                             r.storage_md.get_size() == want.get_size());
    const bool dies = r.aliased ? values_.SlotDiesAt(r.storage, n) : r.last_use == static_cast<int>(n);
    if (!at_init && !r.is_const && g_.roles[residual] == TensorRole::kNodeOutput && !r.region_output && dies &&
        reads == 1 && buffers_.IsPrivate(r.storage) && !concats_.IsConcatStorage(r.storage) && same_bytes) {
      return r.storage;  // the residual dies here: accumulate into its own buffer
    }
    return -1;
  }

  /*! \brief Plan one node: resolve its inputs, place its output, append its steps. */
  void PlanNode(size_t n, const Kernel& kernel, bool at_init) {
    const NodeInfo& node = g_.nodes[n];
    if (kernel.alias_input() >= 0) {
      layouts_.Alias(n, kernel);
      return;
    }
    if (!kernel.relabel_axes().empty() && layouts_.Relabel(n, kernel)) return;
    if (!at_init && !kernel.view_box().begin.empty() && layouts_.SliceView(n, kernel)) return;
    if (concats_.PlannedAsConcat(n)) {
      plan_.notes.push_back(concats_.PlanConcat(n, kernel));
      return;
    }

    std::vector<MemRef> ins(node.inputs.size());
    const int sum = kernel.sum_input();
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      if (static_cast<int>(k) == sum) continue;
      ins[k] = layouts_.Resolve(node.inputs[k], kernel.inputs()[k], n, at_init);
    }
    const int residual = sum >= 0 ? node.inputs[sum] : -1;
    const int reuse = sum >= 0 ? ReusableResidual(n, kernel, at_init) : -1;
    std::vector<Step> trailing;
    MemRef out;
    if (at_init || reuse >= 0 || !concats_.WriteIntoConcat(n, kernel.output(), &out)) {
      out = layouts_.DefineOutput(n, kernel.output(), at_init, reuse, &trailing);
    }
    if (sum >= 0) {
      if (out.slot != reuse || reuse < 0) {
        const MemRef res = layouts_.Resolve(residual, kernel.inputs()[sum], n, at_init);
        programs_.AddReorder(at_init, res, out,
                             g_.where(n) + ": residual tensor " + std::to_string(residual) + " copied into the output");
      }
      ins[sum] = out;
    }
    std::vector<MemRef> temps;
    for (size_t k = 0; k < kernel.temps().size(); ++k) {
      const memory::desc& md = kernel.temps()[k];
      temps.push_back({md, buffers_.Own(at_init, md, g_.where(n) + " temp " + std::to_string(k))});
    }
    std::vector<Step> steps = kernel.Bind(ins, out, temps);
    // At init, the kernel's last step completes its output; earlier ones fill temps (always run).
    for (size_t i = 0; i < steps.size(); ++i) {
      programs_.Add(at_init, std::move(steps[i]), i + 1 == steps.size() ? out.slot : -1);
    }
    for (Step& s : trailing) programs_.Add(false, std::move(s), -1);
  }

  const RegionGraph& g_;
  const dnnl::engine& engine_;
  Plan& plan_;
  planning::ValueTable values_;
  planning::Buffers buffers_;
  planning::Programs programs_;
  planning::LayoutResolver layouts_;
  planning::ConcatInPlace concats_;
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
