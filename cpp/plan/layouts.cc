/*!
 * \file plan/layouts.cc
 * \brief LayoutResolver (see layouts.h).
 */
#include "layouts.h"

#include <tvm/ffi/error.h>

#include "../kernels/reshape.h"

#include <algorithm>
#include <utility>

namespace byoc_hetero {
namespace planning {

const MemRef* LayoutResolver::FindResolved(int t, const OperandLayout& layout, size_t consumer,
                                           bool init_consumer) const {
  for (const auto& e : resolved_) {
    // Reshapes of one value (BERT's Q/K/V denses each read their own reshape of one layer norm)
    // are the same bytes: one conversion serves them all. Aliased storage is never written in
    // place (a residual sum reuses only unaliased buffers), so the bytes stay that value's.
    // A permute of such a value shares its slot too but reads its elements in another order: a
    // plain [M, K] view of the one is not a view of the other.
    if (values_.SameBytes(t, e.tensor) && e.view == layout.view && e.want == layout.want &&
        e.transform == (layout.transform ? TransformKey(layout, consumer) : layout.transform_name) &&
        (!e.init_only || init_consumer)) {
      return &e.mem;
    }
  }
  return nullptr;
}

std::string LayoutResolver::TransformKey(const OperandLayout& layout, size_t consumer) const {
  std::string key = layout.transform_name;
  for (size_t k : layout.also_reads) key += " with tensor " + std::to_string(g_.nodes[consumer].inputs.at(k));
  return key;
}

MemRef LayoutResolver::ResolveTransformed(int t, const OperandLayout& layout, size_t consumer) {
  // Another tensor computed from the plain value (at __init_ when the value is known then), and from the plain
  // values of the node's inputs also_reads names (constants too where the first is one: the step runs once).
  const bool at_init = values_[t].is_const;
  const MemRef src = Resolve(t, {layout.view, layout.view}, consumer, /*init_consumer=*/at_init);
  const std::string name = TransformKey(layout, consumer);
  Step step;
  step.args = {{0, src}};
  for (size_t k : layout.also_reads) {
    const int other = g_.nodes[consumer].inputs.at(k);
    if (values_[other].is_const != at_init) {
      TVM_FFI_THROW(InternalError) << g_.where(consumer) << ": a transform of tensor " << t << " ("
                                   << (at_init ? "known" : "unknown") << " at __init_) reads tensor " << other << " ("
                                   << (at_init ? "unknown" : "known") << " then): expected both known or both not";
    }
    const memory::desc plain = values_[other].plain_md;
    step.args.emplace_back(static_cast<int>(step.args.size()),
                           Resolve(other, {plain, plain}, consumer, /*init_consumer=*/at_init));
  }
  const MemRef result{layout.want, buffers_.Own(at_init, layout.want, Buffers::Key(t, layout.view, layout.want, name))};
  step.args.emplace_back(static_cast<int>(step.args.size()), result);  // last: the plan names it the output
  step.host = layout.transform;
  step.label = g_.where(consumer) + ": " + layout.transform_name + " from tensor " + std::to_string(t);
  for (size_t k : layout.also_reads) step.label += " and tensor " + std::to_string(g_.nodes[consumer].inputs.at(k));
  programs_.Add(at_init, std::move(step), result.slot);
  resolved_.push_back({t, layout.view, layout.want, name, result, false});
  return result;
}

MemRef LayoutResolver::InLayout(const MemRef& src, const memory::desc& want, bool at_init, const std::string& key,
                                const std::string& label) {
  if (want == src.md) return src;
  const MemRef result{want, buffers_.Own(at_init, want, key)};
  programs_.AddReorder(at_init, src, result, label);
  return result;
}

MemRef LayoutResolver::ResolveConstant(int t, const OperandLayout& layout, const std::string& label,
                                       bool init_consumer, bool* init_only) {
  const MemRef src{layout.view, values_[t].storage};
  if (init_consumer && layout.want == layout.view) {
    *init_only = true;
    return src;  // read in place during __init_
  }
  if (layout.want == layout.view) return {layout.view, buffers_.Constant(t)};  // read in place by the run program
  return InLayout(src, layout.want, /*at_init=*/true, Buffers::Key(t, layout.view, layout.want), label);
}

MemRef LayoutResolver::Resolve(int t, const OperandLayout& layout, size_t consumer, bool init_consumer) {
  if (const MemRef* found = FindResolved(t, layout, consumer, init_consumer)) return *found;
  if (layout.transform) return ResolveTransformed(t, layout, consumer);
  ValueState& v = values_[t];
  const bool at_init = v.is_const;
  const std::string label = g_.where(consumer) + ": reorder of tensor " + std::to_string(t) + " " +
                            DescribeDesc(layout.view) + " -> " + DescribeDesc(layout.want);
  if (layout.view.get_size() != v.plain_md.get_size()) {
    TVM_FFI_THROW(InternalError) << g_.where(consumer) << ": kernel views tensor " << t << " as "
                                 << DescribeDesc(layout.view) << ", which does not cover its "
                                 << DescribeDesc(v.plain_md);
  }
  const std::string key = Buffers::Key(t, layout.view, layout.want);
  MemRef result;
  bool init_only = false;
  if (g_.roles[t] == TensorRole::kConstant) {
    result = ResolveConstant(t, layout, label, init_consumer, &init_only);
  } else if (layout.view == v.plain_md && layout.want == v.storage_md) {
    result = {v.storage_md, v.storage};  // zero-copy
  } else if (layout.view == v.plain_md && v.plain < 0) {
    result = InLayout({v.storage_md, v.storage}, layout.want, at_init, key, label);  // blocked -> other layout
  } else if (v.plain < 0 && v.storage_md == WithType(v.plain_md, memory::data_type::bf16) &&
             layout.view.get_data_type() == memory::data_type::f32) {
    // Plain bf16 bytes read through another view (a dense's [M, K], a matmul's strides): the
    // same view over the bf16 bytes, no f32 copy.
    result = InLayout({WithType(layout.view, memory::data_type::bf16), v.storage}, layout.want, at_init, key, label);
  } else {
    if (v.plain < 0) {
      // The consumer reads the bytes differently (e.g. flattened): materialize plain bytes.
      v.plain = buffers_.Own(at_init, v.plain_md, Buffers::Key(t, v.storage_md, v.plain_md));
      programs_.AddReorder(at_init, {v.storage_md, v.storage}, {v.plain_md, v.plain},
                           g_.where(consumer) + ": plain copy of tensor " + std::to_string(t));
    }
    result = InLayout({layout.view, v.plain}, layout.want, at_init, key, label);
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
  const int out_pos = values_.OutputPosition(t);
  if (out_pos >= 0) {
    const int user = buffers_.OutputArg(static_cast<size_t>(out_pos));
    v.plain = user;
    if (layout.want == layout.view) {
      v.storage = user;  // the kernel writes straight into the caller's buffer
    } else {
      v.storage = reuse >= 0 ? reuse : buffers_.Own(false, layout.want, "");
      trailing->push_back(programs_.MakeReorder({layout.want, v.storage}, {layout.view, user},
                                                g_.where(n) + ": output tensor " + std::to_string(t) + " " +
                                                    DescribeDesc(layout.want) + " -> plain"));
    }
  } else {
    v.storage = reuse >= 0 ? reuse : buffers_.Own(at_init, layout.want, Buffers::Key(t, layout.view, layout.want));
    if (layout.want == layout.view) v.plain = v.storage;
  }
  return {layout.want, v.storage};
}

void LayoutResolver::Alias(size_t n, const Kernel& kernel) {
  const NodeInfo& node = g_.nodes[n];
  const int t_out = node.output;
  const size_t k = static_cast<size_t>(kernel.alias_input());
  const int t_in = node.inputs[k];
  OperandLayout in_layout = kernel.inputs()[k];
  const bool bf16 = values_[t_in].storage_md.get_data_type() == memory::data_type::bf16 &&
                    in_layout.view.get_data_type() == memory::data_type::f32;
  if (bf16) in_layout.want = WithType(in_layout.view, memory::data_type::bf16);
  if (!bf16 && ViewWithoutCopy(t_in, t_out)) return;
  // Plain bytes of the input that outlive __init_ (never a constant's own data).
  const MemRef src = Resolve(t_in, in_layout, n, /*init_consumer=*/false);
  ValueState& v = values_[t_out];
  v.is_const = values_[t_in].is_const;
  v.plain_md = v.storage_md = kernel.output().view;
  if (bf16) v.storage_md = WithType(v.plain_md, memory::data_type::bf16);
  const int out_pos = values_.OutputPosition(t_out);
  if (out_pos >= 0) {
    const int user = buffers_.OutputArg(static_cast<size_t>(out_pos));
    programs_.AddReorder(false, {v.storage_md, src.slot}, {kernel.output().view, user},
                         g_.where(n) + ": output tensor " + std::to_string(t_out) + " copied out");
    v.storage = v.plain = user;
    v.storage_md = v.plain_md;
  } else {
    v.storage = src.slot;
    v.plain = bf16 ? -1 : src.slot;
    v.aliased = values_[t_in].aliased = true;
    v.order = values_.OrderOf(t_in);
  }
}

bool LayoutResolver::ViewWithoutCopy(int t_in, int t_out) {
  ValueState& in = values_[t_in];
  if (in.is_const || in.plain >= 0 || values_.OutputPosition(t_out) >= 0) return false;
  const memory::desc md = ReshapedView(in.storage_md, PlainDescOf(g_.tensors[t_out]).get_dims());
  if (md.is_zero()) return false;
  ValueState& v = values_[t_out];
  v.is_const = false;
  v.plain_md = PlainDescOf(g_.tensors[t_out]);
  v.storage_md = md;
  v.storage = in.storage;
  v.plain = md == v.plain_md ? in.storage : -1;
  v.aliased = in.aliased = true;
  v.order = values_.OrderOf(t_in);
  return true;
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
  const int out_pos = values_.OutputPosition(t_out);
  if (out_pos >= 0) {
    const int user = buffers_.OutputArg(static_cast<size_t>(out_pos));
    programs_.AddReorder(false, {md, src.slot}, {v.plain_md, user},
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

bool LayoutResolver::ReadersTakeStrides(int t) const {
  if (values_.OutputPosition(t) >= 0) return false;
  bool read = false;
  for (size_t m = 0; m < g_.nodes.size(); ++m) {
    const NodeInfo& node = g_.nodes[m];
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      if (node.inputs[k] != t) continue;
      read = true;
      const StridedRead how = FindKernelTraits(node.op).StridedInput(node, k);
      if (how == StridedRead::kPassesOn ? !ReadersTakeStrides(node.output)
                                        : how != StridedRead::kInPlace || NodeComputesBf16(g_, m)) {
        return false;
      }
    }
  }
  return read;
}

bool LayoutResolver::SliceView(size_t n, const Kernel& kernel) {
  if (!StridedReadsOn()) return false;  // opt-in: BYOC_HETERO_SLICE_VIEWS=on (layouts.h)
  const NodeInfo& node = g_.nodes[n];
  const int t_in = node.inputs[0], t_out = node.output;
  const ValueState& in = values_[t_in];
  const memory::desc in_plain = PlainDescOf(g_.tensors[t_in]);
  const memory::dims in_dims = in_plain.get_dims();
  // the input's bytes under its own dims: its storage, or its row-major plain bytes (a dense's [B*S, N])
  const bool own_dims = in.storage_md.get_dims() == in_dims;
  const memory::desc md = own_dims ? in.storage_md : in_plain;
  const int slot = own_dims ? in.storage : in.plain_md == PlainDesc(in.plain_md.get_dims()) ? in.plain : -1;
  if (in.is_const || !PrivateF32(t_out) || slot < 0 || !buffers_.IsPrivate(slot) ||
      md.get_data_type() != memory::data_type::f32 || md.get_format_kind() != memory::format_kind::blocked ||
      md.get_inner_nblks() != 0 || md.get_submemory_offset() != 0 || md.get_dims() != in_dims ||
      md.get_padded_dims() != in_dims || !ReadersTakeStrides(t_out)) {
    return false;
  }
  const Kernel::Box& box = kernel.view_box();
  const memory::dims in_strides = md.get_strides();
  const memory::dims out_dims = PlainDescOf(g_.tensors[t_out]).get_dims();
  if (box.begin.size() != in_dims.size() || box.steps.size() != in_dims.size() || out_dims.size() != in_dims.size()) {
    return false;
  }
  memory::dims strides(in_dims.size());
  int64_t first = 0;  // the box's first element, in elements from the buffer's start
  for (size_t d = 0; d < in_dims.size(); ++d) {
    first += box.begin[d] * in_strides[d];
    strides[d] = box.steps[d] * in_strides[d];
  }
  const memory::desc view = StridedDesc(out_dims, strides);
  ValueState& v = values_[t_out];
  v.is_const = false;
  v.plain_md = PlainDescOf(g_.tensors[t_out]);
  v.storage_md = view;
  v.storage = buffers_.Slice(slot, view.get_size(), static_cast<size_t>(first) * sizeof(float));
  v.plain = view == v.plain_md ? v.storage : -1;
  values_.NoteSubSlot(v.storage, slot);
  v.aliased = values_[t_in].aliased = true;
  return true;
}

namespace {

/*! \brief The node that reads tensor \p t, where exactly one node reads it, once; else g.nodes.size(). */
size_t SoleReader(const RegionGraph& g, int t) {
  size_t reader = g.nodes.size();
  for (size_t m = 0; m < g.nodes.size(); ++m) {
    const std::vector<int>& in = g.nodes[m].inputs;
    const auto reads = std::count(in.begin(), in.end(), t);
    if (reads == 0) continue;
    if (reads > 1 || reader != g.nodes.size()) return g.nodes.size();  // read twice, or by two nodes
    reader = m;
  }
  return reader;
}

}  // namespace

bool LayoutResolver::PrivateF32(int t) const {
  return !g_.tensors[t].shape.empty() && values_.OutputPosition(t) < 0 && g_.tensors[t].dtype == DType::kFloat32;
}

memory::desc LayoutResolver::PermutedOutputLayout(size_t n) const {
  const int t = g_.nodes[n].output;
  if (!PrivateF32(t)) return memory::desc();
  size_t reader = SoleReader(g_, t);
  int permuted = t;  // the tensor the permute reads: t, or the last of a chain of reshapes of t
  while (reader < g_.nodes.size() && g_.nodes[reader].op == "reshape") {
    permuted = g_.nodes[reader].output;
    if (!PrivateF32(permuted)) return memory::desc();
    reader = SoleReader(g_, permuted);
  }
  if (reader == g_.nodes.size() || g_.nodes[reader].op != "permute") return memory::desc();
  const std::vector<int64_t>& dims = g_.tensors[permuted].shape;
  AttrReader attrs(g_, reader);
  const std::vector<int64_t> axes = attrs.Ints("axes", dims.size(), {});
  memory::dims out_dims(dims.size());
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || axes[i] >= static_cast<int64_t>(dims.size())) return memory::desc();
    out_dims[i] = dims[static_cast<size_t>(axes[i])];
  }
  // element [axes[0], axes[1], ...] of the permute's input lies where its row-major result puts it
  const memory::dims rows = PlainDesc(out_dims).get_strides();
  memory::dims strides(dims.size(), -1);
  for (size_t i = 0; i < axes.size(); ++i) strides[static_cast<size_t>(axes[i])] = rows[i];
  if (std::count(strides.begin(), strides.end(), -1) > 0) return memory::desc();  // not a permutation
  const memory::desc md = StridedDesc(memory::dims(dims.begin(), dims.end()), strides);
  if (permuted == t) return md;
  // Through the reshape: under the reshape's dims where it only splits t's leading dims (a matmul
  // splits its batch dims to write them: [B, heads, N, d] under acbd, the layout oneDNN's brgemm
  // matmul writes; the reshape is then a view, ViewWithoutCopy), else under t's own dims where
  // strides can say it (a 3-D [heads, N, d] under bac took oneDNN's gemm matmul instead of brgemm).
  const std::vector<int64_t>& own = g_.tensors[t].shape;
  const bool splits_leading = dims.size() > own.size() && own.size() >= 2 &&
                              std::equal(own.end() - 2, own.end(), dims.end() - 2);
  if (splits_leading) return md;
  const memory::desc as_own = ReshapedView(md, memory::dims(own.begin(), own.end()));
  return as_own.is_zero() ? md : as_own;
}

}  // namespace planning
}  // namespace byoc_hetero
