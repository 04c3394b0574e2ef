/*!
 * \file compiled_region.h
 * \brief A region ready to run: its plan, its prepared weights and the plan's executor.
 *
 * Made once per module: the planner plans the region for its (today: static) input shapes, the
 * weights the plan wants are allocated, the executor makes the primitives.  LoadConstants()
 * fills the weights (constants copied, reordered, transformed, folded); Execute() runs the plan.
 *
 * Concurrency: calls from several threads run at the same time (each in its own execution
 * context, executor.h); LoadConstants waits for running calls and blocks new ones while it
 * replaces the weights.
 */
#ifndef BYOC_HETERO_COMPILED_REGION_H_
#define BYOC_HETERO_COMPILED_REGION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "executor.h"
#include "planner.h"
#include "region_graph.h"
#include "weights.h"

namespace byoc_hetero {

class CompiledRegion {
 public:
  /*!
   * \brief Plan \p graph for its declared shapes and \p threads OpenMP threads (RegionThreads()
   *        for a module's own plan, fewer for its plans under contention, threading.h), allocate
   *        its weights and make its primitives.
   * \throws tvm::ffi::Error: ValueError for attrs/shapes the ops reject, RuntimeError when
   *         oneDNN cannot create a primitive or memory runs out; messages name the region and node.
   */
  CompiledRegion(const RegionGraph& graph, int threads);

  /*!
   * \brief Fill the weights from new constants (the plain row-major float32 data of each
   *        graph.constants entry, valid during the call only).
   */
  void LoadConstants(const std::vector<const void*>& data);
  /*! \brief True once LoadConstants succeeded, or when the region has no constants. */
  bool ready() const { return ready_; }

  /*! \brief Run on the region inputs then outputs (plain float32, checked by the caller). */
  void Execute(const std::vector<void*>& buffers);

  const Plan& plan() const { return executor_->plan(); }
  std::vector<std::string> Describe() const { return plan().Describe(); }
  int threads() const { return plan().threads; }
  int contexts() const { return executor_->contexts(); }
  /*! \brief Bytes of the prepared weights and of one execution context. */
  int64_t shared_bytes() const { return weights_.bytes(); }
  int64_t context_bytes() const { return executor_->context_bytes(); }

  void SetProfiling(bool on) { executor_->SetProfiling(on); }
  std::vector<StepProfile> Profile() const { return executor_->Profile(); }
  void ResetProfile() { executor_->ResetProfile(); }

 private:
  std::string where_;
  std::string symbol_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  PreparedWeights weights_;
  // One plan while shapes are static; symbolic shapes will keep one executor per shape set,
  // all reading weights_.
  std::unique_ptr<Executor> executor_;
  std::shared_mutex consts_mu_;  // shared: running calls; exclusive: LoadConstants
  std::atomic<bool> ready_{false};
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_COMPILED_REGION_H_
