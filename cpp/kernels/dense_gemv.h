/*!
 * \file kernels/dense_gemv.h
 * \brief The float32 dense of a plan with few rows (the decode step's M = 1) as our own GEMV instead
 *        of oneDNN's matmul: at M = 1 a dense streams its weight once and does two flops per weight,
 *        so it runs at the memory bandwidth only when the weight is read in one contiguous pass.
 *
 * Weight layout: the very copy oneDNN's matmul would read for that plan (\p matmul_weights, its
 * `any` choice, made once at __init_ by the planner's reorder), when it is BA16a<W>b, W = 16, 32,
 * 48 or 64 (oneDNN 3.2's choice for f32 on AVX-512, 64 at every shape seen): panels of W columns,
 * each a contiguous row-major [K padded to 16, W] block, one sequential stream.  So the GEMV costs
 * no weight memory, and a prefill plan whose matmul picks the same layout, or whose inner product picks
 * its transpose (AB16b64a over [N, K]: the same bytes, plan/buffers.cc Buffers::Key), shares the copy.  Another
 * layout keeps the matmul.
 *
 * Without AVX-512 oneDNN 3.2's matmul is its jit sgemm, which keeps the weight [N, K] row-major, and the GEMV
 * never engaged.  BYOC_HETERO_GEMV_LAYOUT (dense.cc ReadGemvLayout; `prefill` by default since session 17) lets it
 * read another copy there: `prefill` the layout a prefill plan's inner product gives the same weight where such a
 * plan takes the inner product (the process's threads 2+, so that a plan of fewer threads made under contention reads
 * the same panels and gives the same bits; dense.cc PrefillWeightLayout: AB8b24a over [N, K] on AVX2, panels of
 * 24 columns, K padded to 8), the copy made at __init_ and shared with a prefill of 128 rows or more; else the
 * rows form: the weight [N, K] row-major (the sgemm's own copy, an NK weight as it is), dot products along K, so
 * decode and prefill read one copy either way.  `rows` and `panels` force either form (the A/Bs; `panels` at one
 * thread is a copy of the GEMV's own beside the one the prefill's sgemm reads).
 *
 * AVX-512 reads a panel's rows whole (W / 16 vectors; AVX2 where W is no multiple of 16 and for the rows form);
 * AVX2 goes 2 or 3 vectors of 8 columns at a time (the rows form: 4 weight rows at a time), C++ 8 columns at a
 * time.  Threads split the panels (the rows form: blocks of 64 rows).  Micro-kernels per ISA (kernels/simd_isa.h:
 * AVX-512F, AVX2 + FMA, portable C++),
 * capped by BYOC_HETERO_GEMV_ISA; the rows a plan may have to take this path by
 * BYOC_HETERO_GEMV_ROWS (default kGemvDefaultRows, 0: never), both read when a plan is made.
 *
 * Epilogue, in oneDNN's post-op order: bias, a gate's multiply (Epilogue::gate), then a residual sum (the
 * output already holds the residual: Kernel::sum_input) in the GEMV's own loop; then one activation (act
 * without a residual, post_act after one) by oneDNN's eltwise primitive in place on the output (N floats, still
 * in cache).  An activation before a residual sum or a gate keeps oneDNN's matmul.
 */
#ifndef BYOC_HETERO_KERNELS_DENSE_GEMV_H_
#define BYOC_HETERO_KERNELS_DENSE_GEMV_H_

#include <cstdint>
#include <functional>
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
 *        when this plan's rows and epilogue take it, else null (the caller builds oneDNN's).  It reads
 *        \p matmul_weights (the matmul's own copy) where that is panels; else, where \p prefill_weights is
 *        given, the [k, n] layout it returns (called then only) where that is panels; else, with
 *        \p rows_otherwise, the weight [N, K] row-major (the rows form: oneDNN's sgemm keeps that copy, and
 *        an NK weight is that as it is); else null.
 */
std::unique_ptr<Kernel> GemvDense(const KernelContext& ctx, int64_t m, int64_t k, int64_t n, bool nk,
                                  bool has_bias, const Epilogue& epilogue, const memory::desc& matmul_weights,
                                  const std::function<memory::desc()>& prefill_weights = nullptr,
                                  bool rows_otherwise = false);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_DENSE_GEMV_H_
