/*!
 * \file weights.cc
 * \brief See weights.h.
 */
#include "weights.h"

#include <tvm/ffi/error.h>

#include <cstring>

namespace byoc_hetero {

AlignedBuffer::AlignedBuffer(size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  ptr_.reset(std::aligned_alloc(64, rounded));
  if (!ptr_) {
    TVM_FFI_THROW(RuntimeError) << what << ": out of memory: cannot allocate " << bytes << " bytes";
  }
  std::memset(ptr_.get(), 0, rounded);
}

std::vector<void*> PreparedWeights::Reserve(const Plan& plan) {
  std::vector<void*> ptrs;
  for (const SharedBuffer& b : plan.shared) {
    auto it = entries_.find(b.key);
    if (it == entries_.end()) {
      it = entries_.emplace(b.key, Entry{b.bytes, AlignedBuffer(b.bytes, b.what)}).first;
    } else if (it->second.bytes != b.bytes) {
      TVM_FFI_THROW(InternalError) << b.what << ": prepared weight '" << b.key << "' has "
                                   << it->second.bytes << " bytes, the plan wants " << b.bytes;
    }
    ptrs.push_back(it->second.buffer.get());
  }
  return ptrs;
}

std::vector<bool> PreparedWeights::Filled(const Plan& plan) const {
  std::vector<bool> filled;
  for (const SharedBuffer& b : plan.shared) {
    auto it = entries_.find(b.key);
    filled.push_back(it != entries_.end() && it->second.filled);
  }
  return filled;
}

void PreparedWeights::MarkFilled(const Plan& plan, const std::vector<bool>& which) {
  for (size_t i = 0; i < plan.shared.size(); ++i) {
    if (which[i]) entries_.at(plan.shared[i].key).filled = true;
  }
}

void PreparedWeights::Invalidate() {
  for (auto& [key, e] : entries_) e.filled = false;
}

int64_t PreparedWeights::bytes() const {
  int64_t total = 0;
  for (const auto& [key, e] : entries_) total += static_cast<int64_t>(e.bytes);
  return total;
}

}  // namespace byoc_hetero
