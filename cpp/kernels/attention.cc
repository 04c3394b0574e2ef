/*!
 * \file kernels/attention.cc
 * \brief attention: softmax(Q @ K^T * scale [+ mask]) @ V for every batch/head, one block of query
 *        rows at a time, without writing the [batch..., M, N] scores to memory.
 *
 * Inputs: q, k, v, [mask].  Each of q, k, v is its input's row-major bytes read through a view
 * (attrs q_shape + q_strides, k_shape + k_strides, v_shape + v_strides, the output's rank each):
 * q [batch..., M, D], k [batch..., N, D], v [batch..., N, Dv]; a batch dim of 1 broadcasts (GQA's
 * K / V heads), and each matrix needs a unit stride along one of its last two dims (what the
 * permutes of Q, K, V in attention give).  The mask (has_mask 1) is a plain input whose shape,
 * ranks aligned by leading 1s, broadcasts to the scores [batch..., M, N].  Attrs: scale (default
 * 1), safe (0/1/2, as the softmax node's), block_rows (default 0: RowsPerBlock; query rows per
 * block, for experiments and tests).  Output: [batch..., M, Dv], plain, or under the planner's
 * strided hint (OutputView: the permute after P @ V becomes a view, no copy).
 *
 * Why: the region pass fuse_attention (backends/onednn/ops/fused_attention.py) replaces matmul ->
 * softmax -> matmul by this node.  Unfused, Whisper-tiny's encoder writes [6, 1500, 1500] scores
 * (54 MB) per layer, which the softmax reads and writes, its special-row scan reads and the P @ V
 * matmul reads again: a per-step profile had the two matmuls at 29% of the call and the softmax
 * at 18%, memory-bound.  Here a block of query rows of the scores ([rows, N], sized to stay in L2)
 * is computed, turned into probabilities and multiplied by V while it is in cache; blocks of all
 * batch/head pairs run in parallel on the OpenMP team, each block's two products on oneDNN's
 * sgemm, which runs single-threaded inside a parallel region.  With more than one block per head,
 * each distinct K and V head is first copied once per call into contiguous K^T [D, N] / V [N, Dv]
 * that every block and thread reads (see PackedOperands).
 *
 * Numerics: the unfused path's up to rounding.  Scores are scale * (Q K^T) (+ mask); each row is
 * the accurate softmax (max subtracted, exp, sum), its 1/sum applied to the row's output after
 * P @ V rather than to P (Dv multiplies instead of N), with the special-row treatment of
 * kernels/softmax.cc: a row holding a NaN or +inf is all NaN (safe 2: all 0), a row of only -inf
 * all NaN (safe 1 and 2: all 0); a -inf element of any other row is exactly 0.
 */
// GCC 12's avx512fintrin.h trips -Wuninitialized in its own _mm512_undefined_ps (masked loads,
// reductions); the header's false positive, not this file's.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include <tvm/ffi/error.h>

#include "env_switch.h"
#include "kernel.h"
#include "simd_isa.h"
#include "softmax_exp.h"

namespace byoc_hetero {

namespace {

/*! \brief How sgemm reads one matrix of a view: transposed or not, and its leading dimension. */
struct MatrixArg {
  char trans = 'N';
  int64_t ld = 0;
};

/*! \brief One operand read through a view: per output batch dim its stride (0 = broadcast), and
 *         the strides of its two matrix dims. */
struct ViewInfo {
  std::vector<int64_t> batch_strides;
  int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 0;
};

/*! \brief sgemm's reading of a [rows, cols] matrix with those element strides, or nullopt. */
std::optional<MatrixArg> AsMatrix(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (col_stride == 1 && (rows == 1 || row_stride >= cols)) return MatrixArg{'N', rows == 1 ? cols : row_stride};
  if (row_stride == 1 && (cols == 1 || col_stride >= rows)) return MatrixArg{'T', cols == 1 ? rows : col_stride};
  return std::nullopt;
}

ViewInfo ReadView(const KernelContext& ctx, AttrReader& attrs, size_t k, const char* shape_key, const char* strides_key,
                  const std::vector<int64_t>& batch) {
  const size_t rank = batch.size() + 2;
  const std::vector<int64_t> shape = attrs.Ints(shape_key, rank, {});
  const std::vector<int64_t> strides = attrs.Ints(strides_key, rank, {});
  int64_t last = 0;
  for (size_t d = 0; d < rank; ++d) {
    if (shape[d] < 1 || strides[d] < 0) {
      attrs.Fail(shape_key, "view " + ShapeToString(shape) + " / strides " + ShapeToString(strides) +
                                " must have extents >= 1 and strides >= 0");
    }
    last += (shape[d] - 1) * strides[d];
  }
  if (last >= ctx.input(k).numel()) {
    attrs.Fail(shape_key, "view " + ShapeToString(shape) + " / strides " + ShapeToString(strides) +
                              " reads past the " + std::to_string(ctx.input(k).numel()) + " elements of input " +
                              std::to_string(k) + " " + ShapeToString(ctx.input(k).shape));
  }
  ViewInfo v;
  for (size_t d = 0; d < batch.size(); ++d) {
    if (shape[d] != batch[d] && shape[d] != 1) {
      attrs.Fail(shape_key, "batch dims of " + ShapeToString(shape) + " do not broadcast to the output's " +
                                ShapeToString(batch));
    }
    v.batch_strides.push_back(shape[d] == 1 ? 0 : strides[d]);
  }
  v.rows = shape[rank - 2];
  v.cols = shape[rank - 1];
  v.row_stride = strides[rank - 2];
  v.col_stride = strides[rank - 1];
  if (!AsMatrix(v.rows, v.cols, v.row_stride, v.col_stride)) {
    attrs.Fail(strides_key, "strides " + ShapeToString(strides) + " of view " + ShapeToString(shape) +
                                " have no unit stride in the last two dims (a matrix sgemm cannot read)");
  }
  return v;
}

/*! \brief Element offsets of each operand for every flattened batch index. */
std::vector<int64_t> BatchOffsets(const std::vector<int64_t>& batch, const std::vector<int64_t>& strides) {
  int64_t count = 1;
  for (int64_t d : batch) count *= d;
  std::vector<int64_t> out(count, 0);
  for (int64_t g = 0; g < count; ++g) {
    int64_t rest = g, offset = 0;
    for (size_t d = batch.size(); d-- > 0;) {
      offset += (rest % batch[d]) * strides[d];
      rest /= batch[d];
    }
    out[g] = offset;
  }
  return out;
}

/*! \brief What the kernel computes, fixed at plan time. */
struct AttentionPlan {
  int64_t m = 0, n = 0, d = 0, dv = 0, rows = 0;  // rows: query rows per block
  float scale = 1.f;
  int safe = 0;
  bool has_mask = false;
  ViewInfo q, k, v;
  std::vector<int64_t> q_off, k_off, v_off, mask_off, out_off;  // per flattened batch index
  int64_t out_row_stride = 0;  // the output's: plain, or the planner's hint (OutputView)
  int64_t mask_row_stride = 0, mask_col_stride = 0;
  SimdIsa isa = SimdIsa::kGeneric;  // the softmax rows' (AttentionIsa)
  // Packing (pack true: more than one block of rows per batch index): each distinct K (and V) of the
  // batch is copied once per call, K as K^T [D, N] and V as [N, Dv], both contiguous, and every
  // block reads the copy.  k_slot / v_slot: the packed copy of each flattened batch index (GQA's
  // shared K / V heads are packed once); k_src / v_src: the element offset each copy is read from.
  bool pack = false;
  std::vector<int64_t> k_slot, v_slot, k_src, v_src;
};

/*! \brief Row max, and whether the row holds a NaN or +inf. */
__attribute__((target("avx512f"))) float RowMaxAvx512(const float* x, int64_t n, bool* nan_or_inf) {
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __m512 mx1 = mx;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {  // whole vectors two at a time, two independent maxima
    const __m512 v0 = _mm512_loadu_ps(x + j), v1 = _mm512_loadu_ps(x + j + 16);
    bad |= _mm512_cmp_ps_mask(v0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(v1, inf, _CMP_NLT_UQ);  // NaN or +inf
    mx = _mm512_max_ps(mx, v0);
    mx1 = _mm512_max_ps(mx1, v1);
  }
  for (; j < n; j += 16) {
    const __mmask16 live = n - j >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + j);
    bad |= _mm512_mask_cmp_ps_mask(live, v, inf, _CMP_NLT_UQ);
    mx = _mm512_mask_max_ps(mx, live, mx, v);
  }
  *nan_or_inf = bad != 0;
  return _mm512_reduce_max_ps(_mm512_max_ps(mx, mx1));
}

/*! \brief RowMaxAvx512 in AVX2: 8 lanes, two vectors at a time, a scalar tail. */
__attribute__((target("avx2"))) float RowMaxAvx2(const float* x, int64_t n, bool* nan_or_inf) {
  const float inf = std::numeric_limits<float>::infinity();
  const __m256 vinf = _mm256_set1_ps(inf);
  __m256 mx0 = _mm256_set1_ps(-inf), mx1 = mx0, bad = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + j), v1 = _mm256_loadu_ps(x + j + 8);
    bad = _mm256_or_ps(bad, _mm256_or_ps(_mm256_cmp_ps(v0, vinf, _CMP_NLT_UQ), _mm256_cmp_ps(v1, vinf, _CMP_NLT_UQ)));
    mx0 = _mm256_max_ps(mx0, v0);
    mx1 = _mm256_max_ps(mx1, v1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(mx0, mx1));
  float max = -inf;
  for (float l : lanes) max = std::max(max, l);
  bool any = _mm256_movemask_ps(bad) != 0;
  for (; j < n; ++j) {
    any |= !(x[j] < inf);
    max = std::max(max, x[j]);
  }
  *nan_or_inf = any;
  return max;
}

/*! \brief The ISA of the softmax rows: the best of the CPU under BYOC_HETERO_ATTENTION_ISA (read when a
 *         module is created; tests compare the three in one process), and at most the vector width
 *         of oneDNN's effective ISA, so that ONEDNN_MAX_CPU_ISA=AVX2 runs the whole node as a CPU
 *         without AVX-512 would.  Every choice gives the same probabilities (softmax_exp.h). */
SimdIsa AttentionIsa() {
  using i = dnnl::cpu_isa;
  const i onednn = dnnl::get_effective_cpu_isa();
  const bool onednn_avx2 = IsaHasAvx512() || onednn == i::avx2 || onednn == i::avx2_vnni || onednn == i::avx2_vnni_2;
  const SimdIsa isa = SelectSimdIsa("BYOC_HETERO_ATTENTION_ISA");
  if (isa == SimdIsa::kAvx512 && !IsaHasAvx512()) return onednn_avx2 ? SimdIsa::kAvx2 : SimdIsa::kGeneric;
  if (isa == SimdIsa::kAvx2 && !onednn_avx2) return SimdIsa::kGeneric;
  return isa;
}

/*! \brief One row of scores -> exp(x - max) in place; returns the factor 1/sum the row's share of
 *         the output is multiplied by after P @ V (one pass over the row fewer than normalising P:
 *         the row is N long, its output row Dv).  kernels/softmax.cc's special rows: the row is
 *         filled with NaN or 0 and the factor is 1.  Every \p isa gives the same bits
 *         (softmax_exp.h; the max does not depend on the order it is taken in). */
float SoftmaxRow(float* x, int64_t n, int safe, SimdIsa isa) {
  const float inf = std::numeric_limits<float>::infinity();
  bool nan_or_inf = false;
  float max = -inf;
  if (isa == SimdIsa::kAvx512) {
    max = RowMaxAvx512(x, n, &nan_or_inf);
  } else if (isa == SimdIsa::kAvx2) {
    max = RowMaxAvx2(x, n, &nan_or_inf);
  } else {
    for (int64_t j = 0; j < n; ++j) {
      nan_or_inf |= !(x[j] < inf);
      max = std::max(max, x[j]);
    }
  }
  if (nan_or_inf || max == -inf) {  // kernels/softmax.cc's SpecialRow: NaN/+inf row, or all -inf
    const bool zero = safe == 2 || (!nan_or_inf && safe == 1);
    std::fill_n(x, n, zero ? 0.f : std::numeric_limits<float>::quiet_NaN());
    return 1.f;
  }
  float sum = 0.f;
  if (isa == SimdIsa::kAvx512) {
    sum = softmax_exp::ExpSum512(x, n, max);
  } else if (isa == SimdIsa::kAvx2) {
    sum = softmax_exp::ExpSum256(x, n, max);
  } else {
    sum = softmax_exp::ExpSumGeneric(x, n, max);
  }
  return 1.f / sum;
}

/*! \brief C = alpha * op(A) @ op(B); oneDNN's status (no throw: it runs inside an OpenMP region). */
dnnl::status Sgemm(const MatrixArg& a, const MatrixArg& b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* pa, const float* pb, float* pc, int64_t ldc) {
  return dnnl::sgemm(a.trans, b.trans, m, n, k, alpha, pa, a.ld, pb, b.ld, 0.f, pc, ldc);
}

/*! \brief Per-call copies of K and V (AttentionPlan::pack): K^T [D, N] and V [N, Dv] per distinct
 *         head, contiguous.  Why: every block's two sgemm calls read the whole K and V of its
 *         head; contiguous operands run faster on oneDNN's no-copy sgemm kernels (one core, block
 *         shapes of Whisper's S = 1500, d = 64: [128, 64] x [64, 1500] 145-152 us against 160-170
 *         us reading K^T through the [S, 384] view; [128, 1500] x [1500, 64] 161-166 against
 *         191-193 us reading V with row stride 384), and K / V are read 12 times per head. */
struct PackedOperands {
  float* kt = nullptr;  // [k slots, D, N]
  float* v = nullptr;   // [v slots, N, Dv]
};

/*! \brief dst [cols, rows] = the transpose of the [rows, cols] view at src, 64 source rows at a time
 *         (they stay in L1 while each of their columns is written as one contiguous run). */
void TransposeInto(const float* src, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                   float* dst) {
  constexpr int64_t kRows = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t r1 = std::min(rows, r0 + kRows);
    for (int64_t c = 0; c < cols; ++c) {
      float* out = dst + c * rows;
      for (int64_t r = r0; r < r1; ++r) out[r] = src[r * row_stride + c * col_stride];
    }
  }
}

/*! \brief dst [rows, cols] contiguous = the view at src. */
void CopyInto(const float* src, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * row_stride;
    float* out = dst + r * cols;
    if (col_stride == 1) {
      std::copy_n(in, cols, out);
    } else {
      for (int64_t c = 0; c < cols; ++c) out[c] = in[c * col_stride];
    }
  }
}

/*! \brief Where the packed copies go: buffer grown to hold every distinct K^T and V head. */
PackedOperands PackedLayout(const AttentionPlan& p, std::vector<float>& buffer) {
  const size_t need = p.k_src.size() * p.d * p.n + p.v_src.size() * p.n * p.dv;
  if (buffer.size() < need) buffer.resize(need);
  return {buffer.data(), buffer.data() + p.k_src.size() * p.d * p.n};
}

/*! \brief Copy number t of PackedLayout: the distinct K heads first (transposed), then the V heads. */
void PackOne(const AttentionPlan& p, int64_t t, const float* k, const float* v, const PackedOperands& packed) {
  const int64_t nk = static_cast<int64_t>(p.k_src.size());
  if (t < nk) {
    TransposeInto(k + p.k_src[t], p.n, p.d, p.k.row_stride, p.k.col_stride, packed.kt + t * p.d * p.n);
  } else {
    CopyInto(v + p.v_src[t - nk], p.n, p.dv, p.v.row_stride, p.v.col_stride,
             packed.v + (t - nk) * p.n * p.dv);
  }
}

/*! \brief Rows [r0, r0 + rows) of batch index g: scores into tile, softmax, @ V into out, each
 *         output row times its softmax factor (inv: rows floats of scratch). */
dnnl::status RunBlock(const AttentionPlan& p, int64_t g, int64_t r0, int64_t rows, const float* q, const float* k,
                      const float* v, const PackedOperands& packed, const float* mask, float* out, float* tile,
                      float* inv) {
  const float* qg = q + p.q_off[g] + r0 * p.q.row_stride;
  const MatrixArg qa = *AsMatrix(rows, p.d, p.q.row_stride, p.q.col_stride);
  // tile = scale * Q[r0:r0+rows] @ K^T: the packed K^T, or k's view [N, D] read with rows and
  // columns swapped
  const float* kg = p.pack ? packed.kt + p.k_slot[g] * p.d * p.n : k + p.k_off[g];
  const MatrixArg kt = p.pack ? MatrixArg{'N', p.n} : *AsMatrix(p.d, p.n, p.k.col_stride, p.k.row_stride);
  const dnnl::status st = Sgemm(qa, kt, rows, p.n, p.d, p.scale, qg, kg, tile, p.n);
  if (st != dnnl::status::success) return st;
  for (int64_t i = 0; i < rows; ++i) {
    float* row = tile + i * p.n;
    if (p.has_mask) {
      const float* mrow = mask + p.mask_off[g] + (r0 + i) * p.mask_row_stride;
      if (p.mask_col_stride == 1) {
        for (int64_t j = 0; j < p.n; ++j) row[j] += mrow[j];
      } else {
        for (int64_t j = 0; j < p.n; ++j) row[j] += mrow[0];
      }
    }
    inv[i] = SoftmaxRow(row, p.n, p.safe, p.isa);
  }
  const MatrixArg pa{'N', p.n};
  const float* vg = p.pack ? packed.v + p.v_slot[g] * p.n * p.dv : v + p.v_off[g];
  const MatrixArg vb = p.pack ? MatrixArg{'N', p.dv} : *AsMatrix(p.n, p.dv, p.v.row_stride, p.v.col_stride);
  float* og = out + p.out_off[g] + r0 * p.out_row_stride;
  const dnnl::status st2 = Sgemm(pa, vb, rows, p.dv, p.n, 1.f, tile, vg, og, p.out_row_stride);
  for (int64_t i = 0; i < rows; ++i) {
    float* orow = og + i * p.out_row_stride;
    for (int64_t c = 0; c < p.dv; ++c) orow[c] *= inv[i];
  }
  return st2;
}

void RunAttention(const AttentionPlan& p, const std::string& label, const std::vector<void*>& ptrs) {
  const float* q = static_cast<const float*>(ptrs[0]);
  const float* k = static_cast<const float*>(ptrs[1]);
  const float* v = static_cast<const float*>(ptrs[2]);
  const float* mask = p.has_mask ? static_cast<const float*>(ptrs[3]) : nullptr;
  float* out = static_cast<float*>(ptrs[p.has_mask ? 4 : 3]);
  // Scratch kept per thread between calls (grow only): fresh multi-MiB vectors every call would be
  // fresh pages, faulted in and zeroed each time.
  thread_local std::vector<float> packed_buffer;
  const PackedOperands packed = p.pack ? PackedLayout(p, packed_buffer) : PackedOperands{};
  const int64_t copies = p.pack ? static_cast<int64_t>(p.k_src.size() + p.v_src.size()) : 0;
  const int64_t blocks = (p.m + p.rows - 1) / p.rows;
  const int64_t tasks = static_cast<int64_t>(p.q_off.size()) * blocks;
  int failed = 0;  // a oneDNN status other than success (sgemm's arguments are checked at plan time)
  // One parallel region for the copies and the blocks: a second fork / join cost more than the
  // copies saved on the loaded 2-vCPU machine (a standalone copy of this loop, 2 threads, wall
  // time: copies in their own region 1.2x the session-4 loop, in this region 0.92-1.04x).
#pragma omp parallel if (tasks > 1)
  {
    thread_local std::vector<float> tile;
    if (tile.size() < static_cast<size_t>(p.rows * (p.n + 1))) tile.resize(p.rows * (p.n + 1));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < copies; ++t) PackOne(p, t, k, v, packed);  // the blocks wait at its barrier
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t g = t / blocks, r0 = (t % blocks) * p.rows;
      const dnnl::status st = RunBlock(p, g, r0, std::min(p.rows, p.m - r0), q, k, v, packed, mask, out,
                                       tile.data(), tile.data() + p.rows * p.n);
      if (st != dnnl::status::success) {
#pragma omp atomic write
        failed = static_cast<int>(st);
      }
    }
  }
  if (failed != 0) {
    TVM_FFI_THROW(RuntimeError) << label << ": oneDNN sgemm returned status " << failed << " for M=" << p.m
                                << " N=" << p.n << " D=" << p.d << " Dv=" << p.dv;
  }
}

/*! \brief For each batch index the slot of its distinct offset (slot), and the distinct offsets
 *         in first-seen order (src). */
void DistinctOffsets(const std::vector<int64_t>& offsets, std::vector<int64_t>* slot, std::vector<int64_t>* src) {
  for (int64_t off : offsets) {
    const auto it = std::find(src->begin(), src->end(), off);
    slot->push_back(it - src->begin());
    if (it == src->end()) src->push_back(off);
  }
}

/*! \brief Query rows per block: the [rows, N] score tile within ~256 KiB, but at least 128 rows:
 *         every block's sgemm packs the head's K and V again, so short blocks on long rows repack
 *         them often.  Whisper's S = 1500 (6 heads, interleaved A/B of block_rows on a heavily
 *         loaded machine): 128-750 rows took 0.77-0.83 of the time of 43-row (256 KiB) blocks in
 *         two runs; two later runs were noise (43 rows 0.97 and 1.27 of 128).  With K / V packed
 *         (session 5: a standalone copy of this loop, one thread, CPU time, 20 calls each) 16, 32,
 *         64, 128, 256 and 512 rows all took 30-34 ms per call, within the run-to-run spread: the
 *         block size no longer matters at this shape, so the rule stays. */
int64_t RowsPerBlock(int64_t m, int64_t n) {
  const int64_t budget = (256 << 10) / static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(1, std::min(m, std::max<int64_t>(128, budget / std::max<int64_t>(n, 1))));
}

/*! \brief BYOC_HETERO_ATTENTION_OUT_VIEW (read when a region is planned): "on" writes the output under
 *         the planner's strided hint (OutputView); "off" (or unset) writes it plain.  Opt-in: session 16's
 *         quiet A/B measured it level (1.000x; bench/ZOO.md: the Phi-3-style decoder's 12 copies after attention). */
bool OutViewOn() { return EnvSwitch("BYOC_HETERO_ATTENTION_OUT_VIEW", "on", "off", false); }

/*! \brief Whether \p hint's dims are \p out's, or \p out's with its batch dims split into more
 *         (the same elements in the same row-major order: M and Dv as they are). */
bool SameOrSplitBatch(const memory::dims& hint, const memory::dims& out) {
  if (hint == out) return true;
  if (hint.size() <= out.size() || out.size() < 2) return false;
  if (hint[hint.size() - 2] != out[out.size() - 2] || hint.back() != out.back()) return false;
  int64_t a = 1, b = 1;
  for (size_t d = 0; d + 2 < hint.size(); ++d) a *= hint[d];
  for (size_t d = 0; d + 2 < out.size(); ++d) b *= out[d];
  return a == b;
}

/*!
 * \brief The output's layout (a plain view, and the layout it is stored in): the planner's hint
 *        (KernelContext::output_hint) where it is float32 strides with unit stride along Dv and rows
 *        Dv apart or more, over the output's dims or over them with the batch dims split (the
 *        permute after attention's P @ V, [B, heads, M, Dv] to [B, M, heads, Dv], or TVM's torch
 *        frontend's [heads, M, Dv] reshaped to [1, heads, M, Dv] first, is then a view with row-major
 *        bytes and the output dense reads it with no copy); plain otherwise.  Sets the plan's
 *        per-batch output offsets (the batch index runs in the same order over either dims) and row
 *        stride.  A hint with an offset (a concat's later run) is not taken: the kernel is handed its
 *        buffer's first element.  Only with BYOC_HETERO_ATTENTION_OUT_VIEW=on (OutViewOn).
 */
std::pair<memory::desc, memory::desc> OutputView(const KernelContext& ctx, AttentionPlan* p) {
  const std::vector<int64_t>& out = ctx.output().shape;
  const memory::dims out_dims(out.begin(), out.end());
  memory::desc md = PlainDesc(out_dims);
  const memory::desc& hint = ctx.output_hint;
  if (OutViewOn() && !hint.is_zero() && hint.get_data_type() == memory::data_type::f32 &&
      SameOrSplitBatch(hint.get_dims(), out_dims) && hint.get_format_kind() == memory::format_kind::blocked &&
      hint.get_inner_nblks() == 0 && hint.get_submemory_offset() == 0) {
    const memory::dims s = hint.get_strides();
    if (s.back() == 1 && s[s.size() - 2] >= p->dv) md = hint;
  }
  const memory::dims dims = md.get_dims(), strides = md.get_strides();
  const std::vector<int64_t> batch(dims.begin(), dims.end() - 2);
  std::vector<int64_t> batch_strides;
  for (size_t d = 0; d < batch.size(); ++d) batch_strides.push_back(batch[d] == 1 ? 0 : strides[d]);
  p->out_off = BatchOffsets(batch, batch_strides);
  p->out_row_stride = strides[strides.size() - 2];
  return {PlainDesc(dims), md};
}

/*! \brief The host kernel with its output stored as OutputView chose (view plain, want \p stored). */
class AttentionKernel : public HostKernel {
 public:
  AttentionKernel(std::string label, HostFn fn, std::vector<memory::desc> inputs, memory::desc plain,
                  const memory::desc& stored)
      : HostKernel(std::move(label), "attention", std::move(fn), std::move(inputs), std::move(plain)) {
    output_.want = stored;
  }
};

}  // namespace

static std::unique_ptr<Kernel> BuildAttention(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  AttentionPlan p;
  p.scale = static_cast<float>(attrs.Float("scale", 1.0));
  const int64_t safe = attrs.Int("safe", 0);
  if (safe < 0 || safe > 2) attrs.Fail("safe", "expected 0, 1 or 2 (as softmax's), got " + std::to_string(safe));
  p.safe = static_cast<int>(safe);
  p.has_mask = attrs.Flag("has_mask", false);
  const int64_t block_rows = attrs.Int("block_rows", 0);
  if (block_rows < 0) attrs.Fail("block_rows", "expected >= 0 (0: sized by the kernel), got " + std::to_string(block_rows));
  ctx.ExpectInputCount(3 + p.has_mask, p.has_mask ? "q, k, v, mask" : "q, k, v");
  const std::vector<int64_t>& out = ctx.output().shape;
  if (out.size() < 2) ctx.Fail("output must have rank >= 2, got " + ShapeToString(out));
  const std::vector<int64_t> batch(out.begin(), out.end() - 2);
  p.q = ReadView(ctx, attrs, 0, "q_shape", "q_strides", batch);
  p.k = ReadView(ctx, attrs, 1, "k_shape", "k_strides", batch);
  p.v = ReadView(ctx, attrs, 2, "v_shape", "v_strides", batch);
  attrs.CheckNoUnknown();
  p.m = p.q.rows, p.d = p.q.cols, p.n = p.k.rows, p.dv = p.v.cols;
  if (p.k.cols != p.d || p.v.rows != p.n || out[out.size() - 2] != p.m || out.back() != p.dv) {
    ctx.Fail("q [M=" + std::to_string(p.m) + ", D=" + std::to_string(p.d) + "], k [N=" + std::to_string(p.k.rows) +
             ", D=" + std::to_string(p.k.cols) + "], v [" + std::to_string(p.v.rows) + ", " + std::to_string(p.v.cols) +
             "] do not make the output " + ShapeToString(out));
  }
  for (size_t d = 0; d < ctx.node().inputs.size(); ++d) {
    if (ctx.input(d).dtype != DType::kFloat32) ctx.Fail("input " + std::to_string(d) + " must be float32");
  }
  p.q_off = BatchOffsets(batch, p.q.batch_strides);
  p.k_off = BatchOffsets(batch, p.k.batch_strides);
  p.v_off = BatchOffsets(batch, p.v.batch_strides);
  std::vector<memory::desc> inputs;
  for (size_t d = 0; d < ctx.node().inputs.size(); ++d) inputs.push_back(PlainDescOf(ctx.input(d)));
  if (p.has_mask) {
    // the mask's plain strides, ranks aligned by leading 1s, 0 along broadcast dims
    const std::vector<int64_t>& ms = ctx.input(3).shape;
    const size_t rank = out.size();
    std::vector<int64_t> scores(batch);
    scores.push_back(p.m);
    scores.push_back(p.n);
    if (ms.size() > rank) ctx.Fail("mask " + ShapeToString(ms) + " has a higher rank than the scores");
    std::vector<int64_t> strides(rank, 0);
    int64_t step = 1;
    for (size_t i = ms.size(); i-- > 0;) {
      const size_t d = rank - ms.size() + i;
      if (ms[i] != scores[d] && ms[i] != 1) {
        ctx.Fail("mask " + ShapeToString(ms) + " does not broadcast to the scores " + ShapeToString(scores));
      }
      strides[d] = ms[i] == 1 ? 0 : step;
      step *= ms[i];
    }
    p.mask_off = BatchOffsets(batch, std::vector<int64_t>(strides.begin(), strides.end() - 2));
    p.mask_row_stride = strides[rank - 2];
    p.mask_col_stride = strides[rank - 1];
  }
  p.rows = block_rows > 0 ? std::min(block_rows, p.m) : RowsPerBlock(p.m, p.n);
  p.pack = p.m > p.rows;  // more than one block per head reads K and V: copy them once
  if (p.pack) {
    DistinctOffsets(p.k_off, &p.k_slot, &p.k_src);
    DistinctOffsets(p.v_off, &p.v_slot, &p.v_src);
  }
  p.isa = AttentionIsa();
  const std::string label = ctx.where();
  const std::pair<memory::desc, memory::desc> stored = OutputView(ctx, &p);
  auto plan = std::make_shared<const AttentionPlan>(std::move(p));
  return std::make_unique<AttentionKernel>(
      label, [plan, label](const std::vector<void*>& ptrs) { RunAttention(*plan, label, ptrs); }, std::move(inputs),
      stored.first, stored.second);
}

BYOC_HETERO_REGISTER_KERNEL("attention", BuildAttention);

}  // namespace byoc_hetero
