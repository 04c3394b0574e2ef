/*!
 * \file plan/concat_in_place.cc
 * \brief ConcatInPlace (see concat_in_place.h).
 */
#include "concat_in_place.h"

#include <algorithm>
#include <string>
#include <vector>

namespace byoc_hetero {
namespace planning {

void ConcatInPlace::FindConcatSlices() {
  std::vector<int> reads(g_.tensors.size(), 0);
  for (const NodeInfo& node : g_.nodes) {
    for (int t : node.inputs) ++reads[t];
  }
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    const NodeInfo& node = g_.nodes[n];
    if (values_[node.output].region_output) continue;
    const std::optional<int64_t> axis = FindKernelTraits(node.op).JoinAxis(node);  // a concat's
    const std::vector<int64_t>& out_shape = g_.tensors[node.output].shape;
    const int64_t rank = static_cast<int64_t>(out_shape.size());
    if (!axis || *axis < 0 || *axis >= rank || g_.tensors[node.output].dtype != DType::kFloat32) continue;
    bool leading_ones = true;
    for (int64_t d = 0; d < *axis; ++d) leading_ones = leading_ones && out_shape[d] == 1;
    if (!leading_ones) continue;
    int64_t offset = 0;
    for (int t : node.inputs) {
      const std::vector<int64_t>& shape = g_.tensors[t].shape;
      if (static_cast<int64_t>(shape.size()) != rank) break;  // the kernel rejects it
      if (g_.roles[t] == TensorRole::kNodeOutput && reads[t] == 1 && !values_[t].region_output) {
        slice_targets_[t] = {n, offset};
      }
      offset += shape[*axis];
    }
    concat_axis_[n] = *axis;
  }
  FindConcatFamilies(reads);
}

void ConcatInPlace::FindConcatFamilies(const std::vector<int>& reads) {
  std::vector<size_t> order;  // longest first: each concat joins the first root that starts with its inputs
  for (const auto& entry : concat_axis_) order.push_back(entry.first);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return g_.nodes[a].inputs.size() > g_.nodes[b].inputs.size(); });
  std::map<size_t, std::vector<size_t>> families;  // root -> its members, root included
  for (size_t n : order) {
    const std::vector<int>& ins = g_.nodes[n].inputs;
    for (auto& [root, members] : families) {
      const std::vector<int>& root_ins = g_.nodes[root].inputs;
      if (concat_axis_.at(root) == concat_axis_.at(n) && ins.size() < root_ins.size() &&
          std::equal(ins.begin(), ins.end(), root_ins.begin())) {
        family_root_[n] = root;
        members.push_back(n);
        break;
      }
    }
    if (family_root_.count(n) == 0) families[n] = {n};
  }
  for (const auto& [root, members] : families) {
    if (members.size() < 2) continue;  // a lone concat: its producers decide (WriteIntoConcat)
    const NodeInfo& node = g_.nodes[root];
    const int64_t axis = concat_axis_.at(root);
    const std::vector<int64_t>& out_shape = g_.tensors[node.output].shape;
    SliceLayout kind = SliceLayout::kPlain;
    if (axis == 1 && out_shape.size() == 4) {
      for (const auto& [block, layout] : {std::pair{16, SliceLayout::kBlocked16}, std::pair{8, SliceLayout::kBlocked8}}) {
        bool whole = true;
        for (int t : node.inputs) whole = whole && g_.tensors[t].shape.size() == 4 && g_.tensors[t].shape[1] % block == 0;
        if (whole) {
          kind = layout;
          break;
        }
      }
    }
    const memory::desc md = SliceLayoutDesc(memory::dims(out_shape.begin(), out_shape.end()), kind);
    concat_out_.emplace(root, ConcatBuffer{md, kind, buffers_.Own(false, md, "")});
    std::map<int, int> family_reads;
    for (size_t c : members) {
      for (int t : g_.nodes[c].inputs) ++family_reads[t];
    }
    int64_t offset = 0;
    for (int t : node.inputs) {
      const bool once = std::count(node.inputs.begin(), node.inputs.end(), t) == 1;
      if (g_.roles[t] == TensorRole::kNodeOutput && !values_[t].region_output && once &&
          reads[t] == family_reads[t]) {
        slice_targets_[t] = {root, offset};
      }
      offset += g_.tensors[t].shape[axis];
    }
  }
}

memory::desc ConcatInPlace::ConcatSliceLayout(size_t n) const {
  const int t = g_.nodes[n].output;
  const auto target = slice_targets_.find(t);
  if (target == slice_targets_.end()) return {};
  const auto buffer = concat_out_.find(target->second.concat);
  if (buffer == concat_out_.end()) return {};
  const std::vector<int64_t>& shape = g_.tensors[t].shape;
  // a family's buffer is blocked only where every input is whole blocks (FindConcatFamilies)
  return SliceOf(buffer->second, memory::dims(shape.begin(), shape.end()), concat_axis_.at(target->second.concat),
                 target->second.offset).md;
}

bool ConcatInPlace::ClaimChannelsLast(size_t n, const OperandLayout& layout) {
  const int t = g_.nodes[n].output;
  const auto target = slice_targets_.find(t);
  if (target == slice_targets_.end()) return false;
  const size_t c = target->second.concat;
  const std::vector<int64_t>& out_shape = g_.tensors[g_.nodes[c].output].shape;
  const std::vector<int64_t>& shape = g_.tensors[t].shape;
  const memory::dims dims(shape.begin(), shape.end());
  if (concat_out_.count(c) != 0 || family_root_.count(c) != 0 || concat_axis_.at(c) != 1 || out_shape.size() != 4 ||
      layout.want != memory::desc(dims, memory::data_type::f32, memory::format_tag::acdb)) {
    return false;
  }
  const memory::desc md(memory::dims(out_shape.begin(), out_shape.end()), memory::data_type::f32,
                        memory::format_tag::acdb);
  concat_out_.emplace(c, ConcatBuffer{md, SliceLayout::kChannelsLast, buffers_.Own(false, md, "")});
  return true;
}

ConcatInPlace::Run ConcatInPlace::SliceOf(const ConcatBuffer& buffer, const memory::dims& dims, int64_t axis,
                                          int64_t offset) {
  const size_t at_channel = static_cast<size_t>(offset) * sizeof(float);
  if (buffer.layout == SliceLayout::kChannelsLast) {  // the buffer's strides; channels are innermost
    // its elements span from its first channel to the buffer's end (oneDNN's size of a strided
    // desc counts from the base as if the outermost stride were whole)
    return {memory::desc(dims, memory::data_type::f32, buffer.md.get_strides()), at_channel,
            buffer.md.get_size() - at_channel};
  }
  const memory::dims out = buffer.md.get_dims();
  int64_t inner = 1;  // elements per unit of the axis (the leading dims are 1)
  for (size_t d = static_cast<size_t>(axis) + 1; d < out.size(); ++d) inner *= out[d];
  const memory::desc md = SliceLayoutDesc(dims, buffer.layout);
  return {md, static_cast<size_t>(offset * inner) * sizeof(float), md.get_size()};
}

bool ConcatInPlace::IsConcatStorage(int slot) const {
  if (buffers_.IsSlice(slot)) return true;
  for (const auto& member : family_root_) {
    if (concat_out_.at(member.second).slot == slot) return true;
  }
  return false;
}

std::optional<ConcatInPlace::SliceLayout> ConcatInPlace::SliceLayoutOf(const memory::desc& md, int64_t axis) {
  if (md.get_data_type() != memory::data_type::f32 || md.get_format_kind() != memory::format_kind::blocked) {
    return std::nullopt;
  }
  if (md == PlainDesc(md.get_dims())) return SliceLayout::kPlain;
  if (axis != 1) return std::nullopt;  // channel blocks slice contiguously along the channels only
  const std::optional<memory::format_tag> tag = ChannelBlockedTag(md);
  if (!tag) return std::nullopt;
  return *tag == memory::format_tag::aBcd8b ? SliceLayout::kBlocked8 : SliceLayout::kBlocked16;
}

memory::desc ConcatInPlace::SliceLayoutDesc(const memory::dims& dims, SliceLayout layout) {
  switch (layout) {
    case SliceLayout::kBlocked8:
      return memory::desc(dims, memory::data_type::f32, memory::format_tag::aBcd8b);
    case SliceLayout::kBlocked16:
      return memory::desc(dims, memory::data_type::f32, memory::format_tag::aBcd16b);
    default:
      return PlainDesc(dims);
  }
}

bool ConcatInPlace::WriteIntoConcat(size_t n, const OperandLayout& layout, MemRef* out) {
  const int t = g_.nodes[n].output;
  auto target = slice_targets_.find(t);
  if (target == slice_targets_.end()) return false;
  const size_t c = target->second.concat;
  const int64_t axis = concat_axis_.at(c);
  const std::vector<int64_t>& shape = g_.tensors[t].shape;
  const memory::dims dims(shape.begin(), shape.end());
  auto found = concat_out_.find(c);
  if (found != concat_out_.end() && found->second.layout == SliceLayout::kChannelsLast) {
    // the kernel writes its strided run of the channels-last buffer (ClaimChannelsLast), or nothing in place
    const Run run = SliceOf(found->second, dims, axis, target->second.offset);
    if (layout.want != run.md) return false;
    PlaceInConcat(t, layout, buffers_.Slice(found->second.slot, run.bytes, run.offset), out);
    return true;
  }
  const std::optional<SliceLayout> kind = SliceLayoutOf(layout.want, axis);
  if (!kind) return false;
  const NodeInfo& concat = g_.nodes[c];
  const std::vector<int64_t>& out_shape = g_.tensors[concat.output].shape;
  const memory::dims out_dims(out_shape.begin(), out_shape.end());
  const int64_t block = *kind == SliceLayout::kBlocked8 ? 8 : *kind == SliceLayout::kBlocked16 ? 16 : 1;
  auto whole_blocks = [&](int64_t v) { return v % block == 0; };
  if (!whole_blocks(target->second.offset) || !whole_blocks(shape[axis])) return false;
  if (found == concat_out_.end()) {
    // every input's run must be whole blocks too (the copied ones are written through
    // sub-memories), and the buffer must have no padding
    for (int in : concat.inputs) {
      if (!whole_blocks(g_.tensors[in].shape[axis])) return false;
    }
    const memory::desc md = SliceLayoutDesc(out_dims, *kind);
    if (md.get_size() != static_cast<size_t>(g_.tensors[concat.output].numel()) * sizeof(float)) return false;
    found = concat_out_.emplace(c, ConcatBuffer{md, *kind, buffers_.Own(false, md, "")}).first;
  } else if (found->second.layout != *kind) {
    return false;
  }
  const Run run = SliceOf(found->second, dims, axis, target->second.offset);
  PlaceInConcat(t, layout, buffers_.Slice(found->second.slot, layout.want.get_size(), run.offset), out);
  return true;
}

void ConcatInPlace::PlaceInConcat(int t, const OperandLayout& layout, int slot, MemRef* out) {
  ValueState& v = values_[t];
  v.is_const = false;
  v.plain_md = layout.view;
  v.storage_md = layout.want;
  v.storage = slot;
  v.plain = layout.want == layout.view ? slot : -1;
  written_in_place_.insert(t);
  *out = {layout.want, slot};
}

std::string ConcatInPlace::PlanConcat(size_t n, const Kernel& kernel) {
  const NodeInfo& node = g_.nodes[n];
  const auto member = family_root_.find(n);
  const size_t root = member == family_root_.end() ? n : member->second;
  const ConcatBuffer& buffer = concat_out_.at(root);
  const int64_t axis = concat_axis_.at(n);
  ValueState& v = values_[node.output];
  v.is_const = false;
  v.plain_md = kernel.output().view;
  v.storage_md = buffer.md;
  v.storage = buffer.slot;
  if (root != n) {  // the leading channels of the root's buffer: a dense tensor at offset 0
    v.storage_md = SliceLayoutDesc(v.plain_md.get_dims(), buffer.layout);
    v.storage = buffers_.Slice(buffer.slot, v.storage_md.get_size(), 0);
  }
  v.plain = v.storage_md == v.plain_md ? v.storage : -1;
  std::string free_inputs, copied, earlier;
  auto append = [](std::string* list, size_t k) { *list += (list->empty() ? "" : ", ") + std::to_string(k); };
  int64_t offset = 0;
  for (size_t k = 0; k < node.inputs.size(); ++k) {
    const int t = node.inputs[k];
    const std::vector<int64_t>& shape = g_.tensors[t].shape;
    const memory::dims dims(shape.begin(), shape.end());
    if (written_in_place_.count(t) != 0) {
      append(&free_inputs, k);
    } else if (!family_copied_.insert({root, k}).second) {
      append(&earlier, k);  // a smaller member of the family copied it (members share leading inputs)
    } else {
      // The input's run of the buffer is contiguous (leading dims 1, whole channel blocks): a dense
      // tensor of its own, which oneDNN reorders with its fast kernels (into a sub-memory of the
      // whole buffer it took as long as the batch norm reading the whole buffer: DenseNet-121).
      // In a channels-last buffer the run is a strided view of it.
      const Run run = SliceOf(buffer, dims, axis, offset);
      const MemRef dst{run.md, buffers_.Slice(buffer.slot, run.bytes, run.offset)};
      const ValueState& in = values_[t];
      MemRef src;
      if (!in.is_const && in.storage_md.get_dims() == dims) {
        src = {in.storage_md, in.storage};  // straight from the producer's layout
      } else {
        const memory::desc plain = PlainDesc(dims);
        src = layouts_.Resolve(t, {plain, plain}, n, /*init_consumer=*/false);
      }
      programs_.AddReorder(false, src, dst,
                           g_.where(n) + ": input " + std::to_string(k) + " (tensor " + std::to_string(t) +
                               ") copied into the output " + DescribeDesc(src.md) + " -> " + DescribeDesc(dst.md));
      append(&copied, k);
    }
    offset += shape[axis];
  }
  std::string note = g_.where(n) + ": output " + DescribeDesc(v.storage_md) + "; inputs written in place by their producers: [" +
                     free_inputs + "]; copied: [" + copied + "]";
  if (!earlier.empty()) note += "; already in the buffer: [" + earlier + "]";
  if (root != n) note += "; the leading channels of node " + std::to_string(root) + "'s buffer";
  return note;
}

}  // namespace planning
}  // namespace byoc_hetero
