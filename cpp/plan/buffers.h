/*!
 * \file plan/buffers.h
 * \brief Buffer assignment: the plan's slots and the buffers behind them (planner.h: run args,
 *        const args, the scratchpad, shared prepared weights, private intermediates and their slices).
 *
 * The planner owns one Buffers; the parts that place values ask it for slots.  It is the only
 * writer of Plan::slots, Plan::shared and Plan::privates while a plan is made (the arena offsets of
 * the private buffers are placed afterwards, plan/arena.h).
 */
#ifndef BYOC_HETERO_PLAN_BUFFERS_H_
#define BYOC_HETERO_PLAN_BUFFERS_H_

#include <string>
#include <utility>
#include <vector>

#include "../planner.h"

namespace byoc_hetero {
namespace planning {

class Buffers {
 public:
  /*! \brief Makes the argument slots: one per region input and output (run args), one per
   *         constant (const args), then the scratchpad's. */
  Buffers(const RegionGraph& g, Plan* plan);

  /*! \brief The node now being planned, named in the buffers it asks for and in messages. */
  void SetNode(std::string where) { node_where_ = std::move(where); }

  /*! \brief The caller's buffer of region input \p i. */
  int RunArg(size_t i) const { return run_arg_slot_[i]; }
  /*! \brief The caller's buffer of region output \p pos. */
  int OutputArg(size_t pos) const { return run_arg_slot_[g_.inputs.size() + pos]; }
  /*! \brief Constant \p i's data (reachable only while the weights are prepared). */
  int ConstArg(size_t i) const { return const_arg_slot_[i]; }
  int scratch() const { return scratch_slot_; }

  /*!
   * \brief A slot for a value computed at init (a shared buffer named \p key) or per call (a
   *        private buffer).  Asking twice for one key gives one buffer.
   */
  int Own(bool at_init, const memory::desc& md, const std::string& key);
  /*! \brief The shared slot of constant tensor \p t read in place by run steps (SharedBuffer::constant). */
  int Constant(int t);
  /*! \brief A private slot for \p bytes at \p offset bytes into the private buffer of \p buffer_slot (into
   *         the buffer that one is a slice of, when it is one). */
  int Slice(int buffer_slot, size_t bytes, size_t offset);

  /*! \brief The shared buffer a slot is, or -1. */
  int SharedIndex(int slot) const {
    return plan_.slots[slot].kind == SlotKind::kShared ? plan_.slots[slot].index : -1;
  }
  bool IsPrivate(int slot) const { return plan_.slots[slot].kind == SlotKind::kPrivate; }
  /*! \brief Whether \p slot is a slice of another private buffer (PrivateBuffer::parent). */
  bool IsSlice(int slot) const { return IsPrivate(slot) && plan_.privates[plan_.slots[slot].index].parent >= 0; }

  /*! \brief Mark the shared buffers the run program reads (SharedBuffer::run); the rest are
   *         freed once the init program has filled them. */
  void MarkReadByRun(const std::vector<PlannedStep>& run_steps);

  /*! \brief A shared buffer's key: tensor, the view it is read as, the layout wanted, a transform.
   *         A relayout's view and want are named in the view's stride order, so that two kernels
   *         asking for the same bytes under different axis orders (a matmul's [K, N] and an inner
   *         product's [N, K] of one weight) share one buffer. */
  static std::string Key(int t, const memory::desc& view, const memory::desc& want,
                         const std::string& transform = "");

 private:
  int NewSlot(SlotKind kind, size_t index);
  /*! \brief The slot of the shared buffer named \p key, or -1. */
  int FindShared(const std::string& key) const;

  const RegionGraph& g_;
  Plan& plan_;
  std::vector<int> run_arg_slot_, const_arg_slot_;
  int scratch_slot_ = -1;
  std::string node_where_;
};

}  // namespace planning
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLAN_BUFFERS_H_
