/*!
 * \file kernels/reshape.h
 * \brief A reshape as a view: the descriptor under which a reshape's output reads the bytes of an
 *        input held in a permuted plain layout, when no copy is needed (plan/layouts.cc, LayoutResolver::ViewWithoutCopy).
 */
#ifndef BYOC_HETERO_KERNELS_RESHAPE_H_
#define BYOC_HETERO_KERNELS_RESHAPE_H_

#include "kernel.h"

namespace byoc_hetero {

/*!
 * \brief \p stored (a dense f32 layout with strides and no inner blocks, e.g. a token matrix
 *        [1, S, C] relabelled [1, C, S]:acb by a permute) read under \p dims, the reshape's output
 *        dims (the same elements in row-major order): every output dim must split one stored dim
 *        or merge stored dims that lie next to each other in memory.  [1, C, H*W]:acb read as
 *        [1, C, H, W] is NHWC (acdb), and back.  An empty (zero) desc where that needs a copy.
 */
memory::desc ReshapedView(const memory::desc& stored, const memory::dims& dims);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_RESHAPE_H_
