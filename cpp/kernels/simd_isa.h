/*!
 * \file kernels/simd_isa.h
 * \brief Which x86 vector ISA a host kernel with per-ISA implementations runs: the best of the CPU
 *        (AVX-512F, AVX2 + FMA, portable C++), capped by an environment variable of the kernel's own
 *        (BYOC_HETERO_KV_ISA for kv_attention).  Each implementation carries its own target attribute,
 *        so the extension builds for any x86-64 and the choice is made at run time.
 */
#ifndef BYOC_HETERO_KERNELS_SIMD_ISA_H_
#define BYOC_HETERO_KERNELS_SIMD_ISA_H_

namespace byoc_hetero {

/*! \brief The implementations, best first. */
enum class SimdIsa { kAvx512, kAvx2, kGeneric };
/*! \brief "avx512", "avx2", "generic". */
const char* SimdIsaName(SimdIsa isa);
/*! \brief Whether this CPU runs \p isa (AVX-512F; AVX2 and FMA; generic always). */
bool CpuHasSimdIsa(SimdIsa isa);
/*! \brief The best ISA of this CPU at most the cap that the variable \p env_var says (avx512 | avx2 |
 *         generic | auto or unset; read when called); another value is a ValueError naming it. */
SimdIsa SelectSimdIsa(const char* env_var);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_SIMD_ISA_H_
