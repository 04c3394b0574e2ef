/*!
 * \file kernels/kv_attention.cc
 * \brief kv_attention: one decoder layer's attention over a KV cache kept in place (generation,
 *        byoc_hetero/llm): RoPE at each sequence's position offset, the new K / V rows appended to
 *        the cache at that offset, causal (optionally sliding-window) attention of the new query rows
 *        over [0, offset + row], grouped-query heads.  No [S, S] mask, no copy of the cache.
 *
 * The packed function byoc_hetero.runtime.kv_attention, returning nothing: it writes q, k_cache and
 * v_cache in place.  The step function calls it from a TIR function (T.call_packed with the
 * buffers) that Relax calls with R.call_tir_inplace, inplace_indices [0, 3, 4]: the in-place writes
 * are declared in the IR, not a side effect hidden from it (byoc_hetero/llm/model.py):
 *
 *   kv_attention(q, k, v, k_cache, v_cache, past, lengths, inv_freq, scale, window, rope_scale)
 *
 *   q         [B, S, H, D]   float32, the query rows before RoPE; the output is written here (in place:
 *             or [B, 1, H, D]  each row's output is computed from its own q row, read first). With one row
 *                            while k and v have S > 1 (the last layer of a prefill, whose other rows
 *                            nothing reads: model.py's LAST_LAYER_VARIABLE), q holds each sequence's last
 *                            new row alone (position past[b] + lengths[b] - 1): every new K / V row is
 *                            appended as usual and only that row attends (a decode step's work)
 *   k, v      [B, S, KV, D]  float32, the new key (before RoPE) and value rows
 *   k_cache,  [B, KV, M, D]  float32, written in place: row past[b] + s of sequence b gets the rotated
 *   v_cache                  k / the v of new row s, for s < lengths[b]; nothing else is written
 *   past      [B] int64      tokens already in each sequence's cache
 *   lengths   [B] int64      new rows of each sequence (<= S; rows from lengths[b] on are padding:
 *                            their output is 0 and they write no cache row)
 *   inv_freq  [D / 2] float32  RoPE's inverse frequencies (transformers' rotary init for the config)
 *   scale     float  softmax scale (1 / sqrt(D) for these models)
 *   window    int    sliding window (key j is seen from position p when p - j < window), 0: none
 *   rope_scale float  factor on cos and sin (transformers' attention_scaling, 1 for the default RoPE)
 *
 * Every argument is checked before anything is written: a sequence whose past + length exceeds M,
 * a negative past or length, a length above S is an InputError naming the sequence; shapes and
 * dtypes that do not fit a ValueError naming the argument.  Numerics: RoPE as transformers computes
 * it (float32 angle = position * inv_freq, cos / sin in float32; computed once per new row and
 * shared by its heads), scores scaled and soft-maxed with their maximum subtracted (f32
 * throughout), so results match torch within rounding.  The angles' rows are kept by position across calls
 * (RopeTable, per calling thread: every layer of a decoder and every later step reads the same ones;
 * BYOC_HETERO_KV_ROPE=call computes this call's rows alone, as before).  The per-row attention (head_dim dot
 * products, exp, the weighted value sum) is kv_attention_micro.cc's AVX-512 / AVX2 / generic
 * implementation, chosen when a region node is built or per packed call (BYOC_HETERO_KV_ISA caps it).
 * A call of many new rows runs the blocked form where the ISA has one (AVX-512): each sequence's keys
 * transposed once per kv head, then tasks of about 64 query vectors (rows times the heads of one kv head's
 * group) whose tiles read each key and value row once for 8 / 4 vectors (BYOC_HETERO_KV_TILES, read each call:
 * wide, the default, up to 3 blocks of 16 keys per score tile | narrow, one).  BYOC_HETERO_KV_PREFILL (read each
 * call) = auto (the default: from 16 rows, UseBlocks; quiet A/B, session 13) | blocked (from 2 rows) | rows
 * (never).  A decode step (one row) shares its heads among the threads as BYOC_HETERO_KV_DECODE says
 * (DecodeForm: grouped, the default, | rows | split).
 */
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../threading.h"
#include "kernel.h"
#include "kv_attention.h"
#include "softmax_exp.h"

namespace byoc_hetero {

namespace {

namespace ffi = tvm::ffi;

constexpr const char* kName = "byoc_hetero.runtime.kv_attention";
/*! \brief What BYOC_HETERO_KV_DECODE resolves to now (DecodeForm): what a decode step runs, for tests and reports. */
constexpr const char* kDecodeFormName = "byoc_hetero.runtime.kv_decode_form";
/*! \brief What BYOC_HETERO_KV_TILES resolves to now (KeyBlocks): the key blocks of a blocked prefill's score tile. */
constexpr const char* kTileBlocksName = "byoc_hetero.runtime.kv_tile_blocks";

using Shape = std::vector<int64_t>;

std::string ShapeText(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/*! \brief The geometry of one call, read from the arguments' shapes. */
struct KvGeometry {
  int64_t batch = 0, rows = 0, heads = 0, kv_heads = 0, dim = 0, max_length = 0;
  int64_t q_rows = 0;  // rows, or 1: the query of each sequence's last new row alone (file comment)
  /*! \brief Whether q holds each sequence's last new row alone (one query row, more new K / V rows). */
  bool LastOnly() const { return q_rows != rows; }
};

const DLTensor& TensorArg(const ffi::PackedArgs& args, int i, const char* name, int ndim, DLDataTypeCode code,
                          int bits) {
  std::optional<DLTensor*> dl = args[i].try_cast<DLTensor*>();
  if (!dl.has_value() || *dl == nullptr) {
    TVM_FFI_THROW(ValueError) << kName << ": argument " << i << " (" << name << ") must be a tensor, got "
                              << args[i].GetTypeKey();
  }
  const DLTensor& t = **dl;
  if (t.ndim != ndim || t.dtype.code != code || t.dtype.bits != bits || t.dtype.lanes != 1) {
    TVM_FFI_THROW(ValueError) << kName << ": " << name << " must be a rank-" << ndim << " "
                              << (code == kDLFloat ? "float" : "int") << bits << " tensor, got rank " << t.ndim
                              << " shape " << ShapeText(Shape(t.shape, t.shape + t.ndim)) << " dtype code " << int(t.dtype.code) << " bits "
                              << int(t.dtype.bits);
  }
  if (t.strides != nullptr) {
    int64_t step = 1;
    for (int d = ndim; d-- > 0;) {
      if (t.shape[d] != 1 && t.strides[d] != step) {
        TVM_FFI_THROW(ValueError) << kName << ": " << name << " must be contiguous (row-major)";
      }
      step *= t.shape[d];
    }
  }
  if (t.device.device_type != kDLCPU) TVM_FFI_THROW(ValueError) << kName << ": " << name << " is not on the CPU";
  return t;
}

template <typename T>
T* Data(const DLTensor& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data) + t.byte_offset);
}

void ExpectShape(const Shape& shape, const char* name, const Shape& want, const std::string& where) {
  if (shape != want) {
    TVM_FFI_THROW(ValueError) << where << ": " << name << " must have shape " << ShapeText(want) << ", got "
                              << ShapeText(shape);
  }
}

/*!
 * \brief The geometry of q, k, v, k_cache, v_cache, past, lengths, inv_freq (ranks 4, 4, 4, 4, 4, 1, 1, 1
 *        checked by the caller); every shape checked against it.
 */
KvGeometry CheckShapes(const std::vector<Shape>& s, const std::string& where) {
  KvGeometry g{s[0][0], s[1][1], s[0][2], s[1][2], s[0][3], s[3][2], s[0][1]};
  if (g.q_rows != g.rows && g.q_rows != 1) {
    TVM_FFI_THROW(ValueError) << where << ": q has " << g.q_rows << " rows and k " << g.rows
                              << " (expected as many, or 1: each sequence's last new row alone)";
  }
  const char* names[] = {"q", "k", "v", "k_cache", "v_cache", "past", "lengths", "inv_freq"};
  const std::vector<Shape> want = {s[0], {g.batch, g.rows, g.kv_heads, g.dim}, {g.batch, g.rows, g.kv_heads, g.dim},
                                   {g.batch, g.kv_heads, g.max_length, g.dim},
                                   {g.batch, g.kv_heads, g.max_length, g.dim}, {g.batch}, {g.batch}, {g.dim / 2}};
  for (size_t k = 1; k < want.size(); ++k) ExpectShape(s[k], names[k], want[k], where);
  if (g.kv_heads == 0 || g.heads % g.kv_heads != 0 || g.dim % 2 != 0) {
    TVM_FFI_THROW(ValueError) << where << ": " << g.heads << " query heads over " << g.kv_heads
                              << " kv heads of dim " << g.dim << " (expected a whole group per kv head, even dim)";
  }
  return g;
}

/*! \brief Past and lengths within the cache: checked for every sequence before any write. */
void CheckOffsets(const KvGeometry& g, const int64_t* past, const int64_t* lengths, const std::string& where) {
  for (int64_t b = 0; b < g.batch; ++b) {
    if (past[b] < 0 || lengths[b] < 0 || lengths[b] > g.rows) {
      TVM_FFI_THROW(InputError) << where << ": sequence " << b << " has past " << past[b] << " and " << lengths[b]
                                << " new tokens (expected past >= 0 and 0 <= new <= " << g.rows << ")";
    }
    if (past[b] + lengths[b] > g.max_length) {
      TVM_FFI_THROW(InputError) << where << ": sequence " << b << " would grow to " << past[b] + lengths[b]
                                << " tokens, past the cache's max_length " << g.max_length;
    }
  }
}

/*! \brief y = rope(x): transformers' x * cos + rotate_half(x) * sin, with cs = the position's half
 *         cosines then half sines (rope_scale applied); x and y do not overlap. */
void Rotate(const float* x, float* y, const float* cs, int64_t half) {
  // x and y never overlap (a q / k row into scratch or the cache): vector lanes, the same products and sums
#pragma omp simd
  for (int64_t j = 0; j < half; ++j) {
    const float c = cs[j], s = cs[half + j];
    const float lo = x[j], hi = x[j + half];
    y[j] = lo * c + (-hi) * s;
    y[j + half] = hi * c + lo * s;
  }
}

struct KvCall {
  KvGeometry g;
  const float* q;
  float *out, *kc, *vc;
  const float *k, *v, *inv;
  const int64_t *past, *lengths;
  float scale, rope_scale;
  int64_t window;
  kv::RowFn row;
  kv::BlockFn block;  // the blocked form of many rows, or null (kv_attention.h)
  /*! \brief Per position p: D / 2 cosines then D / 2 sines of angle p * inv_freq, times rope_scale, at cs + p * D
   *         (Angles: the rows of every new row's position, at least). */
  const float* cs = nullptr;
  int key_blocks = 1;  // the blocked form's key blocks per score tile (KeyBlocks)
};

/*! \brief The RoPE row (cosines, then sines) of new row \p s of sequence \p b: its position's. */
inline const float* RopeRow(const KvCall& c, int64_t b, int64_t s) { return c.cs + (c.past[b] + s) * c.g.dim; }

/*! \brief cs[p * 2 * half ...] for positions p in [from, to): half cosines, then half sines of p * inv (times scale),
 *         the float32 angle and std::cos / std::sin as transformers' rotary embedding computes them. */
void AngleRows(const float* inv, int64_t half, float scale, int64_t from, int64_t to, float* cs, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && to - from >= 256)
  for (int64_t pos = from; pos < to; ++pos) {
    float* row = cs + pos * 2 * half;
    for (int64_t j = 0; j < half; ++j) {
      const float angle = static_cast<float>(pos) * inv[j];
      row[j] = std::cos(angle) * scale;
      row[half + j] = std::sin(angle) * scale;
    }
  }
}

/*! \brief RoPE's rows by position, kept per calling thread across calls: every layer of a decoder (one inv_freq,
 *         one rope_scale) and every step after a prefill reads the same rows, which were 2 * D / 2 std::cos /
 *         std::sin per new row a layer (a 1024-token prefill of a 24-layer model: 1.6 M of them, on one thread).
 *         Grown to twice the positions asked when short (a decode step's one more position computes none most
 *         steps); made again when inv_freq (its bytes), rope_scale or the head dim differ from the last call's. */
class RopeTable {
 public:
  const float* Rows(const float* inv, int64_t half, float scale, int64_t positions, int threads) {
    const bool same = half == half_ && std::memcmp(&scale, &scale_, sizeof(float)) == 0 &&
                      std::memcmp(inv, inv_.data(), sizeof(float) * static_cast<size_t>(half)) == 0;
    if (!same) {
      inv_.assign(inv, inv + half);
      half_ = half;
      scale_ = scale;
      rows_ = 0;
      cs_.clear();
    }
    if (positions > rows_) {
      const int64_t want = std::max(positions, 2 * rows_);
      cs_.resize(static_cast<size_t>(want * 2 * half));
      AngleRows(inv_.data(), half, scale, rows_, want, cs_.data(), threads);
      rows_ = want;
    }
    return cs_.data();
  }

 private:
  std::vector<float> inv_, cs_;
  int64_t half_ = -1, rows_ = 0;
  float scale_ = 0.f;
};

/*! \brief The variable choosing where RoPE's rows come from: table (the default: RopeTable, kept across calls) |
 *         call (computed for this call's new rows only, as before the table); read at each call. */
constexpr const char* kRopeVariable = "BYOC_HETERO_KV_ROPE";

/*! \brief c.cs: the RoPE rows of every real new row's position, from the calling thread's RopeTable, or (\p own,
 *         BYOC_HETERO_KV_ROPE=call) computed for this call's rows alone. */
void Angles(KvCall* c, std::vector<float>* own, int threads) {
  const KvGeometry& g = c->g;
  const int64_t half = g.dim / 2;
  int64_t positions = 0;
  for (int64_t b = 0; b < g.batch; ++b) positions = std::max(positions, c->past[b] + c->lengths[b]);
  const char* env = std::getenv(kRopeVariable);
  const std::string mode = env == nullptr || *env == '\0' ? "table" : env;
  if (mode != "table" && mode != "call") {
    TVM_FFI_THROW(ValueError) << kRopeVariable << " must be table or call, got '" << mode << "'";
  }
  if (mode == "table") {
    thread_local RopeTable table;
    c->cs = table.Rows(c->inv, half, c->rope_scale, positions, threads);
    return;
  }
  own->resize(static_cast<size_t>(positions * g.dim));
  for (int64_t b = 0; b < g.batch; ++b) {
    AngleRows(c->inv, half, c->rope_scale, c->past[b], c->past[b] + c->lengths[b], own->data(), threads);
  }
  c->cs = own->data();
}

/*! \brief Append the new K (rotated) / V rows of every sequence at its offset. */
void Append(const KvCall& c) {
  const KvGeometry& g = c.g;
  const int64_t d = g.dim;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t s = 0; s < c.lengths[b]; ++s) {
      const int64_t pos = c.past[b] + s;
      for (int64_t h = 0; h < g.kv_heads; ++h) {
        const int64_t src = ((b * g.rows + s) * g.kv_heads + h) * d;
        const int64_t dst = ((b * g.kv_heads + h) * g.max_length + pos) * d;
        Rotate(c.k + src, c.kc + dst, RopeRow(c, b, s), d / 2);
        std::memcpy(c.vc + dst, c.v + src, sizeof(float) * d);
      }
    }
  }
}

/*! \brief One query row (sequence b, new row s, head h; q's row qs of the sequence: s, or 0 where q holds the last
 *         new row alone) over its keys, written to its output row (which may be its q row: q is read first). */
void AttendRow(const KvCall& c, int64_t b, int64_t s, int64_t qs, int64_t h, std::vector<float>* scratch) {
  const KvGeometry& g = c.g;
  const int64_t d = g.dim;
  const int64_t row = ((b * g.q_rows + qs) * g.heads + h) * d;
  float* out = c.out + row;
  if (s < 0 || s >= c.lengths[b]) {
    std::fill(out, out + d, 0.f);
    return;
  }
  const int64_t pos = c.past[b] + s;
  const int64_t first = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
  const int64_t kvh = h / (g.heads / g.kv_heads);
  if (scratch->size() < static_cast<size_t>(d + pos + 1)) scratch->resize(static_cast<size_t>(d + pos + 1));
  float* qr = scratch->data();
  Rotate(c.q + row, qr, RopeRow(c, b, s), d / 2);
  const kv::RowJob job{qr, c.kc + (b * g.kv_heads + kvh) * g.max_length * d,
                       c.vc + (b * g.kv_heads + kvh) * g.max_length * d, first, pos, d, c.scale, qr + d, out};
  c.row(job);
}

/*! \brief The \p n keys of one kv head (row j at keys + j * dim) transposed into kt (kv_attention.h's kKeyBlock
 *         layout), the last block's lanes past n zero. */
void TransposeKeys(const float* keys, int64_t n, int64_t dim, float* kt) {
  for (int64_t blk = 0; blk * kv::kKeyBlock < n; ++blk) {
    float* dst = kt + blk * kv::kKeyBlock * dim;
    const int64_t j0 = blk * kv::kKeyBlock, m = std::min<int64_t>(kv::kKeyBlock, n - j0);
    for (int64_t e = 0; e < dim; ++e) {
      for (int64_t i = 0; i < m; ++i) dst[e * kv::kKeyBlock + i] = keys[(j0 + i) * dim + e];
      for (int64_t i = m; i < kv::kKeyBlock; ++i) dst[e * kv::kKeyBlock + i] = 0.f;
    }
  }
}

/*! \brief One task of the blocked form: new rows [s0, s1) of sequence b, the query heads of kv head kvh. */
struct BlockTask {
  int64_t b, kvh, s0, s1;
};

/*! \brief A thread's scratch for its block tasks, kept across calls. */
struct BlockScratch {
  std::vector<float> q, scores;
  std::vector<int64_t> first, last;
  std::vector<float*> out;
};

/*! \brief One block task: its query rows rotated (read before its outputs, which may overwrite them, are
 *         written; no other task reads them), their key ranges, then the blocked attention (kv_attention.h). */
void AttendBlock(const KvCall& c, const BlockTask& t, const float* kt, int64_t blocks, BlockScratch* w) {
  const KvGeometry& g = c.g;
  const int64_t d = g.dim, group = g.heads / g.kv_heads, count = (t.s1 - t.s0) * group;
  w->q.resize(static_cast<size_t>(count * d));
  w->first.resize(static_cast<size_t>(count));
  w->last.resize(static_cast<size_t>(count));
  w->out.resize(static_cast<size_t>(count));
  for (int64_t s = t.s0; s < t.s1; ++s) {
    const int64_t pos = c.past[t.b] + s;
    const int64_t first = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
    for (int64_t gi = 0; gi < group; ++gi) {
      const int64_t i = (s - t.s0) * group + gi;
      const int64_t row = ((t.b * g.rows + s) * g.heads + t.kvh * group + gi) * d;
      Rotate(c.q + row, w->q.data() + i * d, RopeRow(c, t.b, s), d / 2);
      w->first[i] = first;
      w->last[i] = pos;
      w->out[i] = c.out + row;
    }
  }
  kv::BlockJob job{w->q.data(), w->first.data(), w->last.data(), count, d,
                   kt + (t.b * g.kv_heads + t.kvh) * blocks * kv::kKeyBlock * d,
                   c.vc + (t.b * g.kv_heads + t.kvh) * g.max_length * d, c.scale, nullptr, w->out.data(),
                   c.key_blocks};
  w->scores.resize(static_cast<size_t>(count * kv::BlockScoreStride(job)));
  job.scores = w->scores.data();
  c.block(job);
}

/*! \brief The block tasks of a call: about kBlockVectors query vectors each, the costliest (latest rows) first. */
std::vector<BlockTask> BlockTasks(const KvCall& c) {
  constexpr int64_t kBlockVectors = 64;
  const KvGeometry& g = c.g;
  const int64_t rows = std::max<int64_t>(1, kBlockVectors / (g.heads / g.kv_heads));
  std::vector<BlockTask> tasks;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t s0 = 0; s0 < c.lengths[b]; s0 += rows) {
      for (int64_t h = 0; h < g.kv_heads; ++h) tasks.push_back({b, h, s0, std::min(s0 + rows, c.lengths[b])});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [&](const BlockTask& x, const BlockTask& y) {
    return c.past[x.b] + x.s1 > c.past[y.b] + y.s1;
  });
  return tasks;
}

/*! \brief The blocked form: each sequence's keys transposed per kv head, the block tasks taken dynamically
 *         (their costs differ: a later row sees more keys), padding rows' outputs 0. */
void RunBlocks(const KvCall& c, int threads) {
  const KvGeometry& g = c.g;
  int64_t keys = 0;
  for (int64_t b = 0; b < g.batch; ++b) keys = std::max(keys, c.past[b] + c.lengths[b]);
  const int64_t blocks = (keys + kv::kKeyBlock - 1) / kv::kKeyBlock, heads = g.batch * g.kv_heads;
  // the transposed keys, shared by the threads; the call's own (a batch of long sequences makes it large)
  std::vector<float> kt(static_cast<size_t>(heads * blocks * kv::kKeyBlock * g.dim));
  const std::vector<BlockTask> tasks = BlockTasks(c);
  const int64_t count = static_cast<int64_t>(tasks.size());
  float* kt_data = kt.data();
#pragma omp parallel num_threads(threads)
  {
    thread_local BlockScratch scratch;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / g.kv_heads;
      TransposeKeys(c.kc + bh * g.max_length * g.dim, c.past[b] + c.lengths[b], g.dim,
                    kt_data + bh * blocks * kv::kKeyBlock * g.dim);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < count; ++t) AttendBlock(c, tasks[static_cast<size_t>(t)], kt_data, blocks, &scratch);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < g.batch; ++b) {
      const int64_t width = g.heads * g.dim;
      std::fill(c.out + (b * g.rows + c.lengths[b]) * width, c.out + (b + 1) * g.rows * width, 0.f);
    }
  }
}

/*! \brief Whether this call runs the blocked form (where the ISA has one): BYOC_HETERO_KV_PREFILL (read each
 *         call) = blocked for 2 rows or more, rows never, auto (the default) for kAutoBlockedRows rows or more. */
bool UseBlocks(const KvCall& c) {
  // Quiet A/B, Skylake-SP AVX-512, 2 threads (bench/kv_attention_isa.py --prefill, bench/GENERATE.md session 13):
  // blocked / rows at SmolLM and Llama-1B shapes 0.77-0.93x at 4 rows, 1.17-1.29x at 16, 1.5-1.8x at 128, 2.4-2.5x
  // at 1024.
  constexpr int64_t kAutoBlockedRows = 16;
  const char* env = std::getenv(kv::kPrefillVariable);
  const std::string mode = env == nullptr || *env == '\0' ? "auto" : env;
  if (mode != "auto" && mode != "blocked" && mode != "rows") {
    TVM_FFI_THROW(ValueError) << kv::kPrefillVariable << " must be auto, blocked or rows, got '" << mode << "'";
  }
  if (c.block == nullptr || mode == "rows" || c.g.LastOnly()) return false;
  return c.g.rows >= (mode == "auto" ? kAutoBlockedRows : 2);
}

/*! \brief The blocked form's key blocks per score tile: BYOC_HETERO_KV_TILES (read each call) = wide (the
 *         default since session 15's quiet A/B: the prefill kernel 1.07-1.13x narrow at SmolLM, Qwen2.5-0.5B and
 *         Llama-1B shapes, 128 and 1024 rows, bench/GENERATE.md; kv::kMaxKeyBlocks) | narrow (1). */
int KeyBlocks() {
  const char* env = std::getenv(kv::kTileVariable);
  const std::string mode = env == nullptr || *env == '\0' ? "wide" : env;
  if (mode != "narrow" && mode != "wide") {
    TVM_FFI_THROW(ValueError) << kv::kTileVariable << " must be narrow or wide, got '" << mode << "'";
  }
  return mode == "wide" ? kv::kMaxKeyBlocks : 1;
}

/*! \brief The decode form BYOC_HETERO_KV_DECODE asks (read each call): grouped (the default since session 15's
 *         quiet A/B: the kernel 1.4-1.7x faster than rows at 128 and 1024 positions, bench/GENERATE.md) | rows
 *         (round robin, as a call of many rows) | split (kv_attention.h); another value is a ValueError. */
std::string DecodeForm() {
  const char* env = std::getenv(kv::kDecodeVariable);
  const std::string mode = env == nullptr || *env == '\0' ? "grouped" : env;
  if (mode != "grouped" && mode != "rows" && mode != "split") {
    TVM_FFI_THROW(ValueError) << kv::kDecodeVariable << " must be rows, grouped or split, got '" << mode << "'";
  }
  return mode;
}

/*! \brief How a call shares its work among the threads: a decode step (one new row) and a call whose q holds the
 *         last new row alone as DecodeForm says, a call of many rows round robin. */
std::string DecodeMode(const KvCall& c) {
  const std::string mode = DecodeForm();
  return c.g.q_rows == 1 ? mode : "rows";
}

/*! \brief split: one head of a decode step over run \p run of \p runs of its keys, into \p slot (dim floats: the
 *         run's softmax output, then its largest score and exp sum; an empty run or a stopped sequence: sum 0). */
void AttendRun(const KvCall& c, int64_t bh, int64_t run, int64_t runs, float* slot) {
  const KvGeometry& g = c.g;
  const int64_t d = g.dim, b = bh / g.heads, h = bh % g.heads;
  float* stats = slot + d;
  stats[0] = -INFINITY;
  stats[1] = 0.f;
  if (c.lengths[b] == 0) return;
  const int64_t pos = c.past[b] + c.lengths[b] - 1;  // the last new row (a decode step's only one)
  const int64_t first = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0, keys = pos - first + 1;
  const int64_t lo = first + keys * run / runs, hi = first + keys * (run + 1) / runs - 1;
  if (hi < lo) return;
  thread_local std::vector<float> scratch;  // the rotated q row and the scores, kept across calls
  if (scratch.size() < static_cast<size_t>(d + pos + 1)) scratch.resize(static_cast<size_t>(d + pos + 1));
  float* qr = scratch.data();
  Rotate(c.q + bh * d, qr, RopeRow(c, b, c.lengths[b] - 1), d / 2);  // q_rows == 1: row (b, 0, h) at bh * d
  const int64_t kvh = h / (g.heads / g.kv_heads);
  const kv::RowJob job{qr, c.kc + (b * g.kv_heads + kvh) * g.max_length * d,
                       c.vc + (b * g.kv_heads + kvh) * g.max_length * d, lo, hi, d, c.scale, qr + d, slot, stats};
  c.row(job);
}

/*! \brief split: head \p bh's output from its runs' (AttendRun): each run's output weighted by its exp sum times
 *         exp(its max - the largest max), over the sum of those weights; a stopped sequence's output 0, and NaN
 *         where a run's sum is NaN (a NaN or +inf score: the per-row forms' output is NaN there too). */
void MergeRuns(const KvCall& c, int64_t bh, int64_t runs, const float* part) {
  const int64_t d = c.g.dim, slot = d + 2, heads = c.g.batch * c.g.heads;
  float* out = c.out + bh * d;
  float top = -INFINITY;
  for (int64_t r = 0; r < runs; ++r) {
    const float* stats = part + (r * heads + bh) * slot + d;
    if (std::isnan(stats[1])) {
      std::fill(out, out + d, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    if (stats[1] > 0.f) top = std::max(top, stats[0]);
  }
  std::fill(out, out + d, 0.f);
  if (top == -INFINITY) return;  // a stopped sequence: no row
  float total = 0.f;
  for (int64_t r = 0; r < runs; ++r) {
    const float* o = part + (r * heads + bh) * slot;
    if (o[d + 1] <= 0.f) continue;
    const float w = o[d + 1] * softmax_exp::ExpNonPositive1(o[d] - top);
    total += w;
    for (int64_t e = 0; e < d; ++e) out[e] += w * o[e];
  }
  const float inv = 1.f / total;
  for (int64_t e = 0; e < d; ++e) out[e] *= inv;
}

/*! \brief split: the runs of a decode step (kSplitKeys keys or more each, at most one per thread; one: 0). */
int64_t SplitRuns(const KvCall& c, int threads) {
  int64_t keys = 0;
  for (int64_t b = 0; b < c.g.batch; ++b) {
    // the last new row's position (a decode step's only row; a stopped sequence's past)
    const int64_t pos = c.past[b] + std::max<int64_t>(c.lengths[b], 1) - 1;
    const int64_t first = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
    keys = std::max(keys, pos - first + 1);
  }
  const int64_t runs = std::min<int64_t>(threads, keys / kv::kSplitKeys);
  return runs >= 2 ? runs : 0;
}

/*! \brief split: tasks (run, sequence, head), run-major in contiguous shares (thread i: run i of every head, a
 *         group's heads one after the other), the runs' outputs in a buffer of the call (q, which the outputs
 *         overwrite, is read by every run first), then merged per head. */
void RunSplit(const KvCall& c, int threads, int64_t runs) {
  const int64_t heads = c.g.batch * c.g.heads, slot = c.g.dim + 2, tasks = runs * heads;
  std::vector<float> part(static_cast<size_t>(tasks * slot));
  float* data = part.data();
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) AttendRun(c, t % heads, t / heads, runs, data + t * slot);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) MergeRuns(c, bh, runs, data);
  }
}

/*! \brief The per-row form: each (sequence, new row, head) a task of its own. */
void RunRows(const KvCall& c, int threads) {
  const int64_t tasks = c.g.batch * c.g.q_rows * c.g.heads;
  auto attend = [&c](int64_t t) {
    thread_local std::vector<float> scratch;  // the rotated q row and the scores, kept across calls
    const int64_t b = t / (c.g.q_rows * c.g.heads), qs = (t / c.g.heads) % c.g.q_rows;
    AttendRow(c, b, c.g.LastOnly() ? c.lengths[b] - 1 : qs, qs, t % c.g.heads, &scratch);
  };
  const std::string mode = DecodeMode(c);
  if (const int64_t runs = mode == "split" ? SplitRuns(c, threads) : 0) {
    RunSplit(c, threads, runs);
    return;
  }
  if (mode != "rows") {
    // grouped (or split of a short context): a sequence's heads see the same keys, so contiguous shares are
    // even, and they keep the query heads of a kv head (its group, adjacent) on one thread one after the other:
    // the group's keys and values come from memory once, then from that core's cache, where round robin has
    // every thread read every kv head's rows
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < tasks; ++t) attend(t);
    return;
  }
  // round robin: a row's cost grows with its position (the keys it sees), so contiguous halves of a
  // prefill's rows would give the second thread about three times the first one's work
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int64_t t = 0; t < tasks; ++t) attend(t);
}

/*! \brief The whole call: offsets checked (before any write), angles, rows appended, query rows attended. */
void Run(KvCall& c, const std::string& where, int max_threads) {
  CheckOffsets(c.g, c.past, c.lengths, where);
  std::vector<float> own;  // BYOC_HETERO_KV_ROPE=call: this call's RoPE rows
  Angles(&c, &own, max_threads);
  Append(c);
  const int64_t tasks = c.g.batch * c.g.q_rows * c.g.heads;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_threads, tasks)));
  c.key_blocks = KeyBlocks();  // read (and checked) at every call, as the prefill form is
  if (UseBlocks(c)) {
    RunBlocks(c, threads);
  } else {
    RunRows(c, threads);
  }
}

void KvAttention(ffi::PackedArgs args, ffi::Any* rv) {
  if (args.size() != 11) {
    TVM_FFI_THROW(ValueError) << kName << ": expected 11 arguments (q, k, v, k_cache, v_cache, past, lengths, "
                              << "inv_freq, scale, window, rope_scale), got " << args.size();
  }
  const DLTensor& q = TensorArg(args, 0, "q", 4, kDLFloat, 32);
  const DLTensor& k = TensorArg(args, 1, "k", 4, kDLFloat, 32);
  const DLTensor& v = TensorArg(args, 2, "v", 4, kDLFloat, 32);
  const DLTensor& kc = TensorArg(args, 3, "k_cache", 4, kDLFloat, 32);
  const DLTensor& vc = TensorArg(args, 4, "v_cache", 4, kDLFloat, 32);
  const DLTensor& past = TensorArg(args, 5, "past", 1, kDLInt, 64);
  const DLTensor& lengths = TensorArg(args, 6, "lengths", 1, kDLInt, 64);
  const DLTensor& inv = TensorArg(args, 7, "inv_freq", 1, kDLFloat, 32);
  std::vector<Shape> shapes;
  for (const DLTensor* t : {&q, &k, &v, &kc, &vc, &past, &lengths, &inv}) shapes.emplace_back(t->shape, t->shape + t->ndim);
  KvCall c{CheckShapes(shapes, kName),
           Data<float>(q), Data<float>(q), Data<float>(kc), Data<float>(vc), Data<float>(k), Data<float>(v),
           Data<float>(inv), Data<int64_t>(past), Data<int64_t>(lengths),
           static_cast<float>(args[8].cast<double>()), static_cast<float>(args[10].cast<double>()),
           args[9].cast<int64_t>(), kv::FindRowFn(SelectSimdIsa(kv::kIsaVariable)),
           kv::FindBlockFn(SelectSimdIsa(kv::kIsaVariable)), {}};
  Run(c, kName, RegionThreads());
}

}  // namespace

/*! \brief The region node: inputs q, k, v, k_cache, v_cache, past, lengths, inv_freq; attrs scale, window,
 *         rope_scale; output [B, S, H, D]; k_cache and v_cache written in place (writes_inputs). */
static std::unique_ptr<Kernel> BuildKvAttention(const KernelContext& ctx) {
  ctx.ExpectInputCount(8, "q, k, v, k_cache, v_cache, past, lengths, inv_freq");
  AttrReader attrs(ctx.graph, ctx.node_index);
  const double scale = attrs.Float("scale", 1.0), rope_scale = attrs.Float("rope_scale", 1.0);
  const int64_t window = attrs.Int("window", 0);
  attrs.CheckNoUnknown();
  if (!std::isfinite(scale) || !std::isfinite(rope_scale)) attrs.Fail("scale", "expected finite scale and rope_scale");
  if (window < 0) attrs.Fail("window", "expected >= 0 (0: no sliding window)");
  const size_t ranks[] = {4, 4, 4, 4, 4, 1, 1, 1};
  const char* names[] = {"q", "k", "v", "k_cache", "v_cache", "past", "lengths", "inv_freq"};
  std::vector<Shape> shapes;
  std::vector<memory::desc> inputs;
  for (size_t k = 0; k < 8; ++k) {
    ctx.ExpectRank(k, names[k], ranks[k]);
    const DType want = k == 5 || k == 6 ? DType::kInt64 : DType::kFloat32;
    if (ctx.input(k).dtype != want) {
      ctx.Fail(std::string(names[k]) + " is " + DTypeName(ctx.input(k).dtype) + ", expected " + DTypeName(want));
    }
    shapes.push_back(ctx.input(k).shape);
    inputs.push_back(PlainDescOf(ctx.input(k)));  // plain: the caches are read and written where the caller has them
  }
  const KvGeometry g = CheckShapes(shapes, ctx.where());
  ctx.ExpectOutputShape(shapes[0]);
  const std::string where = ctx.where();
  const int threads = ctx.threads;
  const SimdIsa isa = SelectSimdIsa(kv::kIsaVariable);
  const kv::RowFn row = kv::FindRowFn(isa);
  const kv::BlockFn block = kv::FindBlockFn(isa);
  HostFn fn = [g, scale, rope_scale, window, where, threads, row, block](const std::vector<void*>& p) {
    auto f = [&](size_t k) { return static_cast<float*>(p[k]); };
    KvCall c{g, f(0), f(8), f(3), f(4), f(1), f(2), f(7), static_cast<const int64_t*>(p[5]),
             static_cast<const int64_t*>(p[6]), static_cast<float>(scale), static_cast<float>(rope_scale),
             window, row, block, {}};
    Run(c, where, threads);
  };
  return std::make_unique<HostKernel>(where, "kv_attention", std::move(fn), std::move(inputs),
                                      PlainDescOf(ctx.output()));
}

static KernelTraits KvAttentionTraits() {
  KernelTraits traits;
  traits.writes_inputs = {3, 4};
  return traits;
}

BYOC_HETERO_REGISTER_KERNEL("kv_attention", BuildKvAttention, KvAttentionTraits());

TVM_FFI_STATIC_INIT_BLOCK() {
  if (!ffi::Function::GetGlobal(kName).has_value()) {
    tvm::ffi::reflection::GlobalDef().def_packed(kName, KvAttention);
  }
  if (!ffi::Function::GetGlobal(kDecodeFormName).has_value()) {
    tvm::ffi::reflection::GlobalDef().def(kDecodeFormName, DecodeForm);
  }
  if (!ffi::Function::GetGlobal(kTileBlocksName).has_value()) {
    tvm::ffi::reflection::GlobalDef().def(kTileBlocksName, KeyBlocks);
  }
}

}  // namespace byoc_hetero
