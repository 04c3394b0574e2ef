/*!
 * \file kernels/dense_wq.cc
 * \brief dense_wq: a dense layer on weight-only quantized weights (8 or 4 bits, block scales along
 *        K, optional zero points), float32 data and output; our own kernels (dense_wq.h): oneDNN
 *        3.2 has no weight decompression.
 *
 * Inputs: data [..., K] (float32; leading dims flattened into M), weight (constant; [N, K] int8 /
 * uint8 codes for bits 8, [N, K / 2] uint8 for bits 4, k even in the low nibble as ONNX's
 * MatMulNBits), scales (constant [N, K / block], float32 or float16), zero points (constant
 * uint8 [N, K / block], with has_zero_point), offsets (constant float32 [N, K / block], with
 * has_offset: added to each dequantized weight of the block), bias (float32, N elements, with has_bias),
 * gate (float32 of the output's shape, with has_gate: y = (x W + b) * gate, a GLU's product of its up
 * projection and its activated gate, otherwise a step of its own per layer), residual (float32 of the
 * output's shape, with residual: y = (...) + residual, a sum the planner places in the output before the
 * step, in place where the residual dies there: the add of a decoder's residual stream, otherwise a
 * step of its own per dense).
 * Attrs: bits (4 | 8), block (K, or a power of two >= 16 dividing K), has_zero_point (0/1,
 * default 0: the zero point is 0 for int8 codes, 2^(bits-1) for uint8 ones, 0 with offsets),
 * has_offset (0/1, default 0; not with has_zero_point), has_bias, has_gate (0/1, default 0), residual
 * (0/1, default 0).
 * The weight, scales and zero points are repacked once, at __init_, by operand transforms into the
 * tile layout of dense_wq.h; a call streams the tiles, threads splitting the columns.
 */
#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dense_wq.h"
#include "kernel.h"

namespace byoc_hetero {

namespace {

using wq::HalfToFloat;
using wq::kActBlock;
using wq::kTile;

/*! \brief What the attrs and shapes of one node say. */
struct WqShape {
  int64_t m = 0, k = 0, n = 0;
  int bits = 8;
  int64_t block = 0;
  bool signed_codes = false;  // int8 weight: codes + 128, zero point 128
  bool has_zero_point = false, has_offset = false, has_bias = false, f16_scales = false;
  bool has_gate = false;  // an input multiplying the output: (x W + b) * gate (a GLU's up projection)
  bool residual = false;  // the last input is summed into the output (Kernel::sum_input)
  bool inline_scales = false;  // the codes' tiles hold the float16 scales too (dense_wq.h's inline layout)
  int64_t tiles() const { return (n + kTile - 1) / kTile; }
  int64_t blocks() const { return k / block; }
  int64_t step() const { return bits == 8 ? kTile : kTile / 2; }  // code bytes per k in a tile (on average)
  int64_t tile_bytes() const { return inline_scales ? wq::InlineTileBytes(k, bits) : k * step(); }  // a packed tile's bytes
  float implicit_zero() const {
    if (signed_codes) return 128.f;
    return has_offset ? 0.f : static_cast<float>(1 << (bits - 1));  // with offsets the codes start at 0
  }
  size_t offset_input() const { return 3 + (has_zero_point ? 1 : 0); }
  size_t bias_input() const { return offset_input() + (has_offset ? 1 : 0); }  // the first after the codes' inputs
  size_t gate_input() const { return bias_input() + (has_bias ? 1 : 0); }
  size_t inputs() const { return gate_input() + (has_gate ? 1 : 0) + (residual ? 1 : 0); }
};

/*! \brief wq::ExpectPerBlock for \p s's columns and blocks. */
void ExpectPerBlock(const KernelContext& ctx, size_t k, const char* name, const WqShape& s) {
  wq::ExpectPerBlock(ctx, k, name, s.n, s.blocks());
}

/*! \brief The bias (N floats), the gate and the residual (float32 of the output's shape \p out), where present. */
void CheckEpilogueInputs(const KernelContext& ctx, const WqShape& s, const std::vector<int64_t>& out) {
  const size_t b = s.bias_input();
  if (s.has_bias && (ctx.input(b).numel() != s.n || ctx.input(b).dtype != DType::kFloat32)) {
    ctx.Fail("bias must be float32 with N = " + std::to_string(s.n) + " elements, got " +
             DTypeName(ctx.input(b).dtype) + " " + ShapeToString(ctx.input(b).shape));
  }
  const std::pair<bool, const char*> tensors[] = {{s.has_gate, "gate"}, {s.residual, "residual"}};
  size_t k = s.gate_input();
  for (const auto& [present, name] : tensors) {
    if (!present) continue;
    if (ctx.input(k).dtype != DType::kFloat32) {
      ctx.Fail(std::string(name) + " must be float32, got " + DTypeName(ctx.input(k).dtype));
    }
    ctx.ExpectInputShape(k++, name, out);
  }
}

/*! \brief Attrs and input shapes, checked; failures name the attr or input. */
WqShape ReadWqShape(const KernelContext& ctx, AttrReader& attrs) {
  WqShape s;
  wq::ReadCodeAttrs(attrs, &s);
  const size_t base = 3 + (s.has_zero_point ? 1 : 0) + (s.has_offset ? 1 : 0);
  s.has_gate = attrs.Flag("has_gate", false);
  s.residual = attrs.Flag("residual", false);
  s.has_bias = attrs.Flag("has_bias", ctx.node().inputs.size() == base + 1 + s.has_gate + s.residual);
  attrs.CheckNoUnknown();
  ctx.ExpectInputCount(s.inputs(), std::string("data, weight, scales") + (s.has_zero_point ? ", zero_points" : "") +
                                       (s.has_offset ? ", offsets" : "") + (s.has_bias ? ", bias" : "") +
                                       (s.has_gate ? ", gate" : "") + (s.residual ? ", residual" : ""));
  const auto& x = ctx.input(0).shape;
  if (x.size() < 2 || ctx.input(0).dtype != DType::kFloat32) {
    ctx.Fail("data must be float32 of rank >= 2, got " + std::string(DTypeName(ctx.input(0).dtype)) + " " +
             ShapeToString(x));
  }
  s.k = x.back();
  s.m = ctx.input(0).numel() / s.k;
  if (s.block < 1 || s.k % s.block != 0 ||
      (s.block != s.k && (s.block < 16 || (s.block & (s.block - 1)) != 0))) {
    attrs.Fail("block", "expected K = " + std::to_string(s.k) + " or a power of two >= 16 dividing K, got " +
                            std::to_string(s.block));
  }
  ctx.ExpectRank(1, "weight", 2);
  const TensorInfo& w = ctx.input(1);
  s.n = w.shape[0];
  s.signed_codes = w.dtype == DType::kInt8;
  if (!IsInt8(w.dtype) || (s.signed_codes && (s.bits != 8 || s.has_zero_point))) {
    ctx.Fail(std::string("weight must be uint8 codes (or int8 for bits 8 without zero points), got ") +
             DTypeName(w.dtype));
  }
  if (s.bits == 4 && s.k % 2 != 0) ctx.Fail("bits 4 needs an even K, got K = " + std::to_string(s.k));
  ctx.ExpectInputShape(1, "weight", {s.n, s.k * s.bits / 8});
  const TensorInfo& scales = ctx.input(2);
  s.f16_scales = scales.dtype == DType::kFloat16;
  if (scales.dtype != DType::kFloat32 && !s.f16_scales) {
    ctx.Fail(std::string("scales must be float32 or float16, got ") + DTypeName(scales.dtype));
  }
  ExpectPerBlock(ctx, 2, "scales", s);
  if (s.has_zero_point) {
    if (ctx.input(3).dtype != DType::kUInt8) {
      ctx.Fail(std::string("zero_points must be uint8, got ") + DTypeName(ctx.input(3).dtype));
    }
    ExpectPerBlock(ctx, 3, "zero_points", s);
  }
  if (s.has_offset) {
    if (ctx.input(s.offset_input()).dtype != DType::kFloat32) {
      ctx.Fail(std::string("offsets must be float32, got ") + DTypeName(ctx.input(s.offset_input()).dtype));
    }
    ExpectPerBlock(ctx, s.offset_input(), "offsets", s);
  }
  for (size_t i = 1; i < base; ++i) {
    if (ctx.input_constant.size() <= i || !ctx.input_constant[i]) {
      ctx.Fail("input " + std::to_string(i) + " (weight, scales, zero points, offsets) must be a constant");
    }
  }
  std::vector<int64_t> out(x.begin(), x.end() - 1);
  out.push_back(s.n);
  ctx.ExpectOutputShape(out);
  CheckEpilogueInputs(ctx, s, out);
  return s;
}

/*! \brief The codes [N, K*bits/8] into tiles of kTile columns, K-contiguous (dense_wq.h): 8-bit codes
 *         16 bytes a k; 4-bit ones 16 bytes a pair of k, column c's byte holding k low, k + 1 high. */
void PackCodes(const WqShape& s, const uint8_t* w, uint8_t* packed) {
  const int64_t row = s.k * s.bits / 8, step = s.step();
  for (int64_t n = 0; n < s.n; ++n) {
    const int64_t t = n / kTile, c = n % kTile;
    uint8_t* tile = packed + t * s.k * step;
    const uint8_t* src = w + n * row;
    for (int64_t k = 0; k < s.k; ++k) {
      if (s.bits == 8) {
        tile[k * step + c] = static_cast<uint8_t>(src[k] + (s.signed_codes ? 128 : 0));
      } else {
        const uint8_t code = (src[k / 2] >> (4 * (k % 2))) & 0x0F;  // k even low, as stored
        tile[(k / 2) * kTile + c] |= static_cast<uint8_t>(code << (4 * (k % 2)));
      }
    }
  }
}

/*! \brief The codes into tiles of the quad layout of the int8-activation kernels (dense_wq.h): 8-bit,
 *         per 4 k, column c's 4 codes - 128 at bytes c * 4..; 4-bit, per 8 k, k + i low, k + 4 + i high. */
void PackQuadCodes(const WqShape& s, const uint8_t* w, uint8_t* packed) {
  const int64_t row = s.k * s.bits / 8, step = s.step();
  for (int64_t n = 0; n < s.n; ++n) {
    const int64_t c = n % kTile;
    uint8_t* tile = packed + (n / kTile) * s.k * step;
    const uint8_t* src = w + n * row;
    for (int64_t k = 0; k < s.k; ++k) {
      if (s.bits == 8) {
        tile[(k / 4) * 64 + c * 4 + k % 4] = static_cast<uint8_t>(src[k] + (s.signed_codes ? 0 : 128));
      } else {
        const uint8_t code = (src[k / 2] >> (4 * (k % 2))) & 0x0F;
        tile[(k / 8) * 64 + c * 4 + k % 4] |= static_cast<uint8_t>(code << (4 * ((k % 8) / 4)));
      }
    }
  }
}

/*! \brief [N, blocks] per-block values into [tiles][blocks][kTile] (float32, or the float16 bits of
 *         half scales), each checked by \p check (which throws naming the element); columns past N stay 0. */
template <typename T, typename Get, typename Check>
void PackPerBlock(const WqShape& s, T* packed, const Get& get, const Check& check) {
  const int64_t blocks = s.blocks();
  std::fill(packed, packed + s.tiles() * blocks * kTile, T{0});
  for (int64_t n = 0; n < s.n; ++n) {
    for (int64_t b = 0; b < blocks; ++b) {
      const T v = get(n * blocks + b);
      check(v, n, b);
      packed[((n / kTile) * blocks + b) * kTile + n % kTile] = v;
    }
  }
}

class DenseWqKernel : public Kernel {
 public:
  DenseWqKernel(const KernelContext& ctx, const WqShape& s)
      : label_(ctx.where()), s_(s), isa_(SelectSimdIsa(wq::kIsaVariable)), dot_(wq::SelectIntDot(isa_, s.block)),
        half_(s.f16_scales && dot_ != wq::IntDot::kNone && HalfScalesRun(dot_)), form_(ManyRowsForm(s, dot_)),
        panels_(form_ == wq::PanelForm::kFloat ? wq::FindPanelFns(s.bits) : wq::PanelFns{}),
        qpanel_(form_ == wq::PanelForm::kInt || form_ == wq::PanelForm::kIntFused
                    ? wq::FindQPanelFn(dot_, s.bits, FoldScales(s)) : nullptr),
        prefetch_(dot_ != wq::IntDot::kNone ? wq::PrefetchBytes() : 0) {
    s_.inline_scales = InlineScales(s, dot_, half_, form_);
    if (s_.inline_scales && qpanel_ != nullptr) qpanel_ = wq::FindInlineQPanelFn(dot_, s.bits);
    inputs_.push_back({PlainDesc({s.m, s.k}), PlainDesc({s.m, s.k})});
    const std::string where = ctx.where();
    const WqShape shape = s_;
    const bool quad = dot_ != wq::IntDot::kNone;
    inputs_.push_back(shape.inline_scales ? InlineCodesOperand(ctx, shape) : CodesOperand(ctx, shape, quad));
    const memory::desc per_block = PlainDesc({s.tiles() * s.blocks() * kTile});
    inputs_.push_back(shape.inline_scales ? InlineScalesPlaceholder(ctx) : ScalesOperand(ctx, s, half_));
    if (s.has_zero_point) {
      OperandLayout zeros{PlainDescOf(ctx.input(3)), per_block};
      zeros.transform_name = "dense_wq zero point tiles";
      zeros.transform = [shape, where](const std::vector<void*>& p) {
        auto get = [&](int64_t i) { return static_cast<float>(static_cast<const uint8_t*>(p[0])[i]); };
        PackPerBlock(shape, static_cast<float*>(p[1]), get, [&](float v, int64_t n, int64_t b) {
          if (v >= static_cast<float>(1 << shape.bits)) BadValue(where, "zero_points", v, n, b, "a code of the weight's bits");
        });
      };
      inputs_.push_back(std::move(zeros));
    }
    if (s.has_offset) inputs_.push_back(OffsetsOperand(ctx, s));
    if (s.has_bias) inputs_.push_back({PlainDesc({s.n}), PlainDesc({s.n})});
    if (s.has_gate) inputs_.push_back({PlainDesc({s.m, s.n}), PlainDesc({s.m, s.n})});
    output_ = {PlainDesc({s.m, s.n}), PlainDesc({s.m, s.n})};
    if (s.residual) {  // summed into the output, which the planner fills with it before the step
      inputs_.push_back(output_);
      sum_input_ = static_cast<int>(inputs_.size() - 1);
    }
    // the quantized rows and their per-block scales and sums: planned memory, not an allocation per call
    if (quad && panels_.multiply == nullptr) temps_ = {Bytes(ScratchBytes(s))};
    // float32 activations with offsets: each row's block sums, made once a call for every tile (o * sum x)
    if (!quad && s.has_offset) temps_ = {Bytes(s.m * s.blocks() * static_cast<int64_t>(sizeof(float)))};
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override {
    Step step;
    const WqShape s = s_;
    if (panels_.multiply != nullptr) {
      const wq::PanelFns fns = panels_;
      const bool half = half_;
      step.host = [s, fns, half](const std::vector<void*>& p) { RunPanels(s, fns, half, p); };
      step.label = label_ + ": " + std::to_string(s.bits) + "-bit weights, panels dequantized, float32 activations (" +
                   std::to_string(s.m) + " rows, avx512)";
    } else if (qpanel_ != nullptr) {
      const wq::QPanelFn fn = qpanel_;
      const wq::IntDot dot = dot_;
      const bool half = half_;
      const bool fused = form_ == wq::PanelForm::kIntFused;
      if (fused) {
        step.host = [s, fn, dot, half](const std::vector<void*>& p) { RunQPanelsDirect(s, fn, dot, half, p); };
      } else {
        step.host = [s, fn, dot, half](const std::vector<void*>& p) { RunQPanels(s, fn, dot, half, p); };
      }
      step.label = label_ + ": " + std::to_string(s.bits) + "-bit weights" + (half ? ", float16 scales" : "") +
                   ", int8 activations (" + wq::IntDotName(dot_) + "), integer panels of " +
                   std::to_string(wq::kPanelWidth) + " columns x " + std::to_string(wq::kQPanelRows) + " rows (" +
                   std::to_string(s.m) + " rows" + (FoldScales(s) ? ", scales after the sum" : "") +
                   (fused ? ", epilogue in the kernel" : "") + ")";
    } else if (dot_ == wq::IntDot::kNone) {
      const wq::TileFn tile_fn = wq::FindTileFn(isa_, s.bits);
      step.host = [s, tile_fn](const std::vector<void*>& p) { Run(s, tile_fn, p); };
      step.label = label_ + ": " + std::to_string(s.bits) + "-bit weights (" + SimdIsaName(isa_) + ")";
    } else {
      const Int8Call call{TileFnFor(s, dot_, half_), dot_, half_, prefetch_};
      step.host = [s, call](const std::vector<void*>& p) { RunInt8(s, call, p); };
      step.label = label_ + ": " + std::to_string(s.bits) + "-bit weights" + (half_ ? ", float16 scales" : "") +
                   ", int8 activations (" + wq::IntDotName(dot_) + ")" +
                   (call.tile_fn != wq::FindQTileFn(dot_, s.bits) ? ", blocks of 32 kernel" : "") +
                   (prefetch_ != 0 ? ", prefetch " + std::to_string(prefetch_) + " bytes" : "");
    }
    step.op = "dense_wq";
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (static_cast<int>(k) != sum_input_) step.args.emplace_back(static_cast<int>(k), inputs[k]);
    }
    step.args.emplace_back(static_cast<int>(inputs.size()), output);
    for (const MemRef& t : temps) step.args.emplace_back(static_cast<int>(step.args.size()), t);
    return {std::move(step)};
  }

 private:
  static memory::desc Bytes(int64_t n) { return memory::desc({n}, memory::data_type::u8, {1}); }

  /*! \brief The form a call runs (dense_wq.h's PanelForm): the one asked for (wq::PanelsAsked, read for every
   *         node, so that a bad value fails at any rows) where the call has many rows and the quad layout of an
   *         AVX-512 integer kernel; else kNone. */
  static wq::PanelForm ManyRowsForm(const WqShape& s, wq::IntDot dot) {
    const wq::PanelForm asked = wq::PanelsAsked();
    const bool avx512 = dot == wq::IntDot::kAvx512Bw || dot == wq::IntDot::kAvx512Vnni;
    return s.m >= wq::kPanelMinRows && avx512 ? asked : wq::PanelForm::kNone;
  }

  /*! \brief The integer tile kernel of a call of few rows: the one for weight blocks of kActBlock without zero points
   *         or offsets where BYOC_HETERO_WQ_BLOCK32 asks for it (wq::Block32Asked, read for every node so that a
   *         bad value fails anywhere) and \p dot has one, else the general one. */
  static wq::QTileFn TileFnFor(const WqShape& s, wq::IntDot dot, bool half) {
    const wq::ScaleForm form = s.inline_scales ? wq::ScaleForm::kInline : half ? wq::ScaleForm::kHalf : wq::ScaleForm::kFloat;
    const wq::QTileFn fn = wq::Block32Asked() && s.block == wq::kActBlock && !s.has_zero_point && !s.has_offset
                               ? wq::FindBlock32Fn(dot, s.bits, form) : nullptr;
    return fn != nullptr ? fn : wq::FindQTileFn(dot, s.bits);
  }

  /*! \brief Whether the node's codes are packed in the inline layout (dense_wq.h): BYOC_HETERO_WQ_BLOCK32=on, codes
   *         in blocks of kActBlock with float16 scales (llama.cpp's Q8_0 / Q4_0, from_hf's group_size=32, int4's
   *         default), no zero points or offsets, an AVX-512 integer kernel (its tile and panel kernels read the layout;
   *         the AVX2 ones and the float panels keep the scales' own tiles). */
  static bool InlineScales(const WqShape& s, wq::IntDot dot, bool half, wq::PanelForm form) {
    const bool avx512 = dot == wq::IntDot::kAvx512Vnni || dot == wq::IntDot::kAvx512Bw;
    return wq::Block32Asked() && s.block == wq::kActBlock && half && !s.has_zero_point &&
           !s.has_offset && avx512 && form != wq::PanelForm::kFloat;
  }

  /*! \brief The codes operand: per tile of kTile columns, K-contiguous (PackCodes), or the quad layout (PackQuadCodes). */
  static OperandLayout CodesOperand(const KernelContext& ctx, const WqShape& s, bool quad) {
    OperandLayout codes{PlainDescOf(ctx.input(1)), Bytes(s.tiles() * s.tile_bytes())};
    codes.transform_name = "dense_wq " + std::to_string(s.bits) + "-bit tiles" + (quad ? " (quad layout)" : "");
    codes.transform = [s, quad](const std::vector<void*>& p) {
      std::memset(p[1], 0, static_cast<size_t>(s.tiles() * s.tile_bytes()));
      (quad ? PackQuadCodes : PackCodes)(s, static_cast<const uint8_t*>(p[0]), static_cast<uint8_t*>(p[1]));
    };
    return codes;
  }

  /*! \brief The codes operand of the inline layout: the quad layout's codes and the node's float16 scales (node input
   *         2, read by the transform too: OperandLayout::also_reads), each checked finite and nonzero at __init_. */
  static OperandLayout InlineCodesOperand(const KernelContext& ctx, const WqShape& s) {
    OperandLayout codes{PlainDescOf(ctx.input(1)), Bytes(s.tiles() * s.tile_bytes())};
    codes.transform_name = "dense_wq " + std::to_string(s.bits) + "-bit tiles (quad layout, float16 scales inline)";
    codes.also_reads = {2};
    const std::string where = ctx.where();
    codes.transform = [s, where](const std::vector<void*>& p) {
      uint8_t* packed = static_cast<uint8_t*>(p[2]);  // {codes, scales (also_reads), packed}
      std::memset(packed, 0, static_cast<size_t>(s.tiles() * s.tile_bytes()));
      PackInline(s, static_cast<const uint8_t*>(p[0]), static_cast<const uint16_t*>(p[1]), packed, where);
    };
    return codes;
  }

  /*! \brief The scales' operand where they live in the codes (InlineCodesOperand): one byte the kernels never read. */
  static OperandLayout InlineScalesPlaceholder(const KernelContext& ctx) {
    OperandLayout none{PlainDescOf(ctx.input(2)), Bytes(1)};
    none.transform_name = "dense_wq scales (inside the code tiles)";
    none.transform = [](const std::vector<void*>& p) { *static_cast<uint8_t*>(p[1]) = 0; };
    return none;
  }

  /*! \brief The inline layout (dense_wq.h) of \p codes (as PackQuadCodes reads them: [N, K] int8, or uint8 with 128
   *         their zero; [N, K / 2] nibbles, k even low) and \p halves [N, K / kActBlock] (float16 bits); a scale that is
   *         not finite and nonzero is a ValueError. */
  static void PackInline(const WqShape& s, const uint8_t* codes, const uint16_t* halves, uint8_t* packed,
                         const std::string& where) {
    const int64_t blocks = s.blocks(), tile = s.tile_bytes(), block_bytes = kActBlock * s.step();
    const int64_t pair = wq::kInlineLineBytes + 2 * block_bytes, row = s.k * s.bits / 8;
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t c = n % kTile;
      uint8_t* base = packed + (n / kTile) * tile;
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* line = base + (b / 2) * pair;
        const uint16_t h = halves[n * blocks + b];
        const float v = HalfToFloat(h);
        if (!std::isfinite(v) || v == 0.f) BadValue(where, "scales", v, n, b, "a finite, nonzero scale");
        std::memcpy(line + ((b % 2) * kTile + c) * 2, &h, 2);
        uint8_t* dst = line + wq::kInlineLineBytes + (b % 2) * block_bytes;
        for (int64_t i = 0; i < kActBlock; ++i) {  // PackQuadCodes' bytes of the block, i = k - 32 b
          const int64_t k = b * kActBlock + i;
          if (s.bits == 8) {
            dst[(i / 4) * 64 + c * 4 + i % 4] = static_cast<uint8_t>(codes[n * row + k] + (s.signed_codes ? 0 : 128));
          } else {
            const uint8_t code = (codes[n * row + k / 2] >> (4 * (k % 2))) & 0x0F;
            dst[(i / 8) * 64 + c * 4 + i % 4] |= static_cast<uint8_t>(code << (4 * ((i % 8) / 4)));
          }
        }
      }
    }
  }

  /*! \brief Whether the integer panels apply the scales once after the sum over K (dense_wq.h FindQPanelFn): one
   *         weight block, no offsets (loaded A/B, Zen 5, 1 thread, M = 128, Qwen2.5-0.5B's layers: 1.10-1.12x the
   *         unfolded panels, bench/GENERATE.md). */
  static bool FoldScales(const WqShape& s) { return s.blocks() == 1 && !s.has_offset; }

  /*! \brief Whether the int8-activation kernel \p dot can widen float16 scales (VCVTPH2PS: AVX-512F, or F16C
   *         beside AVX2; the portable kernel converts in C++). */
  static bool HalfScalesRun(wq::IntDot dot) {
#if defined(__x86_64__)
    if (dot == wq::IntDot::kAvx2) return __builtin_cpu_supports("f16c");
#endif
    return true;
  }

  /*! \brief The scales operand: per tile, per block, 16 float32 — or, with \p half, the node's float16
   *         scales kept as they are (2 bytes each, widened by the int8-activation kernels) — each checked
   *         finite and nonzero at __init_. */
  static OperandLayout ScalesOperand(const KernelContext& ctx, const WqShape& s, bool half) {
    const int64_t count = s.tiles() * s.blocks() * kTile;
    OperandLayout scales{PlainDescOf(ctx.input(2)), half ? Bytes(count * 2) : PlainDesc({count})};
    scales.transform_name = half ? "dense_wq float16 scale tiles" : "dense_wq scale tiles";
    const std::string where = ctx.where();
    scales.transform = [s, where, half](const std::vector<void*>& p) {
      auto check = [&](float v, int64_t n, int64_t b) {
        if (!std::isfinite(v) || v == 0.f) BadValue(where, "scales", v, n, b, "a finite, nonzero scale");
      };
      const uint16_t* halves = static_cast<const uint16_t*>(p[0]);
      if (half) {
        PackPerBlock(s, static_cast<uint16_t*>(p[1]), [&](int64_t i) { return halves[i]; },
                     [&](uint16_t h, int64_t n, int64_t b) { check(HalfToFloat(h), n, b); });
        return;
      }
      auto get = [&](int64_t i) { return s.f16_scales ? HalfToFloat(halves[i]) : static_cast<const float*>(p[0])[i]; };
      PackPerBlock(s, static_cast<float*>(p[1]), get, check);
    };
    return scales;
  }

  /*! \brief The offsets operand: per tile, per block, 16 float32, each checked finite at __init_. */
  static OperandLayout OffsetsOperand(const KernelContext& ctx, const WqShape& s) {
    OperandLayout offsets{PlainDescOf(ctx.input(s.offset_input())), PlainDesc({s.tiles() * s.blocks() * kTile})};
    offsets.transform_name = "dense_wq offset tiles";
    const std::string where = ctx.where();
    offsets.transform = [s, where](const std::vector<void*>& p) {
      const float* src = static_cast<const float*>(p[0]);
      PackPerBlock(s, static_cast<float*>(p[1]), [&](int64_t i) { return src[i]; }, [&](float v, int64_t n, int64_t b) {
        if (!std::isfinite(v)) BadValue(where, "offsets", v, n, b, "a finite offset");
      });
    };
    return offsets;
  }

  /*! \brief RunInt8's scratch: int8 rows [M, K] (K a multiple of kActBlock, so the floats after stay
   *         aligned), then the rows' scales and sums, [M, K / kActBlock] float32 each. */
  static int64_t ScratchBytes(const WqShape& s) {
    return s.m * s.k + 2 * s.m * (s.k / wq::kActBlock) * static_cast<int64_t>(sizeof(float));
  }

  [[noreturn]] static void BadValue(const std::string& where, const char* what, float v, int64_t n, int64_t b,
                                    const char* expected) {
    std::ostringstream os;
    os << where << ": " << what << "[" << n << ", " << b << "] is " << v << ": expected " << expected;
    TVM_FFI_THROW(ValueError) << os.str();
  }

  /*! \brief A call's operands (inputs in the order of the node, then the output, then the scratch). */
  struct Operands {
    const float* x;
    const uint8_t* codes;
    const float *scales, *zeros, *offsets, *bias, *gate;
    float* y;
    Operands(const WqShape& s, const std::vector<void*>& p)
        : x(static_cast<const float*>(p[0])), codes(static_cast<const uint8_t*>(p[1])),
          scales(static_cast<const float*>(p[2])),
          zeros(s.has_zero_point ? static_cast<const float*>(p[3]) : nullptr),
          offsets(s.has_offset ? static_cast<const float*>(p[s.offset_input()]) : nullptr),
          bias(s.has_bias ? static_cast<const float*>(p[s.bias_input()]) : nullptr),
          gate(s.has_gate ? static_cast<const float*>(p[s.gate_input()]) : nullptr),
          y(static_cast<float*>(p[s.gate_input() + s.has_gate])) {}  // the residual is no pointer: it is y
  };

  /*! \brief Rows [r0, r0 + rows) of tile t from the micro-kernel's out[rows][ldo] into y: (out + bias) * gate
   *         + residual, each where the node has it (the float32 operations of the add and multiply steps). */
  static void StoreTile(const WqShape& s, const Operands& o, const float* out, int64_t t, int64_t r0, int64_t rows,
                        int64_t ldo = kTile) {
    const int64_t n0 = t * kTile, cols = std::min<int64_t>(kTile, s.n - n0);
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = o.y + (r0 + r) * s.n + n0;
      for (int64_t c = 0; c < cols; ++c) {
        float v = out[r * ldo + c] + (o.bias != nullptr ? o.bias[n0 + c] : 0.f);
        if (o.gate != nullptr) v *= o.gate[(r0 + r) * s.n + n0 + c];
        dst[c] = s.residual ? dst[c] + v : v;  // the output holds the residual (sum_input)
      }
    }
  }

  // below ~64K multiply-adds a fork/join costs more than the split saves
  static bool Parallel(const WqShape& s) { return s.tiles() > 1 && s.m * s.k * s.n >= (1 << 16); }

  /*! \brief One call, float32 activations: tiles split across the threads, each tile's rows kMaxRows at a time. */
  static void Run(const WqShape& s, wq::TileFn tile_fn, const std::vector<void*>& p) {
    const Operands o(s, p);
    const int64_t tiles = s.tiles(), blocks = s.blocks(), tile_bytes = s.tile_bytes();
    float* x_sums = o.offsets != nullptr ? static_cast<float*>(p.back()) : nullptr;  // temps_: [M][blocks]
    if (x_sums != nullptr) BlockSums(s, o.x, x_sums);
#pragma omp parallel for schedule(static) if (Parallel(s))
    for (int64_t t = 0; t < tiles; ++t) {
      alignas(64) float out[wq::kMaxRows * kTile];
      for (int64_t r0 = 0; r0 < s.m; r0 += wq::kMaxRows) {
        const int64_t rows = std::min<int64_t>(wq::kMaxRows, s.m - r0);
        wq::TileJob job{o.x + r0 * s.k, o.codes + t * tile_bytes, o.scales + t * blocks * kTile,
                        o.zeros != nullptr ? o.zeros + t * blocks * kTile : nullptr, s.implicit_zero(),
                        s.k, s.block, rows, out};
        job.offsets = o.offsets != nullptr ? o.offsets + t * blocks * kTile : nullptr;
        job.x_sums = x_sums != nullptr ? x_sums + r0 * blocks : nullptr;
        tile_fn(job);
        StoreTile(s, o, out, t, r0, rows);
      }
    }
  }

  /*! \brief Each data row's sum over each block of K (what the block's offset multiplies), in order. */
  static void BlockSums(const WqShape& s, const float* x, float* sums) {
    for (int64_t r = 0; r < s.m; ++r) {
      for (int64_t b = 0; b < s.blocks(); ++b) {
        float sum = 0.f;
        for (int64_t i = 0; i < s.block; ++i) sum += x[r * s.k + b * s.block + i];
        sums[r * s.blocks() + b] = sum;
      }
    }
  }

  /*! \brief What a call of the int8-activation kernels runs: the micro-kernel of \p dot (whose ISA quantizes the
   *         rows too), whether the scale tiles are float16, the codes' prefetch distance (QTileJob::prefetch). */
  struct Int8Call {
    wq::QTileFn tile_fn;
    wq::IntDot dot;
    bool half;
    int64_t prefetch;
  };

  /*! \brief The data rows quantized into the scratch \p scratch (ScratchBytes' layout), once a call, by the
   *         quantizer of \p dot's ISA. */
  struct QuantizedRows {
    int8_t* codes;  // [M, K]
    float* scales;  // [M, K / kActBlock]
    float* sums;    // scale * sum of codes, [M, K / kActBlock]
    int64_t xb;     // activation blocks a row
    QuantizedRows(const WqShape& s, const float* x, void* scratch, wq::IntDot dot)
        : codes(static_cast<int8_t*>(scratch)), scales(reinterpret_cast<float*>(codes + s.m * s.k)),
          sums(scales + s.m * (s.k / wq::kActBlock)), xb(s.k / wq::kActBlock) {
      wq::QuantizeRows(x, s.m, s.k, codes, scales, sums, dot);
    }
  };

  /*! \brief The micro-kernel job of rows [r0, r0 + rows) of tile t. */
  static wq::QTileJob QJob(const WqShape& s, const Operands& o, const Int8Call& call, const std::vector<void*>& p,
                           const QuantizedRows& x, int64_t t, int64_t r0, int64_t rows, float* out) {
    const int64_t at = t * s.blocks() * kTile, tile_bytes = s.tile_bytes();
    const bool own = !s.inline_scales;  // the scales are a tensor of their own (else inside the codes)
    wq::QTileJob job{x.codes + r0 * s.k, x.scales + r0 * x.xb, x.sums + r0 * x.xb,
                     o.codes + t * tile_bytes, call.half || !own ? nullptr : o.scales + at,
                     o.zeros != nullptr ? o.zeros + at : nullptr, s.implicit_zero(), s.k, s.block, rows, out,
                     call.half && own ? static_cast<const uint16_t*>(p[2]) + at : nullptr};
    job.offsets = o.offsets != nullptr ? o.offsets + at : nullptr;
    job.prefetch = call.prefetch;
    return job;
  }

  /*! \brief One call, int8 activations: the rows quantized once (per kActBlock), then as Run. */
  static void RunInt8(const WqShape& s, const Int8Call& call, const std::vector<void*>& p) {
    const Operands o(s, p);
    const int64_t tiles = s.tiles();
    const QuantizedRows x(s, o.x, p.back(), call.dot);
#pragma omp parallel for schedule(static) if (Parallel(s))
    for (int64_t t = 0; t < tiles; ++t) {
      alignas(64) float out[wq::kMaxRows * kTile];
      for (int64_t r0 = 0; r0 < s.m; r0 += wq::kMaxRows) {
        const int64_t rows = std::min<int64_t>(wq::kMaxRows, s.m - r0);
        call.tile_fn(QJob(s, o, call, p, x, t, r0, rows, out));
        StoreTile(s, o, out, t, r0, rows);
      }
    }
  }

  /*! \brief One call of many rows, the integer panel form, kIntFused's loop (opt-in): the rows quantized once (one
   *         thread, before the parallel region: quantizing them in it, a share a thread, cost one more barrier a call,
   *         0.61x on a loaded whole prefill), then the threads split the panels of kPanelTiles tiles, each multiplying
   *         its panel by the rows kQPanelRows at a time; the kernel writes the epilogue (bias, gate, residual) into
   *         the output itself.  Bit for bit RunQPanels' results. \p half: the scale tiles are float16. */
  static void RunQPanelsDirect(const WqShape& s, wq::QPanelFn fn, wq::IntDot dot, bool half,
                               const std::vector<void*>& p) {
    const Operands o(s, p);
    const QuantizedRows x(s, o.x, p.back(), dot);
    const int64_t panels = (s.tiles() + wq::kPanelTiles - 1) / wq::kPanelTiles;
#pragma omp parallel for schedule(static) if (Parallel(s))
    for (int64_t pn = 0; pn < panels; ++pn) QPanelColumns(s, fn, half, o, x, p, pn);
  }

  /*! \brief Panel \p pn of RunQPanelsDirect: every row block, the kernel writing the output. */
  static void QPanelColumns(const WqShape& s, wq::QPanelFn fn, bool half, const Operands& o, const QuantizedRows& x,
                            const std::vector<void*>& p, int64_t pn) {
    const int64_t tiles = s.tiles(), xb = x.xb, t0 = pn * wq::kPanelTiles, at = t0 * s.blocks() * kTile;
    const int64_t n0 = t0 * kTile;
    const uint16_t* halves = half && !s.inline_scales ? static_cast<const uint16_t*>(p[2]) : nullptr;
    const float* scales = half || s.inline_scales ? nullptr : o.scales + at;
    for (int64_t r0 = 0; r0 < s.m; r0 += wq::kQPanelRows) {
      wq::QPanelJob job{x.codes + r0 * s.k, x.scales + r0 * xb, x.sums + r0 * xb, o.codes + t0 * s.tile_bytes(),
                        scales, halves != nullptr ? halves + at : nullptr,
                        o.zeros != nullptr ? o.zeros + at : nullptr, s.implicit_zero(),
                        o.offsets != nullptr ? o.offsets + at : nullptr, s.k, s.block,
                        std::min<int64_t>(wq::kQPanelRows, s.m - r0), t0 + 1 < tiles ? 1 : 0, nullptr};
      const wq::QPanelOut out{o.y + r0 * s.n + n0, o.bias != nullptr ? o.bias + n0 : nullptr,
                              o.gate != nullptr ? o.gate + r0 * s.n + n0 : nullptr, s.n,
                              std::min(wq::kPanelWidth, s.n - n0), s.residual};
      job.direct = &out;
      fn(job);
    }
  }

  /*! \brief One call of many rows, int8 activations, the integer panel form (PanelForm kInt, session 14's loop):
   *         the rows quantized once, then the threads split the panels of kPanelTiles tiles, each multiplying its
   *         panel by the rows kQPanelRows at a time over all of K, the epilogue by StoreTile. \p half: the scale
   *         tiles are float16. */
  static void RunQPanels(const WqShape& s, wq::QPanelFn fn, wq::IntDot dot, bool half,
                         const std::vector<void*>& p) {
    const Operands o(s, p);
    const int64_t tiles = s.tiles(), blocks = s.blocks(), tile_bytes = s.tile_bytes(), xb = s.k / wq::kActBlock;
    const int64_t panels = (tiles + wq::kPanelTiles - 1) / wq::kPanelTiles;
    const QuantizedRows x(s, o.x, p.back(), dot);
    const uint16_t* halves = half && !s.inline_scales ? static_cast<const uint16_t*>(p[2]) : nullptr;
#pragma omp parallel for schedule(static) if (Parallel(s))
    for (int64_t pn = 0; pn < panels; ++pn) {
      alignas(64) float out[wq::kPanelTiles * wq::kQPanelRows * kTile];
      const int64_t t0 = pn * wq::kPanelTiles, second = t0 + 1 < tiles ? 1 : 0, at = t0 * blocks * kTile;
      for (int64_t r0 = 0; r0 < s.m; r0 += wq::kQPanelRows) {
        const int64_t rows = std::min<int64_t>(wq::kQPanelRows, s.m - r0);
        const wq::QPanelJob job{x.codes + r0 * s.k, x.scales + r0 * xb, x.sums + r0 * xb, o.codes + t0 * tile_bytes,
                                half || s.inline_scales ? nullptr : o.scales + at, halves != nullptr ? halves + at : nullptr,
                                o.zeros != nullptr ? o.zeros + at : nullptr, s.implicit_zero(),
                                o.offsets != nullptr ? o.offsets + at : nullptr, s.k, s.block, rows, second, out};
        fn(job);
        StoreTile(s, o, out, t0, r0, rows);
        if (second != 0) StoreTile(s, o, out + wq::kQPanelRows * kTile, t0 + 1, r0, rows);
      }
    }
  }

  /*! \brief One call of many rows, quad layout (dense_wq.h's panel form): the threads split the panels; each
   *         dequantizes its panel's tiles into its scratch once, then multiplies every row by it; with a gate or a
   *         residual the products go to a second scratch first and StoreTile applies them. \p half: the
   *         scale tiles are float16. */
  static void RunPanels(const WqShape& s, const wq::PanelFns& fns, bool half, const std::vector<void*>& p) {
    const Operands o(s, p);
    const int64_t tiles = s.tiles(), blocks = s.blocks(), tile_bytes = s.tile_bytes();
    const int64_t panels = (tiles + wq::kPanelTiles - 1) / wq::kPanelTiles;
#pragma omp parallel if (Parallel(s))
    {
      thread_local std::vector<float> w;  // one panel's weights, [K][kPanelWidth]
      w.resize(static_cast<size_t>(s.k * wq::kPanelWidth));
#pragma omp for schedule(static)
      for (int64_t pn = 0; pn < panels; ++pn) {
        for (int64_t i = 0; i < wq::kPanelTiles; ++i) {
          const int64_t t = std::min(pn * wq::kPanelTiles + i, tiles - 1);  // past the last tile: masked columns
          const int64_t at = t * blocks * kTile;
          const wq::QuadTile tile{o.codes + t * tile_bytes, half ? nullptr : o.scales + at,
                                  half ? static_cast<const uint16_t*>(p[2]) + at : nullptr,
                                  o.zeros != nullptr ? o.zeros + at : nullptr, s.implicit_zero(),
                                  o.offsets != nullptr ? o.offsets + at : nullptr, s.k, s.block};
          fns.dequantize(tile, w.data() + i * kTile);
        }
        const int64_t n0 = pn * wq::kPanelWidth, cols = std::min(wq::kPanelWidth, s.n - n0);
        if (!s.has_gate && !s.residual) {
          fns.multiply({o.x, w.data(), o.bias != nullptr ? o.bias + n0 : nullptr, o.y + n0, s.k, s.n, s.m, cols});
          continue;
        }
        thread_local std::vector<float> y;  // the panel's products, [M][kPanelWidth]
        y.resize(static_cast<size_t>(s.m * wq::kPanelWidth));
        fns.multiply({o.x, w.data(), nullptr, y.data(), s.k, wq::kPanelWidth, s.m, cols});
        for (int64_t i = 0; i * kTile < cols; ++i) {
          StoreTile(s, o, y.data() + i * kTile, pn * wq::kPanelTiles + i, 0, s.m, wq::kPanelWidth);
        }
      }
    }
  }

  std::string label_;
  WqShape s_;
  wq::Isa isa_;
  wq::IntDot dot_;
  bool half_;  // the int8-activation kernels read the node's float16 scales as they are
  wq::PanelForm form_;   // what a call of many rows runs (ManyRowsForm)
  wq::PanelFns panels_;  // the float panel form's functions where a call runs it, else null
  wq::QPanelFn qpanel_;  // the integer panel kernel where a call runs it, else null
  int64_t prefetch_;     // the integer kernels' software prefetch distance (wq::PrefetchBytes), 0: none
};

std::unique_ptr<Kernel> BuildDenseWq(const KernelContext& ctx) {
  AttrReader attrs(ctx.graph, ctx.node_index);
  const WqShape s = ReadWqShape(ctx, attrs);
  return std::make_unique<DenseWqKernel>(ctx, s);
}

/*! \brief Reads 8-bit codes and zero points and float16 scales. */
KernelTraits DenseWqTraits() {
  KernelTraits traits;
  traits.accepts_int8 = true;
  traits.accepts_float16 = true;
  return traits;
}

}  // namespace

void wq::ExpectPerBlock(const KernelContext& ctx, size_t k, const char* name, int64_t n, int64_t blocks) {
  const auto& shape = ctx.input(k).shape;
  if (shape.size() == 3 && shape[2] == 1) {
    ctx.ExpectInputShape(k, name, {n, blocks, 1});
  } else {
    ctx.ExpectInputShape(k, name, {n, blocks});
  }
}

BYOC_HETERO_REGISTER_KERNEL("dense_wq", BuildDenseWq, DenseWqTraits());

}  // namespace byoc_hetero
