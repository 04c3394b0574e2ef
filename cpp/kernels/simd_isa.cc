/*!
 * \file kernels/simd_isa.cc
 * \brief SelectSimdIsa (simd_isa.h): the CPU's vector ISA under a kernel's cap.
 */
#include "simd_isa.h"

#include <tvm/ffi/error.h>

#include <cstdlib>
#include <string>

namespace byoc_hetero {

const char* SimdIsaName(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::kAvx512:
      return "avx512";
    case SimdIsa::kAvx2:
      return "avx2";
    default:
      return "generic";
  }
}

bool CpuHasSimdIsa(SimdIsa isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (isa == SimdIsa::kAvx512) return __builtin_cpu_supports("avx512f");
  if (isa == SimdIsa::kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == SimdIsa::kGeneric;
}

SimdIsa SelectSimdIsa(const char* env_var) {
  const char* env = std::getenv(env_var);
  const std::string cap = env == nullptr || *env == '\0' ? "auto" : env;
  SimdIsa limit = SimdIsa::kAvx512;
  if (cap == "avx2") {
    limit = SimdIsa::kAvx2;
  } else if (cap == "generic") {
    limit = SimdIsa::kGeneric;
  } else if (cap != "auto" && cap != "avx512") {
    TVM_FFI_THROW(ValueError) << env_var << " must be auto, avx512, avx2 or generic, got '" << cap << "'";
  }
  for (SimdIsa isa : {SimdIsa::kAvx512, SimdIsa::kAvx2, SimdIsa::kGeneric}) {
    if (static_cast<int>(isa) >= static_cast<int>(limit) && CpuHasSimdIsa(isa)) return isa;
  }
  return SimdIsa::kGeneric;
}

}  // namespace byoc_hetero
