/*!
 * \file kernels/broadcast.h
 * \brief Numpy broadcasting for the host kernels (binary's expansion, compare, where): output
 *        shapes, per-operand strides with 0 on broadcast dims, and the offset of an output row.
 */
#ifndef BYOC_HETERO_KERNELS_BROADCAST_H_
#define BYOC_HETERO_KERNELS_BROADCAST_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace byoc_hetero {

/*! \brief \p shape with leading 1s up to \p rank. */
inline std::vector<int64_t> AlignRank(const std::vector<int64_t>& shape, size_t rank) {
  std::vector<int64_t> out(rank - std::min(rank, shape.size()), 1);
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

/*! \brief The numpy broadcast of \p shapes (rank >= 1), or nothing when they do not broadcast. */
inline std::optional<std::vector<int64_t>> BroadcastShape(const std::vector<std::vector<int64_t>>& shapes) {
  size_t rank = 1;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    const std::vector<int64_t> a = AlignRank(s, rank);
    for (size_t i = 0; i < rank; ++i) {
      if (a[i] != out[i] && a[i] != 1 && out[i] != 1) return std::nullopt;
      out[i] = std::max(out[i], a[i]);
    }
  }
  return out;
}

/*!
 * \brief Walks an output of dims \p out row by row (all dims but the last); each operand is read
 *        through its strides (elements, row-major, 0 where it is broadcast).
 */
class BroadcastRows {
 public:
  BroadcastRows(const std::vector<std::vector<int64_t>>& shapes, std::vector<int64_t> out) : out_(std::move(out)) {
    for (const auto& s : shapes) {
      const std::vector<int64_t> a = AlignRank(s, out_.size());
      std::vector<int64_t> strides(out_.size(), 0);
      int64_t step = 1;
      for (size_t i = out_.size(); i-- > 0;) {
        strides[i] = a[i] == 1 && out_[i] != 1 ? 0 : step;
        step *= a[i];
      }
      strides_.push_back(std::move(strides));
    }
  }
  int64_t rows() const {
    int64_t n = 1;
    for (size_t i = 0; i + 1 < out_.size(); ++i) n *= out_[i];
    return n;
  }
  int64_t inner() const { return out_.back(); }
  /*! \brief The stride of operand k along the last dim (0 or 1). */
  int64_t inner_stride(size_t k) const { return strides_[k].back(); }
  /*! \brief Element offset of output row \p row in operand k. */
  int64_t Offset(size_t k, int64_t row) const {
    int64_t offset = 0;
    for (size_t i = out_.size() - 1; i-- > 0;) {
      offset += (row % out_[i]) * strides_[k][i];
      row /= out_[i];
    }
    return offset;
  }

 private:
  std::vector<int64_t> out_;
  std::vector<std::vector<int64_t>> strides_;
};

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_BROADCAST_H_
