/*!
 * \file plan/buffers.cc
 * \brief Buffers (see buffers.h).
 */
#include "buffers.h"

#include <tvm/ffi/error.h>

#include <utility>

namespace byoc_hetero {
namespace planning {

Buffers::Buffers(const RegionGraph& g, Plan* plan) : g_(g), plan_(*plan) {
  const size_t run_args = g.inputs.size() + g.outputs.size();  // the caller's buffers
  for (size_t i = 0; i < run_args; ++i) run_arg_slot_.push_back(NewSlot(SlotKind::kRunArg, i));
  for (size_t i = 0; i < g.constants.size(); ++i) const_arg_slot_.push_back(NewSlot(SlotKind::kConstArg, i));
  scratch_slot_ = NewSlot(SlotKind::kScratch, 0);
}

int Buffers::NewSlot(SlotKind kind, size_t index) {
  plan_.slots.push_back({kind, static_cast<int>(index)});
  return static_cast<int>(plan_.slots.size()) - 1;
}

int Buffers::FindShared(const std::string& key) const {
  for (size_t s = 0; s < plan_.slots.size(); ++s) {
    const Slot& slot = plan_.slots[s];
    if (slot.kind == SlotKind::kShared && plan_.shared[slot.index].key == key) return static_cast<int>(s);
  }
  return -1;
}

int Buffers::Own(bool at_init, const memory::desc& md, const std::string& key) {
  if (at_init) {
    const int found = FindShared(key);
    if (found >= 0) return found;
    plan_.shared.push_back({md.get_size(), key, node_where_});
    return NewSlot(SlotKind::kShared, plan_.shared.size() - 1);
  }
  size_t numel = 1;
  for (auto d : md.get_dims()) numel *= static_cast<size_t>(d);
  plan_.privates.push_back({md.get_size(), md.get_size() != numel * memory::data_type_size(md.get_data_type())});
  return NewSlot(SlotKind::kPrivate, plan_.privates.size() - 1);
}

int Buffers::Constant(int t) {
  size_t c = 0;
  while (c < g_.constants.size() && g_.constants[c].tensor != t) ++c;
  if (c == g_.constants.size()) {
    TVM_FFI_THROW(InternalError) << node_where_ << ": tensor " << t << " is no constant of the region";
  }
  const std::string key = "constant " + std::to_string(c);
  const int found = FindShared(key);
  if (found >= 0) return found;
  SharedBuffer b{PlainDescOf(g_.tensors[t]).get_size(), key, node_where_};
  b.constant = static_cast<int>(c);
  plan_.shared.push_back(std::move(b));
  return NewSlot(SlotKind::kShared, plan_.shared.size() - 1);
}

int Buffers::Slice(int buffer_slot, size_t bytes, size_t offset) {
  PrivateBuffer slice{bytes, false};
  slice.parent = plan_.slots[buffer_slot].index;
  slice.parent_offset = offset;
  plan_.privates.push_back(slice);
  return NewSlot(SlotKind::kPrivate, plan_.privates.size() - 1);
}

void Buffers::MarkReadByRun(const std::vector<PlannedStep>& run_steps) {
  for (const PlannedStep& s : run_steps) {
    for (const auto& [arg, ref] : s.args) {
      if (SharedIndex(ref.slot) >= 0) plan_.shared[SharedIndex(ref.slot)].run = true;
    }
  }
}

std::string Buffers::Key(int t, const memory::desc& view, const memory::desc& want, const std::string& transform) {
  return "tensor " + std::to_string(t) + " " + DescribeDesc(view) + " -> " + DescribeDesc(want) +
         (transform.empty() ? "" : " " + transform);
}

}  // namespace planning
}  // namespace byoc_hetero
