/*!
 * \file plan/arena.cc
 * \brief PlaceIntermediates (see arena.h).
 */
#include "arena.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace byoc_hetero {
namespace planning {

void PlaceIntermediates(Plan& plan) {
  std::vector<PrivateBuffer>& bufs = plan.privates;
  const size_t n = bufs.size();
  const int forever = static_cast<int>(plan.run_steps.size());
  for (PrivateBuffer& b : bufs) b.first = forever + 1;
  for (size_t i = 0; i < plan.run_steps.size(); ++i) {
    for (const auto& [arg, ref] : plan.run_steps[i].args) {
      const Slot& slot = plan.slots[ref.slot];
      if (slot.kind != SlotKind::kPrivate) continue;
      bufs[slot.index].first = std::min(bufs[slot.index].first, static_cast<int>(i));
      bufs[slot.index].last = std::max(bufs[slot.index].last, static_cast<int>(i));
    }
  }
  // a slice (a concat input written in place) keeps its parent alive while it is used
  for (PrivateBuffer& b : bufs) {
    if (b.parent < 0 || b.last < 0) continue;
    PrivateBuffer& parent = bufs[b.parent];
    parent.first = std::min(parent.first, b.first);
    parent.last = std::max(parent.last, b.last);
  }
  for (PrivateBuffer& b : bufs) {
    if (b.parent < 0 && (b.padded || b.last < 0)) {  // padded: alone for the whole run
      b.first = -1;
      b.last = forever;
    }
  }
  auto round_up = [](size_t b) { return (b + 63) / 64 * 64; };
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bufs[a].bytes > bufs[b].bytes; });
  std::vector<size_t> placed;
  for (size_t k : order) {
    if (bufs[k].parent >= 0) continue;  // placed with its parent, below
    const size_t size = round_up(bufs[k].bytes);
    // intervals [offset, offset + size) taken by buffers alive at the same time
    std::vector<std::pair<size_t, size_t>> taken;
    for (size_t j : placed) {
      if (bufs[j].first <= bufs[k].last && bufs[k].first <= bufs[j].last) {
        taken.emplace_back(bufs[j].offset, bufs[j].offset + round_up(bufs[j].bytes));
      }
    }
    std::sort(taken.begin(), taken.end());
    size_t offset = 0;
    for (const auto& [lo, hi] : taken) {
      if (offset + size <= lo) break;
      offset = std::max(offset, hi);
    }
    bufs[k].offset = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(k);
  }
  for (PrivateBuffer& b : bufs) {
    if (b.parent >= 0) b.offset = bufs[b.parent].offset + b.parent_offset;
  }
}

}  // namespace planning
}  // namespace byoc_hetero
