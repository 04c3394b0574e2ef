/*!
 * \file plan/values.h
 * \brief The planner's tensor table: where each tensor's value lives while a region is planned.
 *
 * The planner (planner.cc) owns one ValueTable and hands it to the parts that place values
 * (plan/layouts.h, plan/concat_in_place.h).  A ValueState is a plain record; the table answers the
 * questions that read several of them (which values share a slot, when a slot dies).
 */
#ifndef BYOC_HETERO_PLAN_VALUES_H_
#define BYOC_HETERO_PLAN_VALUES_H_

#include <map>
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

/*! \brief One ValueState per tensor of a region graph. */
class ValueTable {
 public:
  /*! \brief Every tensor unplaced; each one's last reader and whether it is a region output set. */
  explicit ValueTable(const RegionGraph& g);

  ValueState& operator[](int t) { return values_[static_cast<size_t>(t)]; }
  const ValueState& operator[](int t) const { return values_[static_cast<size_t>(t)]; }

  /*! \brief The order id of tensor t (ValueState::order). */
  int OrderOf(int t) const {
    const int order = (*this)[t].order;
    return order >= 0 ? order : t;
  }

  /*! \brief Whether tensors a and b are the same bytes in the same element order: one tensor, or
   *         reshapes of one value sharing its storage slot (a permute shares the slot, not the order). */
  bool SameBytes(int a, int b) const;

  /*!
   * \brief Whether every value living in \p slot (a value and its relabels: reshapes, permutes)
   *        is read for the last time by node n at the latest, and none is a region output: then
   *        node n may overwrite the slot (a sum post-op accumulating into its residual).  Values in
   *        slots that share memory with it (NoteSubSlot) count too.
   */
  bool SlotDiesAt(int slot, size_t n) const;

  /*! \brief Slot \p part is memory inside slot \p whole (a slice viewed in place, LayoutResolver::
   *         SliceView): the values of either keep both alive for SlotDiesAt. */
  void NoteSubSlot(int part, int whole) { whole_of_[part] = RootSlot(whole); }

  /*! \brief The position of tensor t among the region's outputs, or -1. */
  int OutputPosition(int t) const;

 private:
  /*! \brief The slot whose memory \p slot lies in (NoteSubSlot), or \p slot itself. */
  int RootSlot(int slot) const {
    const auto found = whole_of_.find(slot);
    return found == whole_of_.end() ? slot : found->second;
  }

  const RegionGraph& g_;
  std::vector<ValueState> values_;
  std::map<int, int> whole_of_;  // a slot inside another's memory -> that slot (NoteSubSlot)
};

}  // namespace planning
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_PLAN_VALUES_H_
