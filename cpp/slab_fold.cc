/*!
 * \file slab_fold.cc
 * \brief See slab_fold.h.
 */
#include "slab_fold.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "weights.h"

namespace byoc_hetero {

namespace {

const MemRef* ArgOf(const PlannedStep& s, int arg) {
  for (const auto& [a, ref] : s.args) {
    if (a == arg) return &ref;
  }
  return nullptr;
}

/*! \brief The shared buffer a slot names, else -1. */
int SharedOf(const Plan& p, int slot) {
  return slot >= 0 && p.slots[slot].kind == SlotKind::kShared ? p.slots[slot].index : -1;
}

bool PlainF32(const memory::desc& md) {
  return md.get_data_type() == memory::data_type::f32 && md.get_format_kind() == memory::format_kind::blocked &&
         md.get_inner_nblks() == 0;
}

/*! \brief The product of \p md's inner blocks along dim \p d (1: not blocked along it). */
int64_t BlockOf(const memory::desc& md, int d) {
  int64_t block = 1;
  const memory::dims blks = md.get_inner_blks(), idxs = md.get_inner_idxs();
  for (size_t k = 0; k < blks.size(); ++k) block *= idxs[k] == d ? blks[k] : 1;
  return block;
}

/*! \brief The dim of \p md whose (outer) stride is the largest among those of more than one
 *         block, -1 when none or two share it: a run of its blocks is one contiguous range. */
int OutermostDim(const memory::desc& md) {
  const memory::dims strides = md.get_strides(), padded = md.get_padded_dims();
  int best = -1;
  bool tie = false;
  for (int d = 0; d < static_cast<int>(padded.size()); ++d) {
    if (padded[d] / BlockOf(md, d) <= 1) continue;
    if (best < 0 || strides[d] > strides[best]) {
      best = d;
      tie = false;
    } else if (strides[d] == strides[best]) {
      tie = true;
    }
  }
  return tie ? -1 : best;
}

int64_t Elements(const memory::dims& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

memory::dims With(memory::dims dims, int d, int64_t value) {
  dims[d] = value;
  return dims;
}

void* Advance(void* p, size_t bytes) { return static_cast<char*>(p) + bytes; }

/*! \brief The operands of a candidate pair, read off its steps. */
struct PairArgs {
  const MemRef* src[2];
  const MemRef* mid;   // the binary's output: the intermediate
  const MemRef* from;  // the reorder's source: the intermediate, in the dense's view
  const MemRef* to;
};

/*! \brief The pair's operands where steps \p i and \p j are a binary without post-ops writing
 *         buffer \p b and a reorder reading it, all plain float32 but the reorder's destination. */
std::optional<PairArgs> PairOperands(const Plan& p, size_t i, size_t j, int b) {
  const PlannedStep& bs = p.init_steps[i];
  const PlannedStep& rs = p.init_steps[j];
  if (bs.host || rs.host || !bs.pd || !rs.pd || bs.pd.get_kind() != dnnl::primitive::kind::binary ||
      rs.pd.get_kind() != dnnl::primitive::kind::reorder || bs.pd.get_primitive_attr().get_post_ops().len() != 0) {
    return std::nullopt;
  }
  PairArgs a{{ArgOf(bs, DNNL_ARG_SRC_0), ArgOf(bs, DNNL_ARG_SRC_1)}, ArgOf(bs, DNNL_ARG_DST),
             ArgOf(rs, DNNL_ARG_FROM), ArgOf(rs, DNNL_ARG_TO)};
  if (!a.src[0] || !a.src[1] || !a.mid || !a.from || !a.to) return std::nullopt;
  if (SharedOf(p, a.mid->slot) != b || SharedOf(p, a.from->slot) != b || SharedOf(p, a.src[0]->slot) == b ||
      SharedOf(p, a.src[1]->slot) == b || SharedOf(p, a.to->slot) == b) {
    return std::nullopt;
  }
  const memory::data_type out = a.to->md.get_data_type();
  if (!PlainF32(a.src[0]->md) || !PlainF32(a.src[1]->md) || !PlainF32(a.mid->md) || !PlainF32(a.from->md) ||
      (out != memory::data_type::f32 && out != memory::data_type::bf16) ||
      a.to->md.get_format_kind() != memory::format_kind::blocked) {
    return std::nullopt;
  }
  return a;
}

/*! \brief The binary and reorder primitives of a slab of \p n rows starting at row \p r0. */
SlabFold::Prims MakePrims(const SlabFold& f, const PairArgs& a, int e, int d, int64_t n, int64_t r0,
                          dnnl::algorithm alg, const dnnl::engine& engine, bool* at_border) {
  SlabFold::Prims pr;
  for (int k = 0; k < 2; ++k) {
    const memory::desc& md = a.src[k]->md;
    pr.src[k] = f.src_row_bytes[k] ? memory::desc(With(md.get_dims(), e, n), md.get_data_type(), md.get_strides())
                                   : md;
  }
  pr.mid = memory::desc(With(a.mid->md.get_dims(), e, n), memory::data_type::f32, a.mid->md.get_strides());
  pr.from = memory::desc(With(a.from->md.get_dims(), d, n), memory::data_type::f32, a.from->md.get_strides());
  const memory::dims to_dims = With(a.to->md.get_dims(), d, n);
  const memory::dims zeros(to_dims.size(), 0);
  *at_border = n % BlockOf(a.to->md, d) != 0;  // the last slab, cut inside a block: it names its own offset
  pr.to = a.to->md.submemory_desc(to_dims, *at_border ? With(zeros, d, r0) : zeros);
  pr.binary = dnnl::binary(dnnl::binary::primitive_desc(engine, alg, pr.src[0], pr.src[1], pr.mid));
  pr.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, pr.from, engine, pr.to));
  return pr;
}

/*! \brief The slab fold of binary step \p i and reorder step \p j through buffer \p b, or none. */
std::optional<SlabFold> MakeSlabFold(const Plan& p, size_t i, size_t j, int b, const dnnl::engine& engine,
                                     size_t slab_bytes) {
  const std::optional<PairArgs> args = PairOperands(p, i, j, b);
  if (!args) return std::nullopt;
  const PairArgs& a = *args;
  // the rows: the intermediate's outermost dim, which must be the outermost of the reorder's view of it and of the
  // destination's layout (a run of whole blocks along it is one contiguous range of the prepared copy)
  const int e = OutermostDim(a.mid->md), d = OutermostDim(a.from->md);
  const memory::dims mid = a.mid->md.get_dims(), mid_strides = a.mid->md.get_strides();
  const memory::dims from = a.from->md.get_dims(), from_strides = a.from->md.get_strides();
  if (e < 0 || d < 0 || OutermostDim(a.to->md) != d || mid[e] != from[d] || mid_strides[e] != from_strides[d] ||
      mid_strides[e] * mid[e] != Elements(mid) || Elements(from) != Elements(mid)) {
    return std::nullopt;
  }
  SlabFold f;
  f.binary = i;
  f.reorder = j;
  f.rows = mid[e];
  f.mid_row_bytes = static_cast<size_t>(mid_strides[e]) * sizeof(float);
  const int64_t block = BlockOf(a.to->md, d);
  f.slab = std::max<int64_t>(block, static_cast<int64_t>(slab_bytes / f.mid_row_bytes) / block * block);
  if (f.slab >= f.rows) return std::nullopt;  // one slab: nothing to gain
  for (int k = 0; k < 2; ++k) {
    const memory::dims dims = a.src[k]->md.get_dims(), strides = a.src[k]->md.get_strides();
    if (dims.size() != mid.size() || (dims[e] != f.rows && dims[e] != 1)) return std::nullopt;
    f.src_row_bytes[k] = dims[e] == 1 ? 0 : static_cast<size_t>(strides[e]) * sizeof(float);
    // a slab's rows are one range of the source's bytes (their pages can go back) when they are its outermost
    f.release[k] = f.src_row_bytes[k] != 0 && strides[e] * dims[e] == Elements(dims);
  }
  f.dst_slab_bytes = static_cast<size_t>(f.slab / block * a.to->md.get_strides()[d]) *
                     memory::data_type_size(a.to->md.get_data_type());
  const dnnl::algorithm alg = p.init_steps[i].pd.get_algorithm();
  try {
    bool border = false;
    f.full = MakePrims(f, a, e, d, f.slab, 0, alg, engine, &border);
    const int64_t tail = f.rows % f.slab;
    if (tail != 0) f.tail = MakePrims(f, a, e, d, tail, f.rows - tail, alg, engine, &f.tail_at_border);
  } catch (const dnnl::error&) {
    return std::nullopt;  // no slab primitive (a sub-memory oneDNN refuses): the pair runs whole
  }
  return f;
}

}  // namespace

size_t InitSlabBytes() {
  const char* env = std::getenv(kInitSlabVariable);
  if (env == nullptr || *env == '\0') return size_t{16} << 20;
  char* end = nullptr;
  const long long value = std::strtoll(env, &end, 10);
  if (end == env || *end != '\0' || value < 0) {
    TVM_FFI_THROW(ValueError) << kInitSlabVariable << " must be a byte count >= 0 (0: fold whole), got '" << env
                              << "'";
  }
  return static_cast<size_t>(value);
}

std::map<size_t, SlabFold> SlabFolds(const Plan& p, const std::vector<bool>& run, const dnnl::engine& engine,
                                     size_t slab_bytes) {
  std::map<size_t, SlabFold> out;
  if (slab_bytes == 0) return out;
  std::vector<std::vector<size_t>> touching(p.shared.size());  // the running init steps touching each buffer
  for (size_t i = 0; i < run.size(); ++i) {
    if (!run[i]) continue;
    for (const auto& [arg, ref] : p.init_steps[i].args) {
      const int b = SharedOf(p, ref.slot);
      if (b >= 0 && (touching[b].empty() || touching[b].back() != i)) touching[b].push_back(i);
    }
  }
  for (size_t b = 0; b < p.shared.size(); ++b) {
    if (p.shared[b].run || p.shared[b].constant >= 0 || touching[b].size() != 2) continue;
    std::optional<SlabFold> f = MakeSlabFold(p, touching[b][0], touching[b][1], static_cast<int>(b), engine, slab_bytes);
    if (f) out.emplace(f->reorder, std::move(*f));
  }
  return out;
}

void RunSlabFold(const SlabFold& f, const dnnl::engine& engine, dnnl::stream& stream, void* const src[2], void* to,
                 const std::vector<std::pair<uintptr_t, uintptr_t>>& mappings) {
  AlignedBuffer mid(static_cast<size_t>(f.slab) * f.mid_row_bytes, "an init slab of a folded weight");
  for (int64_t r0 = 0; r0 < f.rows; r0 += f.slab) {
    const int64_t n = std::min(f.slab, f.rows - r0);
    const SlabFold::Prims& pr = n == f.slab ? f.full : f.tail;
    void* from[2];
    for (int k = 0; k < 2; ++k) from[k] = Advance(src[k], static_cast<size_t>(r0) * f.src_row_bytes[k]);
    void* dst = n != f.slab && f.tail_at_border ? to : Advance(to, static_cast<size_t>(r0 / f.slab) * f.dst_slab_bytes);
    dnnl::memory s0(pr.src[0], engine, from[0]), s1(pr.src[1], engine, from[1]);
    dnnl::memory m(pr.mid, engine, mid.get()), m_from(pr.from, engine, mid.get()), m_to(pr.to, engine, dst);
    pr.binary.execute(stream, {{DNNL_ARG_SRC_0, s0}, {DNNL_ARG_SRC_1, s1}, {DNNL_ARG_DST, m}});
    pr.reorder.execute(stream, {{DNNL_ARG_FROM, m_from}, {DNNL_ARG_TO, m_to}});
    stream.wait();
    for (int k = 0; k < 2; ++k) {
      if (f.release[k]) ReleaseFilePages(from[k], static_cast<size_t>(n) * f.src_row_bytes[k], mappings);
    }
  }
}

}  // namespace byoc_hetero
