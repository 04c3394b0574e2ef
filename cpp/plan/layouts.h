/*!
 * \file plan/layouts.h
 * \brief Layout resolution: which slot and layout each value lives in, and the reorders (or
 *        zero-copy views) that hand a consumer the layout it wants.
 *
 * Every tensor of the region gets a ValueState (builder.h):
 *   storage     the slot its value lives in during a run, in storage_md (the producer's layout,
 *               possibly blocked; plain for region inputs and constants);
 *   plain       a slot holding the same value in plain row-major bytes (plain_md), when one
 *               exists: region inputs/outputs (the caller's buffers), constants, intermediates
 *               whose producer writes plain, or a plain copy made on demand.
 * A consumer asks for (view, want).  The planner hands it the storage directly when the layouts
 * agree, and otherwise inserts one reorder.  A value known at __init_ (a constant, or the output
 * of a node whose inputs are all such values) is converted in the init program, once; everything
 * else goes to the run program, in node order.
 */
#ifndef BYOC_HETERO_PLAN_LAYOUTS_H_
#define BYOC_HETERO_PLAN_LAYOUTS_H_

#include <string>
#include <vector>

#include "builder.h"

namespace byoc_hetero {
namespace planning {

class LayoutResolver : public PlanBuilder {
 public:
  using PlanBuilder::PlanBuilder;

 protected:
  /*!
   * \brief A memory with layout.want holding tensor t, for node `consumer`.
   * \param init_consumer The consumer runs in the init program: a constant's own data may be
   *        handed over without a copy.
   */
  MemRef Resolve(int t, const OperandLayout& layout, size_t consumer, bool init_consumer);

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
  MemRef DefineOutput(size_t n, const OperandLayout& layout, bool at_init, int reuse, std::vector<Step>* trailing);

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
  bool Relabel(size_t n, const Kernel& kernel);

  /*!
   * \brief Whether every value living in \p slot (a value and its relabels: reshapes, permutes)
   *        is read for the last time by node n at the latest, and none is a region output: then
   *        node n may overwrite the slot (a sum post-op accumulating into its residual).
   */
  bool SlotDiesAt(int slot, size_t n) const;

  /*! \brief The bytes an earlier Resolve of the same bytes (tensor t, or a reshape of it sharing
   *         its storage) in \p layout gave, or null: one conversion serves every reader. */
  const MemRef* FindResolved(int t, const OperandLayout& layout, bool init_consumer) const;

  struct Resolved {
    int tensor;
    memory::desc view, want;
    std::string transform;
    MemRef mem;
    bool init_only;
  };

  std::vector<Resolved> resolved_;
};

}  // namespace planning
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLAN_LAYOUTS_H_
