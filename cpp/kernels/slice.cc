/*!
 * \file kernels/slice.cc
 * \brief slice: a box of the input with unit steps, copied out by one oneDNN reorder.
 *
 * Attrs: begin (required; one offset per axis).  The output tensor's shape is the box's extent:
 * out[i] = data[begin + i], and begin[d] + out[d] <= data[d] on every axis.  The reorder reads a
 * sub-memory descriptor of the input's plain bytes.  A split is one slice node per output.
 * Steps other than 1 are not supported (the codegen leaves such strided_slice calls to TVM).
 */
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief One reorder whose source is a sub-memory of the (plain) input buffer. */
class SliceKernel : public Kernel {
 public:
  SliceKernel(std::string label, dnnl::reorder::primitive_desc pd, memory::desc in, memory::desc sub,
              memory::desc out)
      : label_(std::move(label)), pd_(std::move(pd)), sub_(std::move(sub)) {
    inputs_.push_back({in, in});
    output_ = {out, out};
  }
  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& /*temps*/) const override {
    Step step;
    step.pd = pd_;
    step.label = label_;
    step.op = "slice";
    step.args = {{DNNL_ARG_FROM, MemRef{sub_, inputs[0].slot}}, {DNNL_ARG_TO, output}};
    return {std::move(step)};
  }

 private:
  std::string label_;
  dnnl::reorder::primitive_desc pd_;
  memory::desc sub_;
};

}  // namespace

static std::unique_ptr<Kernel> BuildSlice(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  ctx.ExpectInputCount(1, "data");
  const auto& in = ctx.input(0).shape;
  const auto& out = ctx.output().shape;
  const std::vector<int64_t> begin = attrs.Ints("begin", in.size(), {});
  attrs.CheckNoUnknown();
  if (in.empty()) ctx.Fail("cannot slice a scalar");
  if (out.size() != in.size()) {
    ctx.Fail("output shape " + ShapeToString(out) + " must have the rank of the input " + ShapeToString(in));
  }
  for (size_t d = 0; d < in.size(); ++d) {
    if (begin[d] < 0 || begin[d] + out[d] > in[d]) {
      attrs.Fail("begin", "box begin " + ShapeToString(begin) + " extent " + ShapeToString(out) +
                              " does not fit in the input " + ShapeToString(in));
    }
  }
  const memory::desc in_md = PlainDesc(memory::dims(in.begin(), in.end()));
  const memory::dims out_dims(out.begin(), out.end());
  const memory::desc sub = in_md.submemory_desc(out_dims, memory::dims(begin.begin(), begin.end()));
  const memory::desc out_md = PlainDesc(out_dims);
  dnnl::reorder::primitive_desc pd(ctx.engine, sub, ctx.engine, out_md, ctx.MakeAttr());
  return std::make_unique<SliceKernel>(ctx.where(), std::move(pd), in_md, sub, out_md);
}

BYOC_HETERO_REGISTER_KERNEL("slice", BuildSlice);

}  // namespace byoc_hetero
