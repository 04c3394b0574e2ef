/*!
 * \file kernels/pad.cc
 * \brief pad: data (float32) widened on any axes by a constant value (numpy.pad, mode "constant").
 *
 * Attrs: pad_before, pad_after (required; one width >= 0 per axis), value (default 0; any float,
 * -inf and NaN included).  The output's shape is pad_before + data + pad_after on every axis.
 *
 * Why a step of its own: a zero pad of H and W right before a conv2d is folded into the conv's
 * padding by the codegen and never reaches the runtime, but torchvision's Swin-V2 pads its
 * channels-last activations [N, H, W, C] up to a multiple of the window (28x28 -> 32x32 for window 8)
 * between a layer norm and a reshape; on llvm each such pad cut the model into another region
 * (11 regions on Swin-V2-T, issue 39).
 *
 * One host step over the output, in row-major order.  Let d be the last padded axis: the axes
 * after it are whole in both tensors, so a row of the output along axes [0, d] is
 * `pad_before[d] * inner` values, then one contiguous row of the data (`data[d] * inner`, a memcpy),
 * then `pad_after[d] * inner` values; a row whose index on an earlier axis lies in that axis's
 * padding is all value.  Every output element is written once.
 */
#include <algorithm>
#include <cstring>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief The step: writes the padded output from the data (both plain float32). */
HostFn PadFn(const std::vector<int64_t>& in, const std::vector<int64_t>& before, const std::vector<int64_t>& out,
             float value) {
  size_t d = in.size() - 1;
  while (d > 0 && in[d] == out[d]) --d;  // axes after d are whole: each row spans them
  int64_t inner = 1;
  for (size_t k = d + 1; k < in.size(); ++k) inner *= in[k];
  const std::vector<int64_t> lead_in(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(d));
  const std::vector<int64_t> lead_before(before.begin(), before.begin() + static_cast<std::ptrdiff_t>(d));
  const std::vector<int64_t> lead_out(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(d));
  int64_t rows = 1;
  for (int64_t n : lead_out) rows *= n;
  const int64_t head = before[d] * inner, body = in[d] * inner, row = out[d] * inner;
  return [lead_in, lead_before, lead_out, rows, head, body, row, value](const std::vector<void*>& p) {
    const float* x = static_cast<const float*>(p[0]);
    float* y = static_cast<float*>(p[1]);
    std::vector<int64_t> index(lead_out.size(), 0);
    for (int64_t r = 0; r < rows; ++r, y += row) {
      bool inside = true;
      for (size_t k = 0; k < index.size() && inside; ++k) {
        inside = index[k] >= lead_before[k] && index[k] < lead_before[k] + lead_in[k];
      }
      if (inside) {  // the data's rows come in the output's order: x advances one row at a time
        std::fill_n(y, head, value);
        std::memcpy(y + head, x, static_cast<size_t>(body) * sizeof(float));
        std::fill(y + head + body, y + row, value);
        x += body;
      } else {
        std::fill_n(y, row, value);
      }
      for (size_t k = index.size(); k-- > 0;) {  // the next row's index over the leading axes
        if (++index[k] < lead_out[k]) break;
        index[k] = 0;
      }
    }
  };
}

}  // namespace

static std::unique_ptr<Kernel> BuildPad(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  ctx.ExpectInputCount(1, "data");
  const std::vector<int64_t>& in = ctx.input(0).shape;
  if (in.empty()) ctx.Fail("cannot pad a scalar");
  const std::vector<int64_t> before = attrs.Ints("pad_before", in.size(), {});
  const std::vector<int64_t> after = attrs.Ints("pad_after", in.size(), {});
  const auto value = static_cast<float>(attrs.Float("value", 0.0));
  attrs.CheckNoUnknown();
  if (ctx.input(0).dtype != DType::kFloat32 || ctx.output().dtype != DType::kFloat32) {
    ctx.Fail(std::string("data and output must be float32, got ") + DTypeName(ctx.input(0).dtype) + " -> " +
             DTypeName(ctx.output().dtype));
  }
  std::vector<int64_t> out(in.size());
  for (size_t k = 0; k < in.size(); ++k) {
    if (before[k] < 0 || after[k] < 0) {
      attrs.Fail(before[k] < 0 ? "pad_before" : "pad_after",
                 "widths must be >= 0 (a crop is a slice), got before " + ShapeToString(before) + " after " +
                     ShapeToString(after));
    }
    out[k] = before[k] + in[k] + after[k];
  }
  ctx.ExpectOutputShape(out);
  return std::make_unique<HostKernel>(ctx.where(), "pad", PadFn(in, before, out, value),
                                      std::vector<memory::desc>{PlainDesc(memory::dims(in.begin(), in.end()))},
                                      PlainDesc(memory::dims(out.begin(), out.end())));
}

BYOC_HETERO_REGISTER_KERNEL("pad", BuildPad);

}  // namespace byoc_hetero
