/*!
 * \file executor.h
 * \brief The executor of one plan: its oneDNN primitives, execution contexts and step timings.
 *
 * The primitives are made from the plan's descriptors once, when the executor is made, and
 * executed many times.  What a running call writes (intermediates, scratchpad, the oneDNN
 * stream) lives in an execution context.  Contexts are pooled: a call takes a free one, or
 * creates one when all are busy, and gives it back; primitives and the prepared weights are
 * shared, read-only, so calls from several threads run at the same time without sharing mutable
 * state.  A call is: take a context, set the caller's pointers, execute the steps.
 */
#ifndef BYOC_HETERO_EXECUTOR_H_
#define BYOC_HETERO_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "planner.h"
#include "weights.h"

namespace byoc_hetero {

struct SlabFold;

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

class Executor {
 public:
  /*!
   * \brief Make the run program's primitives and the first execution context.
   * \param weights The plan's prepared weights (PreparedWeights::Reserve(*plan)), read by every call.
   */
  Executor(std::shared_ptr<const Plan> plan, const dnnl::engine& engine, std::vector<void*> weights);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const Plan& plan() const { return *plan_; }

  /*!
   * \brief Fill the plan's weights that \p store does not hold yet: run the init steps that
   *        complete the ones its run program reads (and the steps they read from), with the
   *        store's constants.  The caller holds store.mutex() exclusively.
   */
  void FillWeights(PreparedWeights& store);

  /*! \brief Run the plan on the region inputs then outputs (plain, checked by the caller). */
  void Run(const std::vector<void*>& buffers);

  /*! \brief Execution contexts created so far (one per concurrent caller at the peak). */
  int contexts() const { return contexts_created_.load(); }
  /*! \brief Bytes of one execution context (arena and scratchpad). */
  int64_t context_bytes() const { return context_bytes_; }

  /*! \brief Turn per-step timing on or off (off by default; on costs two clock reads a step). */
  void SetProfiling(bool on) { profiling_ = on; }
  std::vector<StepProfile> Profile() const;
  void ResetProfile();

 private:
  struct Program;
  struct Context;
  std::unique_ptr<Context> MakeContext(const Program& prog, size_t scratch_bytes, bool with_private,
                                       const std::vector<void*>& weights) const;
  /*! \brief Run \p prog's steps but those \p skip names; after step i, \p after(i) where given. A step for
   *         which \p instead(i) returns true was run by it (slab_fold.h), not by its primitive. */
  void RunProgram(const Program& prog, Context& ctx, const std::vector<bool>* skip,
                  const std::function<void(size_t)>& after = nullptr,
                  const std::function<bool(size_t)>& instead = nullptr);
  /*! \brief Run \p fold (slab_fold.h) on the pointers of its two init steps in \p ctx. */
  void RunSlabs(const SlabFold& fold, Context& ctx, const std::vector<std::pair<uintptr_t, uintptr_t>>& mapped);
  /*! \brief Point the run program's reads of constants in place (SharedBuffer::constant) at the
   *         store's constants, in every pooled context (no call runs meanwhile). */
  void PointAtConstants(const PreparedWeights& store);

  std::shared_ptr<const Plan> plan_;
  dnnl::engine engine_;
  std::vector<void*> weights_;
  std::unique_ptr<Program> init_, run_;
  std::mutex pool_mu_;
  std::vector<std::unique_ptr<Context>> pool_;
  std::atomic<int> contexts_created_{0};
  int64_t context_bytes_ = 0;
  std::atomic<bool> profiling_{false};
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_EXECUTOR_H_
