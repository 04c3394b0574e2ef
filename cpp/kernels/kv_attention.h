/*!
 * \file kernels/kv_attention.h
 * \brief kv_attention's per-row attention in three implementations (AVX-512, AVX2, generic C++), chosen
 *        by SelectSimdIsa(kIsaVariable): the CPU's best, capped by BYOC_HETERO_KV_ISA (kv_attention_micro.cc).
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
};

/*! \brief out = softmax(scale * q . k_j) weighted sum of v_j: the scores in scratch, their maximum
 *         subtracted before exp (float32 throughout). */
using RowFn = void (*)(const RowJob& job);
RowFn FindRowFn(SimdIsa isa);

}  // namespace kv
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_KV_ATTENTION_H_
