/*!
 * \file plan/buffers.cc
 * \brief Buffers (see buffers.h).
 */
#include "buffers.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

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
  const PrivateBuffer& whole = plan_.privates[static_cast<size_t>(slice.parent)];
  if (whole.parent >= 0) {  // a slice of a slice: a slice of the buffer that one is in
    slice.parent_offset += whole.parent_offset;
    slice.parent = whole.parent;
  }
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

namespace {

/*!
 * \brief (view, want) with their logical axes permuted alike so that the view's strides decrease:
 *        the same bytes of a tensor laid out the same way, whatever axis order a kernel names them
 *        in.  A dense's matmul views its [N, K] weight as [K, N] with strides (1, K) and asks for
 *        BA16a64b; the inner product views it as plain [N, K] and asks for AB16b64a: one buffer.
 *        A view with blocks of its own (a value stored blocked), or a pair oneDNN cannot
 *        permute, is returned as it is.
 */
std::pair<memory::desc, memory::desc> InViewOrder(const memory::desc& view, const memory::desc& want) {
  // Float weights only: an int8 weight's wanted layout may carry compensation bytes after the
  // weights (extra flags, not in DescribeDesc), which two readers in different axis orders need
  // differently; sharing one buffer between them made MobileNetV3's int8 dense fail in oneDNN.
  const auto f32 = memory::data_type::f32;
  if (view.get_data_type() != f32 || want.get_data_type() != f32 ||
      view.get_format_kind() != memory::format_kind::blocked || view.get_inner_nblks() != 0 ||
      want.get_format_kind() != memory::format_kind::blocked || view.get_ndims() != want.get_ndims()) {
    return {view, want};
  }
  const memory::dims strides = view.get_strides();
  std::vector<int> order(strides.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return strides[a] > strides[b]; });
  std::vector<int> permutation(order.size());  // axis order[j] becomes axis j
  for (size_t j = 0; j < order.size(); ++j) permutation[order[j]] = static_cast<int>(j);
  if (std::is_sorted(order.begin(), order.end())) return {view, want};
  memory::desc v = view.permute_axes(permutation, /*allow_empty=*/true);
  memory::desc w = want.permute_axes(permutation, /*allow_empty=*/true);
  if (v.get_ndims() == 0 || w.get_ndims() == 0) return {view, want};
  return {v, w};
}

}  // namespace

std::string Buffers::Key(int t, const memory::desc& view, const memory::desc& want, const std::string& transform) {
  // A transform reads the view's elements in the view's order: only a relayout is renamed.
  const auto [v, w] = transform.empty() ? InViewOrder(view, want) : std::make_pair(view, want);
  return "tensor " + std::to_string(t) + " " + DescribeDesc(v) + " -> " + DescribeDesc(w) +
         (transform.empty() ? "" : " " + transform);
}

}  // namespace planning
}  // namespace byoc_hetero
