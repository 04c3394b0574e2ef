/*!
 * \file kernels/kv_attention.h
 * \brief kv_attention's per-row attention in three implementations (AVX-512, AVX2, generic C++), chosen
 *        by SelectSimdIsa(kIsaVariable): the CPU's best, capped by BYOC_HETERO_KV_ISA (kv_attention_micro.cc);
 *        and the blocked form of a prefill's many rows (AVX-512): a block of query vectors of one kv head
 *        against its keys 16 at a time, the keys read once per block instead of once per row.
 */
#ifndef BYOC_HETERO_KERNELS_KV_ATTENTION_H_
#define BYOC_HETERO_KERNELS_KV_ATTENTION_H_

#include <cstdint>

#include "simd_isa.h"

namespace byoc_hetero {
namespace kv {

/*! \brief The variable capping the ISA (avx512 | avx2 | generic | auto), read when a node is built and at
 *         each packed call. */
constexpr const char* kIsaVariable = "BYOC_HETERO_KV_ISA";

/*! \brief One query row over the key / value rows [first, last] of its kv head. */
struct RowJob {
  const float* q;       // the rotated query row, dim floats
  const float* keys;    // key row j at keys + j * dim
  const float* values;  // value row j at values + j * dim
  int64_t first, last, dim;
  float scale;          // on the scores before the softmax
  float* scores;        // scratch of at least last + 1 floats
  float* out;           // dim floats: softmax(q . keys * scale) @ values
  float* stats = nullptr;  // where given: the largest scaled score, then the sum of exp(score - it) (a split's merge)
};

/*! \brief out = softmax(scale * q . k_j) weighted sum of v_j: the scores in scratch, their maximum
 *         subtracted before exp (float32 throughout). */
using RowFn = void (*)(const RowJob& job);
RowFn FindRowFn(SimdIsa isa);

/*! \brief Keys per block of the transposed keys: key j's element e at kt[(j / kKeyBlock) * dim * kKeyBlock +
 *         e * kKeyBlock + j % kKeyBlock] (TransposeKeys; lanes past the last key 0). */
constexpr int64_t kKeyBlock = 16;

/*! \brief The variable choosing the form of a call of many rows: blocked (from 2 rows, where the ISA has a
 *         blocked form) | rows | auto (the default: blocked from 16 rows); read at each call. */
constexpr const char* kPrefillVariable = "BYOC_HETERO_KV_PREFILL";

/*! \brief The variable choosing how a decode step's (one new row) work is shared among the threads: grouped (the
 *         default: contiguous shares of heads: the heads of one kv head's group on one thread, one after the
 *         other, so that its keys and values are read from memory once, then from that core's cache) | rows
 *         (round robin, head h to thread h % threads) | split (each head's keys cut in one run per thread, from
 *         kSplitKeys keys a run: thread i reads the i-th run of every kv head's keys and values, its heads one
 *         after the other, and the runs' softmax outputs are merged by their max scores and exp sums); read at
 *         each call. */
constexpr const char* kDecodeVariable = "BYOC_HETERO_KV_DECODE";

/*! \brief split: the fewest keys a run (shorter contexts run grouped). */
constexpr int64_t kSplitKeys = 64;

/*! \brief The variable choosing the blocked form's score tiles: wide (the default: 8 vectors by up to
 *         kMaxKeyBlocks blocks of 16 keys, 24 accumulators, fewer loads per FMA) | narrow (8 vectors by one block);
 *         read at each call. */
constexpr const char* kTileVariable = "BYOC_HETERO_KV_TILES";

/*! \brief The most key blocks of one score tile (wide). */
constexpr int kMaxKeyBlocks = 3;

/*!
 * \brief Query vectors of one kv head (a block of new rows times the query heads of its group, vector
 *        i = row * group + head) over their keys: the scores of up to 8 vectors against 16 keys at a time
 *        (one transposed key row broadcast-multiplied into 8 accumulators; key_blocks > 1: up to that many blocks
 *        of 16 keys at a time, 8 x key_blocks accumulators), each vector's softmax over its own keys, the weighted
 *        value rows 4 vectors at a time (each value row loaded once for the 4).
 */
struct BlockJob {
  const float* q;         // count rotated query vectors, dim floats each, contiguous
  const int64_t* first;   // per vector: its first key (a sliding window's start, else 0); non-decreasing
  const int64_t* last;    // per vector: its last key (its own position); non-decreasing
  int64_t count, dim;
  const float* kt;        // the kv head's keys transposed in blocks of kKeyBlock (above), from key 0
  const float* values;    // value row j at values + j * dim
  float scale;            // on the scores before the softmax
  float* scores;          // scratch of count * BlockScoreStride(*this) floats
  float* const* out;      // per vector: its output row of dim floats (written last: may be where q came from)
  int key_blocks = 1;     // key blocks per score tile, 1 to kMaxKeyBlocks (kTileVariable)
};

/*! \brief The scores' row stride of \p job: its key span from first[0]'s block to last[count - 1]'s block end. */
inline int64_t BlockScoreStride(const BlockJob& job) {
  return (job.last[job.count - 1] / kKeyBlock + 1 - job.first[0] / kKeyBlock) * kKeyBlock;
}

using BlockFn = void (*)(const BlockJob& job);
/*! \brief The blocked form for \p isa, or null where it has none (AVX2, generic: the rows' form runs). */
BlockFn FindBlockFn(SimdIsa isa);

}  // namespace kv
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_KV_ATTENTION_H_
