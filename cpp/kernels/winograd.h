/*!
 * \file kernels/winograd.h
 * \brief conv2d by Winograd F(4x4, 3x3): the algorithm conv2d.cc picks when it pays off.
 */
#ifndef BYOC_HETERO_KERNELS_WINOGRAD_H_
#define BYOC_HETERO_KERNELS_WINOGRAD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernel.h"

namespace byoc_hetero {

/*! \brief A conv2d's shapes and attributes, as the conv2d builder checked them. */
struct ConvParams {
  int64_t n, c, h, w, k, kh, kw, oh, ow, pad_top, pad_left, groups;
  std::vector<int64_t> strides, dilation;
  bool has_bias;
  Epilogue epilogue;
  std::string algo = "auto";  // the node's `algo` attribute: "auto", "direct" or "winograd"
};

/*!
 * \brief conv2d by Winograd F(4x4, 3x3) when it applies (3x3, stride 1, no dilation, no groups,
 *        channels in multiples of 16, weights known at __init_) and pays off; else nullptr.
 *        The node's `algo` ("direct": never; "winograd": whenever it applies) decides where it is
 *        not "auto"; an "auto" node follows BYOC_HETERO_CONV_ALGO ("auto", the default: the
 *        measured thresholds; "direct"; "winograd").
 */
std::unique_ptr<Kernel> TryBuildWinogradConv2D(const KernelContext& ctx, const ConvParams& params);

/*!
 * \brief The most input taps (C x 3 x 3) per output a convolution may have for "auto" to pick
 *        Winograd: above it Winograd's float32 error would pass 1e-5 of a float64 reference, so
 *        "auto" runs the direct convolution; an explicit "winograd" still runs it at any size.
 */
int64_t WinogradAutoMaxTaps();

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_WINOGRAD_H_
