/*!
 * \file kernels/int8.h
 * \brief What conv2d and dense share to run int8: u8/s8 data x s8 weights, scales and zero points
 *        as oneDNN 3.x runtime attributes (docs/int8.md).
 *
 * oneDNN 3.x computes, for an int8 anchor with these attributes,
 *   dst = saturate(round(post_ops(src_scale * wei_scale[o] * sum((src - src_zp) * wei) + bias)
 *                        / dst_scale + dst_zp))
 * which is ONNX's DequantizeLinear -> conv / matmul (+ float32 bias, activations) -> QuantizeLinear
 * with the accumulation exact in int32: the only rounding is the final one (to nearest even, as
 * QuantizeLinear), and the float32 sum's order.  The scales arrive as run-time memories
 * (DNNL_ARG_ATTR_SCALES | arg); they are node attrs here, copied into small per-call buffers by
 * one host step before the primitive (a few hundred bytes).
 */
#ifndef BYOC_HETERO_KERNELS_INT8_H_
#define BYOC_HETERO_KERNELS_INT8_H_

#include <array>
#include <memory>
#include <vector>

#include "kernel.h"

namespace byoc_hetero {

/*! \brief The quantization of an int8 anchor (attrs src_scale, src_zero_point, weight_scales,
 *         dst_scale, dst_zero_point). */
struct Int8Params {
  bool enabled = false;        // data is uint8/int8 (or src_dynamic): the node runs int8
  bool dynamic_src = false;    // float32 data quantized per call to uint8 (ONNX DynamicQuantizeLinear):
                               // src_scale / src_zp computed from the data by a host step before the primitive
  float src_scale = 1.f;
  int32_t src_zp = 0;
  std::vector<float> wei_scales;  // one per output channel
  bool int8_dst = false;       // the output is uint8/int8 (else float32, no dst scale)
  float dst_scale = 1.f;
  int32_t dst_zp = 0;
  bool residual = false;       // a sum post-op adds sum_scale * (residual - sum_zp) before the
  float sum_scale = 1.f;       // post activation (the residual has the output's 8-bit type and
  int32_t sum_zp = 0;          // sits in the destination, as for float32 residuals)
  bool saturate = false;       // attr saturate_range [lo, hi]: the accumulator clamped to what a
  float saturate_lo = 0.f;     // quantize the activation post-op replaced would have saturated to
  float saturate_hi = 0.f;     // (ops/int8_activation.py), before the activation
};

/*!
 * \brief Read and check the int8 attrs of an anchor with \p out_channels output channels: present
 *        exactly when its data is uint8/int8 (then the weight must be int8); a scale must be finite
 *        and > 0 and a zero point within its type's range.
 */
Int8Params ReadInt8Params(const KernelContext& ctx, AttrReader& attrs, int64_t out_channels);

/*! \brief The primitive attributes of an int8 anchor: \p e's activations and the residual sum of
 *         \p q as post-ops, the scales (weights along \p wei_mask) and zero points of \p q. */
dnnl::primitive_attr MakeInt8Attr(const KernelContext& ctx, const Epilogue& e, const Int8Params& q, int wei_mask);

/*! \brief attr \p key read as a scale: fails (naming the attr) unless finite and > 0 in float32. */
float CheckedScale(AttrReader& attrs, const char* key, double value);

/*! \brief attr \p key read as a zero point of \p dtype: fails unless within the type's range. */
int32_t CheckedZeroPoint(AttrReader& attrs, const char* key, int64_t value, DType dtype);

/*!
 * \brief round_half_to_even(x / scale) + zero, saturated to [lo, hi]; NaN gives the zero point.
 *        Rounds by adding and subtracting 1.5 * 2^23 (exact ties-to-even in the default rounding
 *        mode for |v| < 2^22; larger values are clamped first, they saturate anyway), written with
 *        selects only so that the loop vectorizes: std::nearbyint is a libm call per element
 *        (35 ns/element measured on ResNet-50's 800K-element tensors).
 */
inline float QuantizeOne(float x, float scale, float zero, float lo, float hi) {
  constexpr float kMagic = 12582912.f, kBig = 4194304.f;  // 1.5 * 2^23, 2^22
  float v = x / scale;
  v = v == v ? v : 0.f;
  v = v > kBig ? kBig : (v < -kBig ? -kBig : v);
  v = (v + kMagic) - kMagic + zero;  // IEEE arithmetic (no -ffast-math here) keeps both steps
  return v > hi ? hi : (v < lo ? lo : v);
}

/*!
 * \brief The size (elements) from which a host loop over 8-bit data or its float32 (de)quantization
 *        splits across the call's threads; smaller ones run on the calling thread.
 */
int64_t ParallelMinimum();

/*!
 * \brief The layout input \p k's producer stored when it is strided without blocks or padding, so
 *        that an element-wise host loop can run over its bytes as over a plain buffer (the int8
 *        convs' NHWC); a zero desc otherwise.
 */
memory::desc DenseProducerLayout(const KernelContext& ctx, size_t k);

/*!
 * \brief y = table[x] over \p n elements of 8-bit \p in values into 8-bit \p out values
 *        (kernels/lookup.cc's loop): \p bytes holds the output's bits for input value lo + k at k
 *        (lo = 0 for uint8, -128 for int8).
 */
HostFn TableLookupFn(DType in, DType out, const std::array<uint8_t, 256>& bytes, int64_t n);

/*! \brief The traits of a host kernel that reads or writes 8-bit tensors. */
KernelTraits Int8HostTraits();

/*! \brief oneDNN's type for a tensor of dtype \p dtype (u8, s8 or f32). */
memory::data_type DnnlType(DType dtype);

/*!
 * \brief The kernel of an int8 anchor: one primitive (\p pd, built with SetInt8Attrs) reading
 *        data, weights and an optional float32 bias through their plain views, preceded by a host
 *        step writing the scales and zero points into its per-call buffers.
 */
std::unique_ptr<Kernel> MakeInt8AnchorKernel(const KernelContext& ctx, const char* op, dnnl::primitive_desc_base pd,
                                             const memory::desc& src_view, const memory::desc& wei_view,
                                             const memory::desc& bias_view, const memory::desc& dst_view,
                                             const Int8Params& q);

/*! \brief The host Q/DQ loops of kernels/quantize.cc over n contiguous elements with one scale and
 *         zero point (\p q: kUInt8 or kInt8), for kernels that quantize inside their own loops
 *         (elementwise_chain.cc): the same bits as the quantize / dequantize / quantize_dequantize
 *         nodes. */
void QuantizeSpan(const float* x, void* y, int64_t n, float scale, int32_t zero, DType q);
void DequantizeSpan(const void* x, float* y, int64_t n, float scale, int32_t zero, DType q);
void RoundTripSpan(const float* x, float* y, int64_t n, float scale, int32_t zero, DType q);

/*! \brief The uint8 scale and zero point ONNX's DynamicQuantizeLinear computes for n floats:
 *         lo = min(min(x), 0), hi = max(max(x), 0), scale = (hi - lo) / 255 (1 when hi == lo),
 *         zero = round_half_even(-lo / scale).  Any NaN element: scale NaN (what is dequantized with it
 *         is NaN); an infinite element gives an infinite scale and zero point 0. */
struct DynamicQParams {
  float scale = 1.f;
  int32_t zero = 0;
};
DynamicQParams DynamicUInt8Params(const float* x, int64_t n);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_INT8_H_
