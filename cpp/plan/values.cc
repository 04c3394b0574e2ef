/*!
 * \file plan/values.cc
 * \brief ValueTable (see values.h).
 */
#include "values.h"

namespace byoc_hetero {
namespace planning {

ValueTable::ValueTable(const RegionGraph& g) : g_(g), values_(g.tensors.size()) {
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    for (int t : g.nodes[n].inputs) values_[static_cast<size_t>(t)].last_use = static_cast<int>(n);
  }
  for (int t : g.outputs) values_[static_cast<size_t>(t)].region_output = true;
}

bool ValueTable::SameBytes(int a, int b) const {
  if (a == b) return true;
  const ValueState& va = (*this)[a];
  const ValueState& vb = (*this)[b];
  return va.aliased && vb.aliased && va.storage == vb.storage && OrderOf(a) == OrderOf(b);
}

bool ValueTable::SlotDiesAt(int slot, size_t n) const {
  const int root = RootSlot(slot);
  for (const ValueState& v : values_) {
    const bool in_slot = (v.storage >= 0 && RootSlot(v.storage) == root) || (v.plain >= 0 && RootSlot(v.plain) == root);
    if (in_slot && (v.region_output || v.last_use > static_cast<int>(n))) {
      return false;
    }
  }
  return true;
}

int ValueTable::OutputPosition(int t) const {
  for (size_t i = 0; i < g_.outputs.size(); ++i) {
    if (g_.outputs[i] == t) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace planning
}  // namespace byoc_hetero
