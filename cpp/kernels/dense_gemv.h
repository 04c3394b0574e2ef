/*!
 * \file kernels/dense_gemv.h
 * \brief The float32 dense of a plan with few rows (the decode step's M = 1) as our own GEMV instead
 *        of oneDNN's matmul: at M = 1 a dense streams its weight once and does two flops per weight,
 *        so it runs at the memory bandwidth only when the weight is read in one contiguous pass.
 *
 * Weight layout: oneDNN's BA16a16b of the logical [K, N] weight, made once at __init_ by the
 * planner's reorder in place of the oneDNN matmul's blocked copy for that plan (no extra memory):
 * panels of 16 columns, each a contiguous row-major [K padded to 16, 16] block, so that one panel is
 * one sequential stream and one AVX-512 vector (two AVX2 ones) holds a row of it.  Threads split
 * the panels.  Micro-kernels per ISA (kernels/simd_isa.h: AVX-512F, AVX2 + FMA, portable C++),
 * capped by BYOC_HETERO_GEMV_ISA; the rows a plan may have to take this path by
 * BYOC_HETERO_GEMV_ROWS (default kGemvDefaultRows, 0: never), both read when a plan is made.
 *
 * Epilogue, in oneDNN's post-op order: bias, then a residual sum (the output already holds the
 * residual: Kernel::sum_input) in the GEMV's own loop; then one activation (act without a residual,
 * post_act after one) by oneDNN's eltwise primitive in place on the output (N floats, still in
 * cache).  An activation before a residual sum keeps oneDNN's matmul.
 */
#ifndef BYOC_HETERO_KERNELS_DENSE_GEMV_H_
#define BYOC_HETERO_KERNELS_DENSE_GEMV_H_

#include <cstdint>
#include <memory>

#include "kernel.h"

namespace byoc_hetero {

/*! \brief Plans with at most this many rows take the GEMV unless BYOC_HETERO_GEMV_ROWS says otherwise: at
 *         the SmolLM-135M decoder's shapes (bench/gemv.py, weights streamed from memory, 1 and 2 threads,
 *         Skylake-SP avx512_core, loaded) ours was 1.01-1.15x oneDNN's matmul at M = 1 and 2, 0.96-1.07x at
 *         3 and 4, 0.71-1.02x at 8 (bench/GENERATE.md, session 8 s8-gemv). */
constexpr int64_t kGemvDefaultRows = 2;

/*!
 * \brief The GEMV kernel of a float32 dense (x [m, k] @ W [k, n], W constant, \p nk: stored [N, K])
 *        when this plan's rows and epilogue take it, else null (the caller builds oneDNN's).
 */
std::unique_ptr<Kernel> GemvDense(const KernelContext& ctx, int64_t m, int64_t k, int64_t n, bool nk,
                                  bool has_bias, const Epilogue& epilogue);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_DENSE_GEMV_H_
