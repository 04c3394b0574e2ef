/*!
 * \file plan/layouts.cc
 * \brief LayoutResolver (see layouts.h).
 */
#include "layouts.h"

#include <tvm/ffi/error.h>

#include <utility>

namespace byoc_hetero {
namespace planning {

const MemRef* LayoutResolver::FindResolved(int t, const OperandLayout& layout, bool init_consumer) const {
  for (const auto& e : resolved_) {
    // Reshapes of one value (BERT's Q/K/V denses each read their own reshape of one layer norm)
    // are the same bytes: one conversion serves them all. Aliased storage is never written in
    // place (a residual sum reuses only unaliased buffers), so the bytes stay that value's.
    // A permute of such a value shares its slot too but reads its elements in another order: a
    // plain [M, K] view of the one is not a view of the other.
    const bool same_bytes = e.tensor == t || (values_[t].aliased && values_[e.tensor].aliased &&
                                              values_[t].storage == values_[e.tensor].storage &&
                                              OrderOf(t) == OrderOf(e.tensor));
    if (same_bytes && e.view == layout.view && e.want == layout.want &&
        e.transform == layout.transform_name && (!e.init_only || init_consumer)) {
      return &e.mem;
    }
  }
  return nullptr;
}

MemRef LayoutResolver::Resolve(int t, const OperandLayout& layout, size_t consumer, bool init_consumer) {
  if (const MemRef* found = FindResolved(t, layout, init_consumer)) return *found;
  ValueState& v = values_[t];
  const bool at_init = v.is_const;
  if (layout.transform) {
    // Another tensor computed from the plain value (at __init_ when the value is known then).
    const MemRef src = Resolve(t, {layout.view, layout.view}, consumer, /*init_consumer=*/at_init);
    const MemRef result{layout.want,
                        OwnSlot(at_init, layout.want, Key(t, layout.view, layout.want, layout.transform_name))};
    Step step;
    step.host = layout.transform;
    step.label = g_.where(consumer) + ": " + layout.transform_name + " from tensor " + std::to_string(t);
    step.args = {{0, src}, {1, result}};
    Add(at_init, std::move(step), result.slot);
    resolved_.push_back({t, layout.view, layout.want, layout.transform_name, result, false});
    return result;
  }
  const std::string label = g_.where(consumer) + ": reorder of tensor " + std::to_string(t) + " " +
                            DescribeDesc(layout.view) + " -> " + DescribeDesc(layout.want);
  if (layout.view.get_size() != v.plain_md.get_size()) {
    TVM_FFI_THROW(InternalError) << g_.where(consumer) << ": kernel views tensor " << t << " as "
                                 << DescribeDesc(layout.view) << ", which does not cover its "
                                 << DescribeDesc(v.plain_md);
  }
  const std::string key = Key(t, layout.view, layout.want);
  MemRef result;
  bool init_only = false;
  if (g_.roles[t] == TensorRole::kConstant) {
    const MemRef src{layout.view, v.storage};
    if (init_consumer && layout.want == layout.view) {
      result = src;  // read in place during __init_
      init_only = true;
    } else if (layout.want == layout.view) {
      result = {layout.view, ConstantSlot(t)};  // read in place by the run program: no copy
    } else {
      result = {layout.want, OwnSlot(true, layout.want, key)};
      AddReorder(true, src, result, label);
    }
  } else if (layout.view == v.plain_md && layout.want == v.storage_md) {
    result = {v.storage_md, v.storage};  // zero-copy
  } else if (layout.view == v.plain_md && v.plain < 0) {
    result = {layout.want, OwnSlot(at_init, layout.want, key)};  // blocked -> other layout
    AddReorder(at_init, {v.storage_md, v.storage}, result, label);
  } else if (v.plain < 0 && v.storage_md == WithType(v.plain_md, memory::data_type::bf16) &&
             layout.view.get_data_type() == memory::data_type::f32) {
    // Plain bf16 bytes read through another view (a dense's [M, K], a matmul's strides): the
    // same view over the bf16 bytes, no f32 copy.
    const MemRef src{WithType(layout.view, memory::data_type::bf16), v.storage};
    if (layout.want == src.md) {
      result = src;
    } else {
      result = {layout.want, OwnSlot(at_init, layout.want, key)};
      AddReorder(at_init, src, result, label);
    }
  } else {
    if (v.plain < 0) {
      // The consumer reads the bytes differently (e.g. flattened): materialize plain bytes.
      v.plain = OwnSlot(at_init, v.plain_md, Key(t, v.storage_md, v.plain_md));
      AddReorder(at_init, {v.storage_md, v.storage}, {v.plain_md, v.plain},
                 g_.where(consumer) + ": plain copy of tensor " + std::to_string(t));
    }
    const MemRef src{layout.view, v.plain};
    if (layout.want == layout.view) {
      result = src;
    } else {
      result = {layout.want, OwnSlot(at_init, layout.want, key)};
      AddReorder(at_init, src, result, label);
    }
  }
  resolved_.push_back({t, layout.view, layout.want, "", result, init_only});
  return result;
}

MemRef LayoutResolver::DefineOutput(size_t n, const OperandLayout& layout, bool at_init, int reuse,
                                    std::vector<Step>* trailing) {
  const int t = g_.nodes[n].output;
  ValueState& v = values_[t];
  const memory::desc tensor_plain = PlainDescOf(g_.tensors[t]);
  if (layout.view.get_size() != tensor_plain.get_size()) {
    TVM_FFI_THROW(InternalError) << g_.where(n) << ": kernel output view " << DescribeDesc(layout.view)
                                 << " does not cover tensor " << t;
  }
  v.is_const = at_init;
  v.plain_md = layout.view;
  v.storage_md = layout.want;
  const int out_pos = OutputPosition(t);
  if (out_pos >= 0) {
    const int user = run_arg_slot_[g_.inputs.size() + out_pos];
    v.plain = user;
    if (layout.want == layout.view) {
      v.storage = user;  // the kernel writes straight into the caller's buffer
    } else {
      v.storage = reuse >= 0 ? reuse : OwnSlot(false, layout.want, "");
      trailing->push_back(MakeReorder({layout.want, v.storage}, {layout.view, user},
                                      g_.where(n) + ": output tensor " + std::to_string(t) + " " +
                                          DescribeDesc(layout.want) + " -> plain"));
    }
  } else {
    v.storage = reuse >= 0 ? reuse : OwnSlot(at_init, layout.want, Key(t, layout.view, layout.want));
    if (layout.want == layout.view) v.plain = v.storage;
  }
  return {layout.want, v.storage};
}

bool LayoutResolver::Relabel(size_t n, const Kernel& kernel) {
  const NodeInfo& node = g_.nodes[n];
  const int t_in = node.inputs[0], t_out = node.output;
  ValueState& in = values_[t_in];
  const memory::desc in_plain = PlainDescOf(g_.tensors[t_in]);
  if (in.is_const || in_plain.get_data_type() != memory::data_type::f32) return false;
  MemRef src;
  if (in.storage_md.get_dims() == in_plain.get_dims() &&
      in.storage_md.get_format_kind() == memory::format_kind::blocked) {
    src = {in.storage_md, in.storage};
  } else if (in.plain >= 0 && in.plain_md == PlainDesc(in.plain_md.get_dims())) {
    src = {in_plain, in.plain};  // row-major bytes, read under the tensor's own dims
  } else {
    return false;
  }
  const std::vector<int64_t>& axes = kernel.relabel_axes();
  std::vector<int> perm(axes.size());  // oneDNN's: input dim i becomes output dim perm[i]
  for (size_t i = 0; i < axes.size(); ++i) perm[static_cast<size_t>(axes[i])] = static_cast<int>(i);
  const memory::desc md = src.md.permute_axes(perm, /*allow_empty=*/true);
  if (md.get_ndims() == 0) return false;
  ValueState& v = values_[t_out];
  v.is_const = false;
  v.plain_md = kernel.output().view;
  const int out_pos = OutputPosition(t_out);
  if (out_pos >= 0) {
    const int user = run_arg_slot_[g_.inputs.size() + out_pos];
    AddReorder(false, {md, src.slot}, {v.plain_md, user},
               g_.where(n) + ": output tensor " + std::to_string(t_out) + " " + DescribeDesc(md) + " -> plain");
    v.storage_md = v.plain_md;
    v.storage = v.plain = user;
    return true;
  }
  v.storage_md = md;
  v.storage = src.slot;
  v.plain = md == v.plain_md ? src.slot : -1;
  v.aliased = in.aliased = true;
  return true;
}

bool LayoutResolver::SlotDiesAt(int slot, size_t n) const {
  for (const ValueState& v : values_) {
    if ((v.storage == slot || v.plain == slot) && (v.region_output || v.last_use > static_cast<int>(n))) {
      return false;
    }
  }
  return true;
}

}  // namespace planning
}  // namespace byoc_hetero
