/*!
 * \file weights.cc
 * \brief See weights.h.
 */
#include "weights.h"

#include <sys/mman.h>
#include <unistd.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace byoc_hetero {

namespace {
/*! \brief Buffers from this size on are mappings of their own (weights.h). */
constexpr size_t kMapBytes = size_t{1} << 20;
/*! \brief A transparent huge page (x86-64), and the smallest mapping asked to use them. */
constexpr size_t kHugePage = size_t{1} << 21;

/*! \brief Whether BYOC_HETERO_HUGE_PAGES asks for huge pages (1 | 0, unset: 1: quiet A/B, Zen 5, 2 threads: the
 *         decode GEMVs 1.02-1.09x, SmolLM int8 / int4 decode 1.01-1.09x in 5 of 6 pairs, no RSS cost,
 *         bench/WEIGHT_ONLY.md); read per allocation. */
bool HugePagesAsked() {
  const char* env = std::getenv(kHugePagesVariable);
  if (env == nullptr || *env == '\0' || std::string(env) == "1") return true;
  if (std::string(env) == "0") return false;
  TVM_FFI_THROW(ValueError) << kHugePagesVariable << " must be 0 or 1, got '" << env << "'";
}

/*!
 * \brief \p bytes (a multiple of the page) of zero pages starting on a huge-page boundary, advised
 *        MADV_HUGEPAGE: a mapping one huge page longer, its unaligned head and tail unmapped again, so
 *        that every whole 2 MiB of the buffer can be one TLB entry.  The advice is advisory: where the
 *        kernel has no transparent huge pages the buffer keeps small ones.  MAP_FAILED on failure.
 */
void* MapHuge(size_t bytes) {
  void* raw = mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return raw;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + bytes + kHugePage, used = aligned + bytes;
  if (end > used) munmap(reinterpret_cast<void*>(used), end - used);
#if defined(MADV_HUGEPAGE)
  madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<void*>(aligned);
}
}  // namespace

void BufferFree::operator()(void* p) const {
  if (mapped > 0) {
    munmap(p, mapped);
  } else {
    std::free(p);
  }
}

AlignedBuffer::AlignedBuffer(size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded >= kMapBytes) {
    // page-aligned (so 64-byte aligned) zero pages, backed by memory only once written
    const bool huge = HugePagesAsked() && rounded >= kHugePage;  // the variable checked for every mapping
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    if (huge) rounded = (rounded + page - 1) / page * page;  // the unmapped tail starts on a page
    void* p = huge ? MapHuge(rounded)
                   : mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      TVM_FFI_THROW(RuntimeError) << what << ": out of memory: cannot map " << bytes << " bytes";
    }
    ptr_ = std::unique_ptr<void, BufferFree>(p, BufferFree{rounded});
    return;
  }
  ptr_.reset(std::aligned_alloc(64, rounded));
  if (!ptr_) {
    TVM_FFI_THROW(RuntimeError) << what << ": out of memory: cannot allocate " << bytes << " bytes";
  }
  std::memset(ptr_.get(), 0, rounded);
}

void AlignedBuffer::Discard() {
  const size_t mapped = ptr_.get_deleter().mapped;
  if (ptr_ && mapped > 0) madvise(ptr_.get(), mapped, MADV_DONTNEED);  // private anonymous: zero pages again
}

std::vector<std::pair<uintptr_t, uintptr_t>> ReadOnlyFileMappings() {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    // "begin-end perms offset dev inode [path]": a file's mapping has an inode other than 0. Shared and
    // read-only ("r--s", as Python's mmap ACCESS_READ and safetensors map): its pages are always the file's
    // (a private one made read-only after writes, as a library's relocated data, holds pages of its own)
    std::istringstream in(line);
    std::string range, perms, offset, dev;
    uint64_t inode = 0;
    if (!(in >> range >> perms >> offset >> dev >> inode) || inode == 0 || perms.size() < 4) continue;
    if (perms[0] != 'r' || perms[1] == 'w' || perms[3] != 's') continue;
    const size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    out.emplace_back(std::stoull(range.substr(0, dash), nullptr, 16), std::stoull(range.substr(dash + 1), nullptr, 16));
  }
  return out;
}

void ReleaseFilePages(const void* data, size_t bytes, const std::vector<std::pair<uintptr_t, uintptr_t>>& mappings) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + bytes;
  bool inside = false;
  for (const auto& [b, e] : mappings) inside = inside || (b <= begin && end <= e);
  if (!inside) return;
  const uintptr_t page = 4096, first = (begin + page - 1) / page * page, last = end / page * page;
  if (first < last) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // clean file pages
}

LookupPages::LookupPages() {
  const char* env = std::getenv(kLookupPagesVariable);
  if (env == nullptr || *env == '\0' || std::string(env) == "1") return;
  if (std::string(env) != "0") {
    TVM_FFI_THROW(ValueError) << kLookupPagesVariable << " must be 0 or 1, got '" << env << "'";
  }
  enabled_ = false;
}

bool LookupPages::Releases(const void* data, size_t bytes) {
  if (!enabled_ || data == nullptr || bytes == 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (data != checked_ || bytes != checked_bytes_) {  // new constants: /proc/self/maps read once for them
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + bytes;
    inside_ = false;
    for (const auto& [b, e] : ReadOnlyFileMappings()) inside_ = inside_ || (b <= begin && end <= e);
    checked_ = data;
    checked_bytes_ = bytes;
  }
  return inside_;
}

void LookupPages::Release(const void* data, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data), page = 4096;
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
  if (first < last) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // clean file pages
}

void PreparedWeights::SetConstants(const std::vector<const void*>& data, std::shared_ptr<const void> owner) {
  if (owner != nullptr && owner == owner_) return;
  constants_ = data;
  owner_ = std::move(owner);
  ++generation_;
}

PreparedWeights::Entry& PreparedWeights::Find(const SharedBuffer& b) {
  auto it = entries_.find(b.key);
  if (it == entries_.end()) {
    it = entries_.emplace(b.key, Entry{b.bytes, b.what}).first;
  } else if (it->second.bytes != b.bytes) {
    TVM_FFI_THROW(InternalError) << b.what << ": prepared weight '" << b.key << "' has " << it->second.bytes
                                 << " bytes, the plan wants " << b.bytes;
  }
  return it->second;
}

std::vector<void*> PreparedWeights::Reserve(const Plan& plan) {
  std::vector<void*> ptrs;
  for (const SharedBuffer& b : plan.shared) {
    if (b.constant >= 0) {  // the executor points at the constant's data when it has arrived
      ptrs.push_back(nullptr);
      continue;
    }
    Entry& e = Find(b);
    if (b.run && !e.allocated) {
      e.buffer = AlignedBuffer(b.bytes, b.what);
      e.allocated = true;
      e.filled = -1;
    }
    e.run = e.run || b.run;
    ptrs.push_back(b.run ? e.buffer.get() : nullptr);
  }
  return ptrs;
}

std::vector<bool> PreparedWeights::Filled(const Plan& plan) const {
  std::vector<bool> filled;
  for (const SharedBuffer& b : plan.shared) {
    auto it = entries_.find(b.key);
    filled.push_back(b.constant >= 0 ||
                     (it != entries_.end() && it->second.allocated && it->second.filled == generation_));
  }
  return filled;
}

std::vector<void*> PreparedWeights::ForInit(const Plan& plan, const std::vector<bool>& used) {
  std::vector<void*> ptrs;
  for (size_t i = 0; i < plan.shared.size(); ++i) {
    if (plan.shared[i].constant >= 0) {
      ptrs.push_back(Constant(plan, i));
      continue;
    }
    Entry& e = Find(plan.shared[i]);
    if (used[i] && !e.allocated) {
      e.buffer = AlignedBuffer(e.bytes, e.what);
      e.allocated = true;
      e.filled = -1;
    }
    ptrs.push_back(e.buffer.get());
  }
  return ptrs;
}

void* PreparedWeights::Constant(const Plan& plan, size_t i) const {
  const size_t c = static_cast<size_t>(plan.shared[i].constant);
  return c < constants_.size() ? const_cast<void*>(constants_[c]) : nullptr;
}

void PreparedWeights::MarkFilled(const Plan& plan, const std::vector<bool>& which) {
  for (size_t i = 0; i < plan.shared.size(); ++i) {
    if (which[i] && plan.shared[i].constant < 0) entries_.at(plan.shared[i].key).filled = generation_;
  }
  for (auto& [key, e] : entries_) {
    if (!e.run && e.allocated) {
      e.buffer = AlignedBuffer();
      e.allocated = false;
      e.filled = -1;
    }
  }
}

void PreparedWeights::DiscardInitOnly(const Plan& plan, size_t i) {
  if (plan.shared[i].constant >= 0) return;
  auto it = entries_.find(plan.shared[i].key);
  if (it != entries_.end() && !it->second.run && it->second.allocated) it->second.buffer.Discard();
}

int64_t PreparedWeights::bytes() const {
  int64_t total = 0;
  for (const auto& [key, e] : entries_) total += e.allocated ? static_cast<int64_t>(e.bytes) : 0;
  return total;
}

}  // namespace byoc_hetero
