/*!
 * \file planner.h
 * \brief The planner: a parsed region plus concrete input shapes -> an immutable Plan.
 *
 * A Plan says everything about how a region runs, and nothing is executed to make it: the
 * kernels' oneDNN primitive descriptors, the two step programs (init: constants reordered,
 * transformed and folded; run: per call), the buffers (slots) every step reads and writes, the
 * arena offsets of the intermediates and the scratchpad sizes.  Making oneDNN primitives (JIT
 * code), allocating buffers and running are the executor's (executor.h); the prepared weights
 * the init program fills are shared between plans (weights.h).
 *
 * Buffers are named by slots:
 *   run arg    a caller's buffer (region input or output), bound on every call;
 *   const arg  a constant's data, reachable only while the weights are prepared;
 *   shared     a prepared weight: filled by the init program, read-only while running, named by
 *              a key (tensor, layout, transform) so that plans wanting the same one share it; or
 *              a constant a run step reads in its own plain layout, in place (SharedBuffer::constant);
 *   private    one per execution context: intermediates of the run program.  Private buffers
 *              whose lifetimes (first to last step using them) do not overlap share memory: they
 *              are laid out in one arena per context (buffers with blocked-layout padding, which
 *              must stay zero, are never shared);
 *   scratch    one per execution context: oneDNN's scratchpad, shared by all steps.
 */
#ifndef BYOC_HETERO_PLANNER_H_
#define BYOC_HETERO_PLANNER_H_

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernel.h"
#include "region_graph.h"

namespace byoc_hetero {

enum class SlotKind { kRunArg, kConstArg, kShared, kPrivate, kScratch };

struct Slot {
  SlotKind kind;
  int index;  // run arg / const arg position, or buffer index within its kind
};

/*! \brief A prepared weight the init program writes. */
struct SharedBuffer {
  size_t bytes;
  std::string key;   // what it holds: "tensor <t> <view> -> <want> [<transform>]", plan-independent
  std::string what;  // the node that asked for it (allocation messages)
  bool run = false;  // the run program reads it; else only init steps do (freed once filled, weights.h)
  /*! \brief A constant read in place (a run step wants its plain bytes): its index, no buffer
   *         and no init step (the executor points the steps at the constant's data); else -1. */
  int constant = -1;
};

/*! \brief An intermediate of the run program, placed in the context's arena. */
struct PrivateBuffer {
  size_t bytes;
  bool padded;       // blocked layout with zero padding: never shares memory
  int first = -1;    // first and last run step using it (padded: the whole run)
  int last = -1;
  size_t offset = 0; // in the arena
  /*! \brief A slice of another private buffer (a concat input its producer writes in place):
   *         that buffer's index and the byte offset in it, else -1.  A slice is not placed on
   *         its own; its parent lives as long as any step uses either. */
  int parent = -1;
  size_t parent_offset = 0;
};

/*! \brief One step of a program, ready to become a oneDNN primitive or a host call. */
struct PlannedStep {
  dnnl::primitive_desc_base pd;  // empty for host steps
  HostFn host;
  std::vector<std::pair<int, MemRef>> args;  // DNNL_ARG_SCRATCHPAD included when it needs one
  std::string label;
  std::string op;      // the node's op ("" for planner reorders)
  std::string impl;    // oneDNN implementation, or "host"
  std::string layouts; // " src=... wei=... dst=..." (host: " in=... out=...")
  int writes = -1;     // init program: the shared buffer this step completes, -1 when none
};

/*! \brief What to plan for. */
struct PlanRequest {
  /*! \brief One shape per region input (then one per output with_output_shapes); empty = the
   *         graph's declared shapes. */
  std::vector<std::vector<int64_t>> input_shapes;
  /*! \brief input_shapes ends with the outputs' shapes (a region call's): a symbolic region may
   *         have a symbol that only an output has as a dim of its own (a region ending in a
   *         reshape [n * m, 8] -> [n, m, 8]); the call binds it there, and so does the plan. */
  bool with_output_shapes = false;
  /*! \brief OpenMP threads the primitives are made and run with (oneDNN sizes some at creation). */
  int threads = 1;
  /*! \brief A symbolic region's tensors at these shapes may take at most this many bytes. */
  int64_t max_bytes = INT64_MAX;
};

struct Plan {
  std::string where;  // "byoc_hetero region '<symbol>'"
  std::string symbol;
  std::string precision = "f32";   // what the anchors compute in (EffectivePrecision)
  std::string precision_note;      // why a bf16 request runs f32, else ""
  int threads = 1;
  std::vector<std::vector<int64_t>> input_shapes, output_shapes;
  /*! \brief The values of the graph's symbols the plan was made for (empty: static region). */
  std::vector<int64_t> symbol_values;
  size_t num_constants = 0;

  std::vector<Slot> slots;
  std::vector<SharedBuffer> shared;
  std::vector<PrivateBuffer> privates;
  size_t arena_bytes = 0;
  size_t init_scratch_bytes = 0, run_scratch_bytes = 0;

  std::vector<PlannedStep> init_steps, run_steps;
  /*! \brief What the steps do not show: per concat, which inputs their producers wrote in place
   *         ("free") and which the run program copies. */
  std::vector<std::string> notes;

  size_t num_buffers() const { return input_shapes.size() + output_shapes.size(); }
  int64_t shared_bytes() const;
  /*! \brief One line per step of both programs: "<init|run> | <label> | <impl><layouts>", then
   *         one "note | <text>" line per note. */
  std::vector<std::string> Describe() const;
};

/*!
 * \brief Plan \p graph for \p request.
 * A symbolic region (RegionGraph::symbolic) is planned for request.input_shapes, which bind its
 * symbols (RegionGraph::BindSymbols); the plan is the static plan of the graph at those shapes.
 * \throws tvm::ffi::Error: InputError for input shapes the region does not accept (their count,
 *         rank, a static dim, symbols that disagree, too large for max_bytes, shapes an op of a
 *         symbolic region rejects at that binding such as inputs too small for a window; a static
 *         region: any shape other than the declared one), ValueError for attrs/shapes the ops of
 *         a static region reject, RuntimeError when oneDNN cannot create a primitive descriptor;
 *         messages name the region and the node.
 */
std::shared_ptr<const Plan> MakePlan(const RegionGraph& graph, const PlanRequest& request,
                                     const dnnl::engine& engine);

/*! \brief oneDNN's status names for messages ("unimplemented", ...). */
std::string DnnlStatusName(dnnl_status_t status);

/*! \brief Throw a RuntimeError "<where>: oneDNN failed to <action>: <what> (<status>)". */
[[noreturn]] void ThrowDnnlError(const std::string& where, const char* action, const dnnl::error& e);

/*! \brief Run f, turning a dnnl::error into a RuntimeError that says where and what. */
template <typename F>
auto GuardDnnl(const std::string& where, const char* action, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    ThrowDnnlError(where, action, e);
  }
}

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLANNER_H_
