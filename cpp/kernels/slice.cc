/*!
 * \file kernels/slice.cc
 * \brief slice: a box of the input with positive steps, copied out by one oneDNN reorder.
 *
 * Attrs: begin (required; one offset per axis), steps (optional, default 1 on every axis; each >= 1).
 * The output tensor's shape is the box's extent: out[i] = data[begin + i * steps], and
 * begin[d] + (out[d] - 1) * steps[d] < data[d] on every axis.  The reorder reads a sub-memory
 * descriptor of the input's plain bytes.  A split is one slice node per output.
 *
 * A step s > 1 on axis d splits that axis of the descriptor in two, [ceil(D / s), s] with strides
 * [s * stride, stride], and takes the sub-memory [out, 1] at offsets [begin / s, begin % s]: element
 * (q + i) * s + r = begin + i * s.  The split covers floor(D / s) whole steps (a descriptor reaching
 * past the axis would overlap the next one, which oneDNN rejects), so begin / s + out <= D / s.  (A oneDNN descriptor has no settable base offset, so the offset
 * of begin has to come from a sub-memory; the split gives the strided one.)  Swin's patch merging
 * reads x[:, r::2, c::2, :] this way.  Negative (reversing) steps are not supported: the codegen
 * leaves them to TVM.
 *
 * The input is read where it lies: a float32 value the planner holds only under other strides (a
 * permute relabels its input's buffer, plan/layouts.cc) is sliced from those strides by host copies
 * of the runs contiguous in both (HostStridedSlice, also every float32 slice with steps), so only the
 * box is copied.  (Through oneDNN 3.2's jit:uni reorder each third took about as long as the whole
 * value's reorder had: loaded profile of Swin-T, bench/ZOO.md session 13.)  Swin's attention splits one dense's output [tokens, 3 * C], viewed [3, windows, heads,
 * N, d] by a permute, into Q, K and V (qkv[0], qkv[1], qkv[2]): each slice now copies its third,
 * where a plain copy of the whole permuted value was made first (one full reorder per attention
 * block, the largest reorders of a Swin-T profile).
 *
 * No copy at all where the planner views the box (opt-in, BYOC_HETERO_SLICE_VIEWS=on; plan/layouts.h
 * LayoutResolver::SliceView): a float32
 * slice declares its box (Kernel::view_box), and where its input is a private value held in a plain or
 * strided float32 layout and every reader of the slice reads strided input in place (KernelTraits::
 * strided_input: a matmul's operands, another slice, through reshapes and permutes), its output is the
 * input's bytes from the box's first element under the input's strides times the steps, with no step.
 * Swin's Q, K and V are then read by the attention's matmuls straight from the qkv dense's output.
 */
#include <algorithm>
#include <cstring>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief One reorder whose source is a sub-memory of the (plain) input buffer. */
class SliceKernel : public Kernel {
 public:
  SliceKernel(std::string label, dnnl::reorder::primitive_desc pd, OperandLayout in, memory::desc sub,
              memory::desc out, memory::desc out_box)
      : label_(std::move(label)), pd_(std::move(pd)), sub_(std::move(sub)), out_box_(std::move(out_box)),
        stepped_(out_box_.get_ndims() != out.get_ndims()) {
    inputs_.push_back(std::move(in));
    output_ = {out, out};
  }
  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& /*temps*/) const override {
    Step step;
    step.pd = pd_;
    step.label = label_;
    step.op = "slice";
    // with steps the output is written through its box dims (unit dims inserted: the same bytes,
    // wherever the planner placed it)
    const memory::desc to = stepped_ ? output.md.reshape(out_box_.get_dims()) : output.md;
    step.args = {{DNNL_ARG_FROM, MemRef{sub_, inputs[0].slot}}, {DNNL_ARG_TO, MemRef{to, output.slot}}};
    return {std::move(step)};
  }

 private:
  std::string label_;
  dnnl::reorder::primitive_desc pd_;
  memory::desc sub_;
  memory::desc out_box_;
  bool stepped_;
};

/*! \brief A slice with unit steps as row copies on the host: the box is prod(out[:d]) runs of
 *         out[d] * prod(in[d+1:]) contiguous elements, d the last axis the box does not span.
 *         oneDNN 3.2 runs such a sub-memory reorder as simple:any (measured in the SmolLM decoder:
 *         ~18 us per [128, 576] column slice of a [128, 960] dense output at 1 thread, 90 per call,
 *         and on 2 threads a fork / join each). */
std::unique_ptr<Kernel> HostRowCopySlice(const KernelContext& ctx, const std::vector<int64_t>& in,
                                         const std::vector<int64_t>& out, const std::vector<int64_t>& begin) {
  size_t d = in.size() - 1;
  while (d > 0 && out[d] == in[d]) --d;  // axes after d are whole: each run spans them
  int64_t inner = 1;
  for (size_t k = d + 1; k < in.size(); ++k) inner *= in[k];
  const int64_t run = out[d] * inner;
  std::vector<int64_t> in_strides(in.size(), 1);
  for (size_t k = in.size() - 1; k-- > 0;) in_strides[k] = in_strides[k + 1] * in[k + 1];
  const std::vector<int64_t> lead(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(d));
  int64_t base = 0;
  for (size_t k = 0; k < in.size(); ++k) base += begin[k] * in_strides[k];
  const int64_t runs = ctx.output().numel() / std::max<int64_t>(run, 1);
  HostFn fn = [lead, in_strides, base, run, runs](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    float* y = static_cast<float*>(p[1]);
    std::vector<int64_t> index(lead.size(), 0);
    for (int64_t r = 0; r < runs; ++r, y += run) {
      int64_t offset = base;
      for (size_t k = 0; k < lead.size(); ++k) offset += index[k] * in_strides[k];
      std::memcpy(y, x + offset, static_cast<size_t>(run) * sizeof(float));
      for (size_t k = lead.size(); k-- > 0;) {  // the next run's index over the leading axes
        if (++index[k] < lead[k]) break;
        index[k] = 0;
      }
    }
  };
  return std::make_unique<HostKernel>(ctx.where(), "slice", std::move(fn),
                                      std::vector<memory::desc>{PlainDesc(memory::dims(in.begin(), in.end()))},
                                      PlainDesc(memory::dims(out.begin(), out.end())));
}

/*! \brief How the slice reads its input: the layout the input is stored in when that is a float32
 *         layout of the input's dims under strides (no inner blocks, no offset: a permute's
 *         relabelled buffer), else the plain layout.  Reading it so costs the planner no reorder. */
memory::desc StoredInput(const KernelContext& ctx, const memory::desc& plain) {
  const memory::desc md = ctx.InputLayout(0);
  const bool strided = md != plain && md.get_format_kind() == memory::format_kind::blocked &&
                       md.get_inner_nblks() == 0 && md.get_data_type() == memory::data_type::f32 &&
                       md.get_submemory_offset() == 0 && md.get_padded_dims() == md.get_dims();
  return strided ? md : plain;
}

/*! \brief A float32 slice (any steps) of an input stored under \p stored's strides, as host copies
 *         of runs: the output's innermost dims that also lie next to each other in the input make
 *         one memcpy (Swin's Q of a [3, windows, heads, N, d]:bdace value: runs of d; patch
 *         merging's x[:, r::2, c::2, :]: runs of C).  oneDNN 3.2's jit:uni reorder of such a box
 *         took about as long per third as the whole permuted value's reorder (loaded profile). */
std::unique_ptr<Kernel> HostStridedSlice(const KernelContext& ctx, const memory::desc& stored,
                                         const std::vector<int64_t>& out, const std::vector<int64_t>& begin,
                                         const std::vector<int64_t>& steps) {
  const memory::dims s = stored.get_strides();
  const size_t rank = out.size();
  std::vector<int64_t> step_strides(rank);
  int64_t base = 0;
  for (size_t k = 0; k < rank; ++k) {
    step_strides[k] = steps[k] * s[k];
    base += begin[k] * s[k];
  }
  size_t d = rank;  // dims [d, rank) make one contiguous run in both
  int64_t run = 1;
  while (d > 0 && (step_strides[d - 1] == run || out[d - 1] == 1)) run *= out[--d];
  const std::vector<int64_t> lead(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(d));
  const std::vector<int64_t> lead_strides(step_strides.begin(), step_strides.begin() + static_cast<std::ptrdiff_t>(d));
  const int64_t runs = ctx.output().numel() / std::max<int64_t>(run, 1);
  HostFn fn = [lead, lead_strides, base, run, runs](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    float* y = static_cast<float*>(p[1]);
#pragma omp parallel for schedule(static) if (runs * run >= (1 << 15))
    for (int64_t r = 0; r < runs; ++r) {
      int64_t offset = base, rest = r;
      for (size_t k = lead.size(); k-- > 0;) {
        offset += (rest % lead[k]) * lead_strides[k];
        rest /= lead[k];
      }
      std::memcpy(y + r * run, x + offset, static_cast<size_t>(run) * sizeof(float));
    }
  };
  auto kernel = std::make_unique<HostKernel>(ctx.where(), "slice", std::move(fn),
                                             std::vector<memory::desc>{PlainDesc(stored.get_dims())},
                                             PlainDesc(memory::dims(out.begin(), out.end())));
  kernel->ReadInputIn(0, stored);  // where the value lies: no reorder before the copy
  return kernel;
}

}  // namespace

static std::unique_ptr<Kernel> BuildSlice(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  ctx.ExpectInputCount(1, "data");
  const auto& in = ctx.input(0).shape;
  const auto& out = ctx.output().shape;
  const std::vector<int64_t> begin = attrs.Ints("begin", in.size(), {});
  const std::vector<int64_t> steps = attrs.Ints("steps", in.size(), std::vector<int64_t>(in.size(), 1));
  attrs.CheckNoUnknown();
  if (in.empty()) ctx.Fail("cannot slice a scalar");
  if (out.size() != in.size()) {
    ctx.Fail("output shape " + ShapeToString(out) + " must have the rank of the input " + ShapeToString(in));
  }
  size_t stepped = 0;
  for (size_t d = 0; d < in.size(); ++d) {
    if (steps[d] < 1) attrs.Fail("steps", "must be >= 1 on every axis, got " + ShapeToString(steps));
    stepped += steps[d] > 1;
    if (begin[d] < 0 || begin[d] + (out[d] - 1) * steps[d] >= in[d]) {
      attrs.Fail("begin", "box begin " + ShapeToString(begin) + " extent " + ShapeToString(out) + " steps " +
                              ShapeToString(steps) + " does not fit in the input " + ShapeToString(in));
    }
  }
  const memory::desc in_md = PlainDesc(memory::dims(in.begin(), in.end()));
  const memory::desc stored = ctx.input(0).dtype == DType::kFloat32 ? StoredInput(ctx, in_md) : in_md;
  if (ctx.input(0).dtype == DType::kFloat32) {
    std::unique_ptr<Kernel> kernel = stepped == 0 && stored == in_md ? HostRowCopySlice(ctx, in, out, begin)
                                                                     : HostStridedSlice(ctx, stored, out, begin, steps);
    kernel->SetViewBox(begin, steps);  // the planner may view the box instead (plan/layouts.h SliceView)
    return kernel;
  }
  if (in.size() + stepped > DNNL_MAX_NDIMS) {
    attrs.Fail("steps", "rank " + std::to_string(in.size()) + " with " + std::to_string(stepped) +
                            " stepped axes needs more than oneDNN's " + std::to_string(DNNL_MAX_NDIMS) + " dims");
  }
  // the input (under the strides it is stored with) with each stepped axis split in two, and the box within it
  memory::dims big_dims, big_strides, box_dims, offsets, box_strides;
  const memory::dims in_strides = stored.get_strides();
  int64_t out_stride = 1;
  for (size_t k = in.size(); k-- > 0;) {
    const int64_t stride = in_strides[k];
    if (steps[k] > 1) {
      // whole steps only: a descriptor whose split axis reached past the axis's end would overlap the
      // next axis, which oneDNN rejects
      if (begin[k] / steps[k] + out[k] > in[k] / steps[k]) {
        attrs.Fail("steps", "axis " + std::to_string(k) + ": begin " + std::to_string(begin[k]) + " step " +
                                std::to_string(steps[k]) + " extent " + std::to_string(out[k]) +
                                " reaches into the last partial step of " + std::to_string(in[k]) +
                                " elements (needs begin / step + extent <= dim / step)");
      }
      big_dims.insert(big_dims.begin(), {in[k] / steps[k], steps[k]});
      big_strides.insert(big_strides.begin(), {stride * steps[k], stride});
      box_dims.insert(box_dims.begin(), {out[k], 1});
      offsets.insert(offsets.begin(), {begin[k] / steps[k], begin[k] % steps[k]});
      box_strides.insert(box_strides.begin(), {out_stride, 1});
    } else {
      big_dims.insert(big_dims.begin(), in[k]);
      big_strides.insert(big_strides.begin(), stride);
      box_dims.insert(box_dims.begin(), out[k]);
      offsets.insert(offsets.begin(), begin[k]);
      box_strides.insert(box_strides.begin(), out_stride);
    }
    out_stride *= out[k];
  }
  const memory::desc big(big_dims, memory::data_type::f32, big_strides);
  const memory::desc sub = big.submemory_desc(box_dims, offsets);
  const memory::desc out_md = PlainDesc(memory::dims(out.begin(), out.end()));
  const memory::desc out_box(box_dims, memory::data_type::f32, box_strides);
  dnnl::reorder::primitive_desc pd(ctx.engine, sub, ctx.engine, out_box, ctx.MakeAttr());
  return std::make_unique<SliceKernel>(ctx.where(), std::move(pd), OperandLayout{in_md, stored}, sub, out_md,
                                       out_box);
}

/*! \brief A float32 slice reads its input where it lies (HostStridedSlice, or a view of a view). */
static KernelTraits SliceTraits() {
  KernelTraits traits;
  traits.strided_input = [](const NodeInfo&, size_t) { return StridedRead::kInPlace; };
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("slice", BuildSlice, SliceTraits());

}  // namespace byoc_hetero
