/*!
 * \file kernels/cast.cc
 * \brief cast: elementwise dtype conversion (Relax astype), a host kernel.
 *
 * Input: data of any dtype; the output tensor's dtype is the target (same shape).  Runs: any dtype
 * to float32 (int64 / int32 / bool masks become 0/1 or the integer's value), bool / int32 / int64
 * to int32 / int64, anything to bool (x != 0).  float32 to an integer is not run: out-of-range
 * values have no defined result, so the codegen leaves that cast on llvm.  A float32 -> float32
 * cast never reaches the runtime (the codegen drops it).
 */
#include <cstring>
#include <utility>

#include "kernel.h"

namespace byoc_hetero {

namespace {

template <typename From, typename To>
void CastAll(const void* src, void* dst, int64_t n) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
#pragma omp parallel for schedule(static) if (n > 4096)
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<To, uint8_t>) {
      d[i] = s[i] != From(0) ? 1 : 0;
    } else {
      d[i] = static_cast<To>(s[i]);
    }
  }
}

template <typename From>
HostFn CastFrom(DType to, int64_t n) {
  return VisitDType(to, [n](auto to_type) -> HostFn {
    using To = decltype(to_type);
    return [n](const std::vector<void*>& p) { CastAll<From, To>(p[0], p[1], n); };
  });
}

}  // namespace

static std::unique_ptr<Kernel> BuildCast(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(1, "data");
  ctx.ExpectOutputShape(ctx.input(0).shape);
  const DType from = ctx.input(0).dtype, to = ctx.output().dtype;
  if (from == DType::kFloat32 && (to == DType::kInt64 || to == DType::kInt32)) {
    ctx.Fail(std::string("float32 -> ") + DTypeName(to) +
             " is not run (out-of-range values have no defined result)");
  }
  if (IsInt8(to)) {
    ctx.Fail(std::string("a cast to ") + DTypeName(to) + " is not run (8-bit values come from quantize)");
  }
  const int64_t n = ctx.input(0).numel();
  HostFn fn = VisitDType(from, [&](auto from_type) { return CastFrom<decltype(from_type)>(to, n); });
  return std::make_unique<HostKernel>(ctx.where(), "cast", std::move(fn),
                                      std::vector<memory::desc>{PlainDescOf(ctx.input(0))},
                                      PlainDescOf(ctx.output()));
}

BYOC_HETERO_REGISTER_KERNEL("cast", BuildCast);

}  // namespace byoc_hetero
