/*!
 * \file kernels/broadcast.h
 * \brief Numpy broadcasting for the host kernels (binary's expansion, compare, where): output
 *        shapes, per-operand strides with 0 on broadcast dims, and the offset of an output row.
 */
#ifndef BYOC_HETERO_KERNELS_BROADCAST_H_
#define BYOC_HETERO_KERNELS_BROADCAST_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
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

/*!
 * \brief Copy a float32 tensor of \p shape into a plain buffer of \p out, repeating it along the
 *        broadcast dims (binary's broadcast dividend, broadcast_to).  OpenMP over output rows.
 */
inline std::function<void(const std::vector<void*>&)> ExpandFn(const std::vector<int64_t>& shape,
                                                               const std::vector<int64_t>& out) {
  const BroadcastRows walk({shape}, out);
  return [walk](const std::vector<void*>& ptrs) {
    const float* src = static_cast<const float*>(ptrs[0]);
    float* dst = static_cast<float*>(ptrs[1]);
    const int64_t inner = walk.inner();
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < walk.rows(); ++row) {
      float* d = dst + row * inner;
      const float* s = src + walk.Offset(0, row);
      if (walk.inner_stride(0) == 0) {
        for (int64_t j = 0; j < inner; ++j) d[j] = s[0];
      } else {
        std::memcpy(d, s, sizeof(float) * static_cast<size_t>(inner));
      }
    }
  };
}

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_BROADCAST_H_
