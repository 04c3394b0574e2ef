/*!
 * \file region_plan.h
 * \brief A region compiled for oneDNN: primitives, buffers and the two step programs.
 *
 * The constructor creates every primitive and decides every buffer once (compile time).
 * LoadConstants() runs the init program: constants copied and reordered into the layouts the
 * primitives prefer, and nodes whose inputs are all constants (batch-norm folding) evaluated.
 * Execute() binds the caller's buffers and runs the run program (run time).
 *
 * Concurrency: what a call writes (intermediates, scratchpad, the oneDNN stream) lives in an
 * execution context.  Contexts are pooled: a call takes a free one, or creates one when all are
 * busy, and gives it back.  Primitives and the reordered constants are shared, read-only.  So
 * calls from several threads run at the same time without sharing mutable state; LoadConstants
 * waits for running calls and blocks new ones while it replaces the constants.
 *
 * This header keeps oneDNN out of its includers.
 */
#ifndef BYOC_HETERO_REGION_PLAN_H_
#define BYOC_HETERO_REGION_PLAN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "region_graph.h"

namespace byoc_hetero {

/*! \brief Time spent in one step of a program (profiling must be on to count). */
struct StepProfile {
  std::string phase;  // "init" | "run"
  std::string label;
  std::string op;     // node op, "" for planner reorders
  std::string impl;   // oneDNN implementation, or "host"
  std::string layouts;
  int64_t calls = 0;
  double seconds = 0;
};

class CompiledRegion {
 public:
  /*!
   * \brief Validate the ops of \p graph and build the oneDNN plan for \p threads OpenMP threads
   *        (RegionThreads() for a module's own plan; fewer for its plans under contention).
   * \throws tvm::ffi::Error: ValueError for attrs/shapes the ops reject, RuntimeError when
   *         oneDNN cannot create a primitive; messages name the region and the node.
   */
  CompiledRegion(const RegionGraph& graph, int threads);
  ~CompiledRegion();
  CompiledRegion(const CompiledRegion&) = delete;
  CompiledRegion& operator=(const CompiledRegion&) = delete;

  /*!
   * \brief Copy/reorder the constants into the module's own buffers and fold what depends on
   *        constants only.
   * \param data One pointer per graph.constants entry: the plain row-major float32 data.
   *        The pointers need to stay valid only during the call.
   */
  void LoadConstants(const std::vector<const void*>& data);
  /*! \brief True once LoadConstants succeeded, or when the region has no constants. */
  bool ready() const;

  /*!
   * \brief Run the region.
   * \param buffers The region inputs then the region outputs, plain row-major float32, already
   *        checked by the caller against the graph's shapes.
   */
  void Execute(const std::vector<void*>& buffers);

  /*! \brief One line per step of both programs: label, oneDNN implementation, layouts. */
  std::vector<std::string> Describe() const;

  /*! \brief OpenMP threads this region's primitives were built for and run with. */
  int threads() const;
  /*! \brief Execution contexts created so far (one per concurrent caller at the peak). */
  int contexts() const;
  /*! \brief Bytes of module-wide buffers (reordered constants) and of one execution context. */
  int64_t shared_bytes() const;
  int64_t context_bytes() const;

  /*! \brief Turn per-step timing on or off (off by default; on costs two clock reads a step). */
  void SetProfiling(bool on);
  /*! \brief Per-step times since the last reset. */
  std::vector<StepProfile> Profile() const;
  void ResetProfile();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_REGION_PLAN_H_
