/*!
 * \file kernels/where.cc
 * \brief The mask ops, host kernels with numpy broadcasting on every input:
 *   compare  a, b (both float32, or both int64 / int32 / bool) -> bool; attr `algorithm`
 *            "less" | "less_equal" | "greater" | "greater_equal" | "equal" | "not_equal" (required);
 *   where    cond (bool), x, y (float32) -> float32: cond ? x : y.
 * Masks are small ([B, 1, S, S] at most in attention), so a plain loop over output rows suffices.
 */
#include <functional>
#include <utility>

#include "broadcast.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

/*! \brief The broadcast output shape of the node's inputs; fails when they do not broadcast. */
std::vector<int64_t> CheckBroadcast(const KernelContext& ctx) {
  std::vector<std::vector<int64_t>> shapes;
  for (size_t k = 0; k < ctx.node().inputs.size(); ++k) shapes.push_back(ctx.input(k).shape);
  std::optional<std::vector<int64_t>> out = BroadcastShape(shapes);
  if (!out.has_value()) {
    std::string list;
    for (const auto& s : shapes) list += (list.empty() ? "" : ", ") + ShapeToString(s);
    ctx.Fail("input shapes " + list + " do not broadcast");
  }
  bool all_scalar = true;
  for (const auto& s : shapes) all_scalar = all_scalar && s.empty();
  ctx.ExpectOutputShape(all_scalar ? std::vector<int64_t>{} : *out);
  return *out;
}

template <typename T>
HostFn CompareFn(const std::string& alg, BroadcastRows walk) {
  std::function<bool(T, T)> op;
  if (alg == "less") op = [](T a, T b) { return a < b; };
  if (alg == "less_equal") op = [](T a, T b) { return a <= b; };
  if (alg == "greater") op = [](T a, T b) { return a > b; };
  if (alg == "greater_equal") op = [](T a, T b) { return a >= b; };
  if (alg == "equal") op = [](T a, T b) { return a == b; };
  if (alg == "not_equal") op = [](T a, T b) { return a != b; };
  return [op, walk](const std::vector<void*>& p) {
    const T* a = static_cast<const T*>(p[0]);
    const T* b = static_cast<const T*>(p[1]);
    uint8_t* out = static_cast<uint8_t*>(p[2]);
    const int64_t inner = walk.inner(), sa = walk.inner_stride(0), sb = walk.inner_stride(1);
    for (int64_t row = 0; row < walk.rows(); ++row) {
      const T* ra = a + walk.Offset(0, row);
      const T* rb = b + walk.Offset(1, row);
      uint8_t* ro = out + row * inner;
      for (int64_t j = 0; j < inner; ++j) ro[j] = op(ra[j * sa], rb[j * sb]) ? 1 : 0;
    }
  };
}

}  // namespace

static std::unique_ptr<Kernel> BuildCompare(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const std::string alg = attrs.Choice(
      "algorithm", {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal"}, "");
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(2, "a, b");
  const DType type = ctx.input(0).dtype;
  if (ctx.input(1).dtype != type) {
    ctx.Fail(std::string("operands must have one dtype, got ") + DTypeName(type) + " and " +
             DTypeName(ctx.input(1).dtype));
  }
  if (ctx.output().dtype != DType::kBool) ctx.Fail("the output must be bool");
  const std::vector<int64_t> out = CheckBroadcast(ctx);
  BroadcastRows walk({ctx.input(0).shape, ctx.input(1).shape}, out);
  HostFn fn;
  switch (type) {
    case DType::kFloat32:
      fn = CompareFn<float>(alg, walk);
      break;
    case DType::kInt64:
      fn = CompareFn<int64_t>(alg, walk);
      break;
    case DType::kInt32:
      fn = CompareFn<int32_t>(alg, walk);
      break;
    default:
      fn = CompareFn<uint8_t>(alg, walk);
      break;
  }
  return std::make_unique<HostKernel>(ctx.where(), "compare", std::move(fn),
                                      std::vector<memory::desc>{PlainDescOf(ctx.input(0)), PlainDescOf(ctx.input(1))},
                                      PlainDescOf(ctx.output()));
}

static std::unique_ptr<Kernel> BuildWhere(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(3, "cond, x, y");
  if (ctx.input(0).dtype != DType::kBool) ctx.Fail(std::string("cond must be bool, got ") + DTypeName(ctx.input(0).dtype));
  for (size_t k : {1, 2}) {
    if (ctx.input(k).dtype != DType::kFloat32) {
      ctx.Fail(std::string(k == 1 ? "x" : "y") + " must be float32, got " + DTypeName(ctx.input(k).dtype));
    }
  }
  if (ctx.output().dtype != DType::kFloat32) ctx.Fail("the output must be float32");
  const std::vector<int64_t> out = CheckBroadcast(ctx);
  BroadcastRows walk({ctx.input(0).shape, ctx.input(1).shape, ctx.input(2).shape}, out);
  HostFn fn = [walk](const std::vector<void*>& p) {
    const uint8_t* c = static_cast<const uint8_t*>(p[0]);
    const float* x = static_cast<const float*>(p[1]);
    const float* y = static_cast<const float*>(p[2]);
    float* o = static_cast<float*>(p[3]);
    const int64_t inner = walk.inner(), sc = walk.inner_stride(0), sx = walk.inner_stride(1),
                  sy = walk.inner_stride(2);
    for (int64_t row = 0; row < walk.rows(); ++row) {
      const uint8_t* rc = c + walk.Offset(0, row);
      const float* rx = x + walk.Offset(1, row);
      const float* ry = y + walk.Offset(2, row);
      float* ro = o + row * inner;
      for (int64_t j = 0; j < inner; ++j) ro[j] = rc[j * sc] ? rx[j * sx] : ry[j * sy];
    }
  };
  std::vector<memory::desc> ins;
  for (size_t k = 0; k < 3; ++k) ins.push_back(PlainDescOf(ctx.input(k)));
  return std::make_unique<HostKernel>(ctx.where(), "where", std::move(fn), std::move(ins), PlainDescOf(ctx.output()));
}

BYOC_HETERO_REGISTER_KERNEL("compare", BuildCompare);
BYOC_HETERO_REGISTER_KERNEL("where", BuildWhere);

}  // namespace byoc_hetero
