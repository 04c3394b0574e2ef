/*!
 * \file plan/builder.cc
 * \brief PlanBuilder (see builder.h): slots, buffers, reorders and host copies.
 */
#include "builder.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

namespace byoc_hetero {
namespace planning {

int PlanBuilder::OwnSlot(bool at_init, const memory::desc& md, const std::string& key) {
  if (at_init) {
    for (size_t s = 0; s < plan_.slots.size(); ++s) {
      const Slot& slot = plan_.slots[s];
      if (slot.kind == SlotKind::kShared && plan_.shared[slot.index].key == key) return static_cast<int>(s);
    }
    plan_.shared.push_back({md.get_size(), key, node_where_});
    return NewSlot(SlotKind::kShared, plan_.shared.size() - 1);
  }
  size_t numel = 1;
  for (auto d : md.get_dims()) numel *= static_cast<size_t>(d);
  plan_.privates.push_back({md.get_size(), md.get_size() != numel * memory::data_type_size(md.get_data_type())});
  return NewSlot(SlotKind::kPrivate, plan_.privates.size() - 1);
}

int PlanBuilder::ConstantSlot(int t) {
  size_t c = 0;
  while (c < g_.constants.size() && g_.constants[c].tensor != t) ++c;
  if (c == g_.constants.size()) {
    TVM_FFI_THROW(InternalError) << node_where_ << ": tensor " << t << " is no constant of the region";
  }
  const std::string key = "constant " + std::to_string(c);
  for (size_t s = 0; s < plan_.slots.size(); ++s) {
    const Slot& slot = plan_.slots[s];
    if (slot.kind == SlotKind::kShared && plan_.shared[slot.index].key == key) return static_cast<int>(s);
  }
  SharedBuffer b{PlainDescOf(g_.tensors[t]).get_size(), key, node_where_};
  b.constant = static_cast<int>(c);
  plan_.shared.push_back(std::move(b));
  return NewSlot(SlotKind::kShared, plan_.shared.size() - 1);
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
  if (view.get_format_kind() != memory::format_kind::blocked || view.get_inner_nblks() != 0 ||
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

std::string PlanBuilder::Key(int t, const memory::desc& view, const memory::desc& want,
                             const std::string& transform) {
  // A transform reads the view's elements in the view's order: only a relayout is renamed.
  const auto [v, w] = transform.empty() ? InViewOrder(view, want) : std::make_pair(view, want);
  return "tensor " + std::to_string(t) + " " + DescribeDesc(v) + " -> " + DescribeDesc(w) +
         (transform.empty() ? "" : " " + transform);
}

Step PlanBuilder::MakeReorder(const MemRef& src, const MemRef& dst, const std::string& label) {
  const memory::data_type dt = src.md.get_data_type();
  // u8 / s8 bytes: oneDNN reorders them (an int8 weight into its blocked layout with the
  // compensation the int8 conv reads; activations between layouts)
  const bool int8 = dt == memory::data_type::u8 || dt == memory::data_type::s8;
  if (dt != memory::data_type::f32 && dt != memory::data_type::bf16 && !(int8 && dst.md.get_data_type() == dt)) {
    // int64 / int32 / bool bytes (f64 / s32 / u8 descriptors, PlainDescOf): oneDNN 3.2 has no
    // reorder for f64 (an int64 constant failed to plan with "unimplemented"), and a value
    // conversion is never wanted here: the bytes are copied as they are, on the host.
    return MakeHostCopy(src, dst, label);
  }
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  Step step;
  step.label = label;
  step.pd = GuardDnnl(label, "create a reorder", [&] {
    return dnnl::reorder::primitive_desc(engine_, src.md, engine_, dst.md, attr);
  });
  step.args = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  return step;
}

Step PlanBuilder::MakeHostCopy(const MemRef& src, const MemRef& dst, const std::string& label) {
  const memory::desc& s = src.md;
  const memory::desc& d = dst.md;
  if (s.get_data_type() != d.get_data_type() || s.get_dims() != d.get_dims() ||
      s.get_format_kind() != memory::format_kind::blocked || d.get_format_kind() != memory::format_kind::blocked ||
      s.get_inner_nblks() != 0 || d.get_inner_nblks() != 0) {
    TVM_FFI_THROW(InternalError) << label << ": a copy of integer/bool bytes needs two plain strided "
                                 << "descriptors of one type and shape, got " << DescribeDesc(s) << " -> "
                                 << DescribeDesc(d);
  }
  const size_t esize = memory::data_type_size(s.get_data_type());
  const memory::dims dims = s.get_dims();
  const memory::dims ss = s.get_strides();
  const memory::dims ds = d.get_strides();
  const int64_t s_off = s.get_submemory_offset();
  const int64_t d_off = d.get_submemory_offset();
  int64_t numel = 1;
  for (auto x : dims) numel *= x;
  // Dense row-major on both sides: one memcpy.
  bool dense = true;
  int64_t expect = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i] != 1 && (ss[i] != expect || ds[i] != expect)) dense = false;
    expect *= dims[i];
  }
  Step step;
  step.label = label;
  step.args = {{0, src}, {1, dst}};
  step.host = [=](const std::vector<void*>& ptrs) {
    const char* from = static_cast<const char*>(ptrs[0]) + s_off * esize;
    char* to = static_cast<char*>(ptrs[1]) + d_off * esize;
    if (numel == 0) return;
    if (dense) {
      std::memcpy(to, from, static_cast<size_t>(numel) * esize);
      return;
    }
    std::vector<int64_t> idx(dims.size(), 0);
    for (int64_t e = 0; e < numel; ++e) {
      int64_t so = 0, dof = 0;
      for (size_t i = 0; i < dims.size(); ++i) {
        so += idx[i] * ss[i];
        dof += idx[i] * ds[i];
      }
      std::memcpy(to + dof * esize, from + so * esize, esize);
      for (size_t i = dims.size(); i-- > 0;) {
        if (++idx[i] < dims[i]) break;
        idx[i] = 0;
      }
    }
  };
  return step;
}

}  // namespace planning
}  // namespace byoc_hetero
