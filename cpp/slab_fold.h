/*!
 * \file slab_fold.h
 * \brief An init program's fold of a constant into a dense's weight, run a slab of rows at a time.
 *
 * An RMSNorm weight folded into the dense after it (ops/dense_input_scales.py) is, in the init
 * program, a binary step (the constant W times the norm's per-feature scale) writing an init-only
 * intermediate as large as W, then a reorder of that intermediate into the dense's prepared layout.
 * Run whole, the first call holds W's pages (mapped from a weights file) and the whole intermediate
 * beside the prepared copy: for a tied embedding read by the LM head (Qwen2.5-0.5B: 519 MiB) that
 * is twice the largest tensor over the steady state, the first call's peak (bench/GENERATE.md,
 * session 14 s14-mem).  Run as slabs along the dimension that is outermost in the prepared layout
 * (its panels: each slab's destination is one contiguous range), the pair needs one slab-sized
 * buffer, and each slab's pages of W go back (ReleaseFilePages) once it is folded: the transient is
 * two slabs.  The bytes written are the same (the same two oneDNN operations on sub-ranges).
 *
 * BYOC_HETERO_INIT_SLAB_BYTES: the slab's size in bytes of the intermediate (default 16 MiB; 0:
 * run every pair whole, as before), read at each init.
 */
#ifndef BYOC_HETERO_SLAB_FOLD_H_
#define BYOC_HETERO_SLAB_FOLD_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "planner.h"

namespace byoc_hetero {

/*! \brief The environment variable of the slab size (slab_fold.h). */
constexpr const char* kInitSlabVariable = "BYOC_HETERO_INIT_SLAB_BYTES";

/*! \brief The slab size BYOC_HETERO_INIT_SLAB_BYTES asks for (default 16 MiB; 0: off).
 *  \throws ValueError naming the variable for anything but a byte count. */
size_t InitSlabBytes();

/*! \brief A binary step and the reorder reading its init-only output, with the primitives of a slab. */
struct SlabFold {
  size_t binary = 0, reorder = 0;  // their init step indices
  int64_t rows = 0, slab = 0;      // the slab dimension's extent, rows per slab
  size_t mid_row_bytes = 0;        // bytes of one row of the intermediate
  size_t src_row_bytes[2] = {0, 0};  // per binary source, bytes per row (0: broadcast along the rows)
  bool release[2] = {false, false};  // per binary source, whether a slab's rows are one range of its bytes
  size_t dst_slab_bytes = 0;       // bytes of the destination per full slab (one contiguous range)
  struct Prims {
    dnnl::primitive binary, reorder;
    memory::desc src[2], mid, from, to;
  };
  Prims full, tail;
  bool tail_at_border = false;  // the tail's destination descriptor carries its own offset
};

/*!
 * \brief The pairs of \p plan's running init steps (\p run) that can run as slabs of at most
 *        \p slab_bytes of the intermediate, by reorder step: a float32 binary without post-ops
 *        writing a plain init-only buffer that exactly one other running step reads, a reorder to a
 *        float32 / bf16 layout whose outermost dimension is the buffer's.  A pair oneDNN cannot
 *        make slab primitives for is left out (it runs whole).
 */
std::map<size_t, SlabFold> SlabFolds(const Plan& plan, const std::vector<bool>& run, const dnnl::engine& engine,
                                     size_t slab_bytes);

/*!
 * \brief Run \p fold slab by slab: the binary's sources at \p src (their full tensors' data), the
 *        reorder's destination at \p to; each slab's rows of a source lying in one of \p mappings
 *        (ReadOnlyFileMappings) handed back once folded.  Waits on \p stream.
 */
void RunSlabFold(const SlabFold& fold, const dnnl::engine& engine, dnnl::stream& stream, void* const src[2], void* to,
                 const std::vector<std::pair<uintptr_t, uintptr_t>>& mappings);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_SLAB_FOLD_H_
