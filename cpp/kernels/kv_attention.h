/*!
 * \file kernels/kv_attention.h
 * \brief kv_attention's per-row attention in three implementations (AVX-512, AVX2, generic C++), chosen
 *        once per CPU and capped by BYOC_HETERO_KV_ISA (kv_attention_micro.cc).
 */
#ifndef BYOC_HETERO_KERNELS_KV_ATTENTION_H_
#define BYOC_HETERO_KERNELS_KV_ATTENTION_H_

#include <cstdint>

namespace byoc_hetero {
namespace kv {

/*! \brief The row implementations, best first. */
enum class Isa { kAvx512, kAvx2, kGeneric };
/*! \brief "avx512", "avx2", "generic". */
const char* IsaName(Isa isa);
/*! \brief The best ISA of this CPU, capped by BYOC_HETERO_KV_ISA (avx512 | avx2 | generic | auto; read
 *         when called); another value is a ValueError naming the variable. */
Isa SelectIsa();

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
RowFn FindRowFn(Isa isa);

}  // namespace kv
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_KV_ATTENTION_H_
