/*!
 * \file compiled_region.h
 * \brief A region ready to run: its plans (one per set of input shapes), the prepared weights
 *        they share, and one executor per plan.
 *
 * A static region has one plan, made with the module (so that a region the runtime cannot run
 * fails at creation).  A region with symbolic dims (docs/region-format.md, "Symbolic shapes") is
 * planned on the first call at each new binding of its symbols; the plans live in a
 * least-recently-used cache of at most PlanCacheLimit() entries (BYOC_HETERO_PLAN_CACHE, default
 * 8; _C.set_plan_cache_limit).  All plans read one PreparedWeights, shared with the module's
 * regions for fewer threads (region_module.cc): a weight is prepared once per (tensor, layout,
 * transform), whatever the shapes and thread counts, and a plan made later fills only the layouts
 * no earlier plan wanted, from the constants the store keeps since __init_.
 *
 * Concurrency: calls from several threads run at the same time (each in its own execution
 * context, executor.h); LoadConstants and the making of a new plan's weights wait for running
 * calls (of every region sharing the weights) and hold new ones while they write the weights.
 */
#ifndef BYOC_HETERO_COMPILED_REGION_H_
#define BYOC_HETERO_COMPILED_REGION_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "executor.h"
#include "planner.h"
#include "region_graph.h"
#include "weights.h"

namespace byoc_hetero {

/*! \brief Most plans a symbolic region keeps (BYOC_HETERO_PLAN_CACHE when set, else 8). */
int PlanCacheLimit();
/*! \brief Change the limit (>= 1) for every module, from its next new shape on. */
void SetPlanCacheLimit(int n);

/*! \brief Bytes of physical memory: the most a binding's tensors may need (else InputError). */
int64_t PhysicalMemoryBytes();

/*!
 * \brief Plans made and prepared-weight fills so far, by every region of the process: a call during
 *        which it moved did one-time work (AdaptiveCall::Ignore).
 */
int64_t OneTimeWorkCount();

class CompiledRegion {
 public:
  /*!
   * \brief A static region: plan it for its declared shapes and \p threads OpenMP threads
   *        (RegionThreads() for a module's own plans, fewer for its plans under contention,
   *        threading.h), allocate its weights and make its primitives.  A symbolic one: nothing is
   *        planned yet (its plans, made per binding, use \p threads too).
   * \throws tvm::ffi::Error: ValueError for attrs/shapes the ops reject, RuntimeError when
   *         oneDNN cannot create a primitive or memory runs out; messages name the region and node.
   */
  CompiledRegion(const RegionGraph& graph, int threads,
                 std::shared_ptr<PreparedWeights> weights = std::make_shared<PreparedWeights>());

  /*!
   * \brief Take new constants (the plain row-major float32 data of each graph.constants entry)
   *        and fill the weights of every cached plan.  \p keep_alive owns the data: the store
   *        keeps it, because plans made later prepare their weights from it.  Another region
   *        sharing the store fills its own plans' weights at its next call.
   */
  void LoadConstants(const std::vector<const void*>& data, std::shared_ptr<const void> keep_alive);
  /*! \brief True once LoadConstants succeeded, or when the region has no constants. */
  bool ready() const { return weights_->ready(); }
  /*! \brief The prepared weights (to share with a region of the same graph for fewer threads). */
  const std::shared_ptr<PreparedWeights>& weights() const { return weights_; }

  /*!
   * \brief Run on the region inputs then outputs (plain float32, checked by the caller), whose
   *        shapes are \p arg_shapes (bound against the graph: InputError when they do not fit).
   */
  void Execute(const std::vector<void*>& buffers, const std::vector<std::vector<int64_t>>& arg_shapes);

  /*! \brief The most recently used plan's steps (a symbolic region before its first call: none). */
  std::vector<std::string> Describe() const;
  int threads() const { return threads_; }
  int contexts() const;
  /*! \brief Bytes of the prepared weights, and of one execution context of the largest plan. */
  int64_t shared_bytes() const;
  int64_t context_bytes() const;
  /*! \brief Plans cached now, and made since the module was created. */
  int plans() const;
  int64_t plans_made() const { return plans_made_; }
  /*! \brief The symbol values of each cached plan, most recently used first. */
  std::vector<std::vector<int64_t>> cached_bindings() const;

  void SetProfiling(bool on);
  /*! \brief The steps of every cached plan (symbolic: labels carry the binding). */
  std::vector<StepProfile> Profile() const;
  void ResetProfile();

 private:
  struct Entry {
    std::vector<int64_t> key;  // symbol values (empty: the static plan)
    std::shared_ptr<Executor> executor;
    int64_t generation = -1;   // the weights' generation (constants) it was filled for
  };
  std::shared_ptr<Entry> Find(const std::vector<int64_t>& key);
  /*! \brief The entry of the last call when \p arg_shapes are its shapes (else null). */
  std::shared_ptr<Entry> LastFor(const std::vector<std::vector<int64_t>>& arg_shapes);
  void Remember(const std::vector<std::vector<int64_t>>& arg_shapes, std::shared_ptr<Entry> entry);
  /*! \brief The plan for these input shapes, followed by the outputs' when \p with_output_shapes
   *         (PlanRequest; InputError when the ops reject them). */
  std::shared_ptr<const Plan> PlanFor(const std::vector<std::vector<int64_t>>& shapes,
                                      bool with_output_shapes = false) const;
  /*! \brief Reserve the plan's weights and make its executor (the weights' mutex held exclusively). */
  std::shared_ptr<Entry> MakeEntry(const std::vector<int64_t>& key, std::shared_ptr<const Plan> plan);
  void Fill(Entry& entry);

  const RegionGraph& graph_;
  std::string where_;
  std::string symbol_;
  int threads_;
  int64_t max_bytes_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::shared_ptr<PreparedWeights> weights_;  // its mutex: shared by running calls, exclusive when writing
  mutable std::mutex cache_mu_;     // guards cache_ (taken after the weights' mutex, never before)
  std::list<std::shared_ptr<Entry>> cache_;  // most recently used first
  // The last call's argument shapes (each rank, then its dims) and its entry: a call at the
  // same shapes (the common case: a model called at one size) skips binding the symbols and the
  // cache search.  Guarded by cache_mu_; reset when that entry is evicted.
  std::vector<int64_t> last_shapes_;
  std::shared_ptr<Entry> last_entry_;
  std::atomic<int64_t> plans_made_{0};
  std::atomic<bool> profiling_{false};
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_COMPILED_REGION_H_
