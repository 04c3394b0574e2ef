/*!
 * \file plan/builder.h
 * \brief The planner's shared state and its lowest layer: per-tensor ValueStates, slots and
 *        buffers (shared / private), the two step programs, reorders and host byte copies.
 *
 * The planner is layered (see planner.cc): PlanBuilder (this file) <- LayoutResolver
 * (plan/layouts.h: where values live, in which layout, and the reorders between) <- ConcatInPlace
 * (plan/concat_in_place.h: producers writing into a concat's buffer) <- Planner (planner.cc: the
 * per-node driver).  The arena placement of the private buffers is plan/arena.h.
 */
#ifndef BYOC_HETERO_PLAN_BUILDER_H_
#define BYOC_HETERO_PLAN_BUILDER_H_

#include <string>
#include <vector>

#include "../planner.h"

namespace byoc_hetero {
namespace planning {

/*! \brief Where a tensor's value lives during planning (see plan/layouts.h). */
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

class PlanBuilder {
 public:
  PlanBuilder(const RegionGraph& g, const dnnl::engine& engine, Plan* plan)
      : g_(g), engine_(engine), plan_(*plan) {}

 protected:
  // ---- slots ---------------------------------------------------------------------------------
  int NewSlot(SlotKind kind, size_t index) {
    plan_.slots.push_back({kind, static_cast<int>(index)});
    return static_cast<int>(plan_.slots.size()) - 1;
  }
  /*!
   * \brief A slot for a value computed at init (a shared buffer named \p key) or per call (a
   *        private buffer).  Asking twice for one key gives one buffer.
   */
  int OwnSlot(bool at_init, const memory::desc& md, const std::string& key);
  /*! \brief The shared slot of constant tensor \p t read in place by run steps (SharedBuffer::constant). */
  int ConstantSlot(int t);
  /*! \brief A shared buffer's name: tensor, view -> want (and transform).  A relayout's view and
   *         want are named in the view's stride order, so that two kernels asking for the same
   *         bytes under different axis orders (a matmul's [K, N] and an inner product's [N, K] of
   *         one weight) share one buffer. */
  static std::string Key(int t, const memory::desc& view, const memory::desc& want,
                         const std::string& transform = "");
  /*! \brief The shared buffer a slot is, or -1. */
  int SharedIndex(int slot) const {
    return plan_.slots[slot].kind == SlotKind::kShared ? plan_.slots[slot].index : -1;
  }

  Step MakeReorder(const MemRef& src, const MemRef& dst, const std::string& label);
  /*!
   * \brief A host step copying src's elements into dst as raw bytes: both plain strided (no
   *        blocking), same dims and element type; dense equal layouts copy in one memcpy.
   */
  Step MakeHostCopy(const MemRef& src, const MemRef& dst, const std::string& label);
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

  const RegionGraph& g_;
  const dnnl::engine& engine_;
  Plan& plan_;
  std::vector<int> run_arg_slot_, const_arg_slot_;
  int scratch_slot_ = -1;
  std::string node_where_;  // the node being planned
  std::vector<ValueState> values_;
  std::vector<Pending> init_, run_;
};

}  // namespace planning
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLAN_BUILDER_H_
