/*!
 * \file kernels/winograd.cc
 * \brief conv2d 3x3, stride 1 by Winograd's minimal filtering F(4x4, 3x3).
 *
 * oneDNN 3.2 ships no f32 Winograd convolution for AVX-512, and on 3x3 layers its direct
 * convolution already runs at the FMA peak; F(4x4, 3x3) needs 36 multiplies per 4x4 output tile
 * and channel pair instead of 144, so at equal GEMM speed it does the same work in about 40% of
 * the time (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
 *
 *   U[e][c][k] = (G g[k][c] G^T)[e]           weights, once at __init_ (then reordered for the GEMM)
 *   V[e][p][c] = (B^T d[p][c] B)[e]           input tiles (6x6, stride 4), per call
 *   M[e]       = V[e] x U[e]                  36 GEMMs [P, C] x [C, K]: one batched oneDNN matmul
 *   y[p][k]    = A^T M[.][p][k] A             4x4 output tiles, with bias and the epilogue
 *
 * e runs over the 36 points of a 6x6 tile, p over the P = N * ceil(OH/4) * ceil(OW/4) tiles.
 * Data and output are in nhwc or nChw16c (whichever the neighbouring oneDNN primitives use): in
 * both, 16 channels of a pixel are contiguous, so every transform works on 16-float vectors.  Rounding: the transforms
 * scale by up to 8 (A) and 5 (B), so results differ from a direct convolution by about 1e-5
 * relative in float32 (tests/test_runtime.py checks against numpy).
 */
#include <tvm/ffi/error.h>

#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernel.h"
#include "winograd.h"

namespace byoc_hetero {

namespace {

constexpr int kAlpha = 6;   // input tile edge (m + r - 1)
constexpr int kTile = 4;    // output tile edge (m)
constexpr int kPoints = kAlpha * kAlpha;
constexpr int kLanes = 16;  // channels per block (nChw16c)

#define BYOC_LANES _Pragma("omp simd") for (int v = 0; v < kLanes; ++v)

/*! \brief Where 16 channels of one pixel start: element strides of image, channel block, row, pixel. */
struct PixelStrides {
  int64_t image, block, row, pixel;
  size_t at(int64_t img, int64_t cb, int64_t y, int64_t x) const {
    return static_cast<size_t>(img * image + cb * block + y * row + x * pixel);
  }
};

/*! \brief PixelStrides of nChw16c (blocked16) or nhwc for [n, c, h, w]; c a multiple of 16. */
PixelStrides StridesOf(bool blocked16, int64_t c, int64_t h, int64_t w) {
  if (blocked16) return {c * h * w, h * w * 16, w * 16, 16};
  return {h * w * c, 16, w * c, c};
}

/*! \brief Shapes of one Winograd convolution. */
struct WinoShape {
  int64_t n, c, h, w, k, oh, ow, pad_top, pad_left;
  PixelStrides src, dst;
  int64_t tiles_h() const { return (oh + kTile - 1) / kTile; }
  int64_t tiles_w() const { return (ow + kTile - 1) / kTile; }
  int64_t tiles() const { return n * tiles_h() * tiles_w(); }
};

/*!
 * \brief Whether Activate() computes this activation.  An activation added to Activations()
 *        (enums.h) without a case in Activate() would otherwise be computed as the identity:
 *        such a conv runs direct (oneDNN's post-op) until Activate() learns it.
 */
bool CanActivate(const Activation& a) {
  using dnnl::algorithm;
  static constexpr algorithm kComputed[] = {
      algorithm::undef,  // "none"
      algorithm::eltwise_relu, algorithm::eltwise_clip,      algorithm::eltwise_logistic, algorithm::eltwise_tanh,
      algorithm::eltwise_gelu_erf, algorithm::eltwise_gelu_tanh, algorithm::eltwise_swish};
  return std::find(std::begin(kComputed), std::end(kComputed), a.alg) != std::end(kComputed);
}

/*! \brief The activation of an epilogue on 16 floats (one of CanActivate()). */
void Activate(const Activation& a, float* x) {
  switch (a.alg) {
    case dnnl::algorithm::eltwise_relu:
      BYOC_LANES x[v] = x[v] > 0.f ? x[v] : 0.f;
      break;
    case dnnl::algorithm::eltwise_clip:
      BYOC_LANES x[v] = std::min(std::max(x[v], a.alpha), a.beta);
      break;
    case dnnl::algorithm::eltwise_logistic:
      for (int v = 0; v < kLanes; ++v) x[v] = 1.f / (1.f + std::exp(-x[v]));
      break;
    case dnnl::algorithm::eltwise_tanh:
      for (int v = 0; v < kLanes; ++v) x[v] = std::tanh(x[v]);
      break;
    case dnnl::algorithm::eltwise_gelu_erf:
      for (int v = 0; v < kLanes; ++v) x[v] = 0.5f * x[v] * (1.f + std::erf(x[v] * 0.70710678118654752f));
      break;
    case dnnl::algorithm::eltwise_gelu_tanh:
      for (int v = 0; v < kLanes; ++v) {
        const float u = 0.79788456080286536f * (x[v] + 0.044715f * x[v] * x[v] * x[v]);
        x[v] = 0.5f * x[v] * (1.f + std::tanh(u));
      }
      break;
    case dnnl::algorithm::eltwise_swish:
      for (int v = 0; v < kLanes; ++v) x[v] = x[v] / (1.f + std::exp(-a.alpha * x[v]));
      break;
    default:
      break;  // none
  }
}

/*! \brief U = G g G^T for every (k, c): weights OIHW [K, C, 3, 3] -> U plain [36, C, K]. */
void TransformWeights(const float* g_all, float* u, int64_t k_total, int64_t c_total) {
  static const float G[kAlpha][3] = {{1.f / 4, 0, 0},
                                     {-1.f / 6, -1.f / 6, -1.f / 6},
                                     {-1.f / 6, 1.f / 6, -1.f / 6},
                                     {1.f / 24, 1.f / 12, 1.f / 6},
                                     {1.f / 24, -1.f / 12, 1.f / 6},
                                     {0, 0, 1}};
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < k_total; ++k) {
    for (int64_t c = 0; c < c_total; ++c) {
      const float* g = g_all + (k * c_total + c) * 9;
      float t[kAlpha][3];
      for (int i = 0; i < kAlpha; ++i) {
        for (int j = 0; j < 3; ++j) t[i][j] = G[i][0] * g[j] + G[i][1] * g[3 + j] + G[i][2] * g[6 + j];
      }
      for (int i = 0; i < kAlpha; ++i) {
        for (int j = 0; j < kAlpha; ++j) {
          u[((i * kAlpha + j) * c_total + c) * k_total + k] = t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2];
        }
      }
    }
  }
}

/*! \brief V = B^T d B for every tile and 16-channel block: data (nChw16c / nhwc) -> V plain [36, P, C]. */
__attribute__((target_clones("avx512f", "avx2", "default")))
void TransformInput(const float* src, float* out, const WinoShape& s) {
  const int64_t cb_total = s.c / kLanes, th = s.tiles_h(), tw = s.tiles_w(), tiles = s.tiles();
  const size_t point_stride = static_cast<size_t>(tiles * s.c);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t p = 0; p < tiles; ++p) {
    for (int64_t cb = 0; cb < cb_total; ++cb) {
      const int64_t img = p / (th * tw), ty = p / tw % th, tx = p % tw;
      const int64_t y0 = ty * kTile - s.pad_top, x0 = tx * kTile - s.pad_left;
      const float* base = src + s.src.at(img, cb, 0, 0);
      alignas(64) float d[kAlpha][kAlpha][kLanes];
      if (y0 >= 0 && x0 >= 0 && y0 + kAlpha <= s.h && x0 + kAlpha <= s.w) {
        for (int i = 0; i < kAlpha; ++i) {
          for (int j = 0; j < kAlpha; ++j) {
            const float* px = base + s.src.at(0, 0, y0 + i, x0 + j);
            BYOC_LANES d[i][j][v] = px[v];
          }
        }
      } else {  // a tile over the padding or the far edge: zeros outside the image
        for (int i = 0; i < kAlpha; ++i) {
          const int64_t y = y0 + i;
          for (int j = 0; j < kAlpha; ++j) {
            const int64_t x = x0 + j;
            if (y >= 0 && y < s.h && x >= 0 && x < s.w) {
              const float* px = base + s.src.at(0, 0, y, x);
              BYOC_LANES d[i][j][v] = px[v];
            } else {
              BYOC_LANES d[i][j][v] = 0.f;
            }
          }
        }
      }
      // B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
      alignas(64) float t[kAlpha][kAlpha][kLanes];
      for (int j = 0; j < kAlpha; ++j) {
        BYOC_LANES {
          const float d0 = d[0][j][v], d1 = d[1][j][v], d2 = d[2][j][v], d3 = d[3][j][v],
                      d4 = d[4][j][v], d5 = d[5][j][v];
          t[0][j][v] = 4.f * d0 - 5.f * d2 + d4;
          t[1][j][v] = -4.f * (d1 + d2) + d3 + d4;
          t[2][j][v] = 4.f * (d1 - d2) - d3 + d4;
          t[3][j][v] = -2.f * (d1 - d3) - d2 + d4;
          t[4][j][v] = 2.f * (d1 - d3) - d2 + d4;
          t[5][j][v] = 4.f * d1 - 5.f * d3 + d5;
        }
      }
      float* o = out + static_cast<size_t>(p * s.c + cb * kLanes);
      for (int i = 0; i < kAlpha; ++i) {
        float* row = o + static_cast<size_t>(i * kAlpha) * point_stride;
        BYOC_LANES {
          const float d0 = t[i][0][v], d1 = t[i][1][v], d2 = t[i][2][v], d3 = t[i][3][v],
                      d4 = t[i][4][v], d5 = t[i][5][v];
          row[0 * point_stride + v] = 4.f * d0 - 5.f * d2 + d4;
          row[1 * point_stride + v] = -4.f * (d1 + d2) + d3 + d4;
          row[2 * point_stride + v] = 4.f * (d1 - d2) - d3 + d4;
          row[3 * point_stride + v] = -2.f * (d1 - d3) - d2 + d4;
          row[4 * point_stride + v] = 2.f * (d1 - d3) - d2 + d4;
          row[5 * point_stride + v] = 4.f * d1 - 5.f * d3 + d5;
        }
      }
    }
  }
}

/*!
 * \brief y = A^T M A (+ bias, activation, residual sum, post activation) for every tile:
 *        M plain [36, P, K] -> dst (nChw16c / nhwc).  With a residual, dst already holds it.
 */
__attribute__((target_clones("avx512f", "avx2", "default")))
void TransformOutput(const float* m_all, const float* bias, float* dst, const WinoShape& s,
                     const Epilogue& ep) {
  const int64_t kb_total = s.k / kLanes, th = s.tiles_h(), tw = s.tiles_w(), tiles = s.tiles();
  const size_t point_stride = static_cast<size_t>(tiles * s.k);
  const bool plain_act = ep.act.none() || ep.act.alg == dnnl::algorithm::eltwise_relu;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t p = 0; p < tiles; ++p) {
    for (int64_t kb = 0; kb < kb_total; ++kb) {
      const int64_t img = p / (th * tw), ty = p / tw % th, tx = p % tw;
      const float* m = m_all + static_cast<size_t>(p * s.k + kb * kLanes);
      alignas(64) float b[kLanes];
      BYOC_LANES b[v] = bias != nullptr ? bias[kb * kLanes + v] : 0.f;
      // A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
      alignas(64) float t[kTile][kAlpha][kLanes];
      for (int j = 0; j < kAlpha; ++j) {
        BYOC_LANES {
          const float m0 = m[(0 * kAlpha + j) * point_stride + v], m1 = m[(1 * kAlpha + j) * point_stride + v],
                      m2 = m[(2 * kAlpha + j) * point_stride + v], m3 = m[(3 * kAlpha + j) * point_stride + v],
                      m4 = m[(4 * kAlpha + j) * point_stride + v], m5 = m[(5 * kAlpha + j) * point_stride + v];
          const float a = m1 + m2, bb = m1 - m2, c = m3 + m4, dd = m3 - m4;
          t[0][j][v] = m0 + a + c;
          t[1][j][v] = bb + 2.f * dd;
          t[2][j][v] = a + 4.f * c;
          t[3][j][v] = bb + 8.f * dd + m5;
        }
      }
      float* out_img = dst + s.dst.at(img, kb, 0, 0);
      for (int i = 0; i < kTile; ++i) {
        const int64_t y = ty * kTile + i;
        if (y >= s.oh) break;
        alignas(64) float o[kTile][kLanes];
        BYOC_LANES {
          const float m0 = t[i][0][v], m1 = t[i][1][v], m2 = t[i][2][v], m3 = t[i][3][v], m4 = t[i][4][v],
                      m5 = t[i][5][v];
          const float a = m1 + m2, bb = m1 - m2, c = m3 + m4, dd = m3 - m4;
          o[0][v] = m0 + a + c + b[v];
          o[1][v] = bb + 2.f * dd + b[v];
          o[2][v] = a + 4.f * c + b[v];
          o[3][v] = bb + 8.f * dd + m5 + b[v];
        }
        for (int j = 0; j < kTile; ++j) {
          const int64_t x = tx * kTile + j;
          if (x >= s.ow) break;
          float* px = out_img + s.dst.at(0, 0, y, x);
          if (plain_act) {
            if (!ep.act.none()) BYOC_LANES o[j][v] = o[j][v] > 0.f ? o[j][v] : 0.f;
          } else {
            Activate(ep.act, o[j]);
          }
          if (ep.residual) {
            BYOC_LANES o[j][v] += px[v];
            Activate(ep.post_act, o[j]);
          }
          BYOC_LANES px[v] = o[j][v];
        }
      }
    }
  }
}

/*! \brief nChw16c (blocked16) or nhwc for [N, C, H, W] (C a multiple of 16: no padding). */
memory::desc PixelDesc(const memory::dims& dims, bool blocked16) {
  return memory::desc(dims, memory::data_type::f32,
                      blocked16 ? memory::format_tag::nChw16c : memory::format_tag::nhwc);
}

class WinogradConvKernel : public Kernel {
 public:
  WinogradConvKernel(const KernelContext& ctx, const WinoShape& shape, bool has_bias,
                     const Epilogue& epilogue)
      : label_(ctx.where()), shape_(shape), has_bias_(has_bias), epilogue_(epilogue) {
    const memory::dims v_dims{kPoints, shape.tiles(), shape.c}, u_dims{kPoints, shape.c, shape.k},
        m_dims{kPoints, shape.tiles(), shape.k};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    gemm_ = MatmulForConstantWeight(
        [&](const memory::desc& u) {
          return dnnl::matmul::primitive_desc(ctx.engine, PlainDesc(v_dims), u, PlainDesc(m_dims), attr);
        },
        u_dims);
    temps_ = {PlainDesc(v_dims), PlainDesc(m_dims)};

    const memory::dims src_dims{shape.n, shape.c, shape.h, shape.w}, dst_dims{shape.n, shape.k, shape.oh, shape.ow};
    inputs_.push_back({PlainDesc(src_dims), PixelDesc(src_dims, shape.src.pixel == kLanes)});
    OperandLayout weights{PlainDesc({shape.k, shape.c, 3, 3}), gemm_.weights_desc()};
    weights.transform_name = "winograd F(4x4,3x3) weights";
    const dnnl::engine engine = ctx.engine;
    const memory::desc u_plain = PlainDesc(u_dims), u_want = gemm_.weights_desc();
    const int64_t k = shape.k, c = shape.c;
    weights.transform = [engine, u_plain, u_want, k, c](const std::vector<void*>& ptrs) {
      std::vector<float> u(static_cast<size_t>(kPoints * k * c));
      TransformWeights(static_cast<const float*>(ptrs[0]), u.data(), k, c);
      dnnl::memory from(u_plain, engine, u.data()), to(u_want, engine, ptrs[1]);
      dnnl::stream stream(engine);
      dnnl::reorder(from, to).execute(stream, from, to);
      stream.wait();
    };
    inputs_.push_back(std::move(weights));
    if (has_bias) inputs_.push_back({PlainDesc({shape.k}), PlainDesc({shape.k})});
    output_ = {PlainDesc(dst_dims), PixelDesc(dst_dims, shape.dst.pixel == kLanes)};
    if (epilogue.residual) {
      inputs_.push_back(output_);
      sum_input_ = static_cast<int>(inputs_.size()) - 1;
    }
  }

  std::vector<Step> Bind(const std::vector<MemRef>& inputs, const MemRef& output,
                         const std::vector<MemRef>& temps) const override {
    const WinoShape s = shape_;
    const Epilogue ep = epilogue_;
    const bool has_bias = has_bias_;
    Step in;
    in.label = label_ + ": winograd input transform";
    in.op = "conv2d";
    in.host = [s](const std::vector<void*>& p) {
      TransformInput(static_cast<const float*>(p[0]), static_cast<float*>(p[1]), s);
    };
    in.args = {{0, inputs[0]}, {1, temps[0]}};
    Step gemm;
    gemm.label = label_ + ": winograd batched GEMM";
    gemm.op = "conv2d";
    gemm.pd = gemm_;
    gemm.args = {{DNNL_ARG_SRC, temps[0]}, {DNNL_ARG_WEIGHTS, inputs[1]}, {DNNL_ARG_DST, temps[1]}};
    Step out;
    out.label = label_ + ": winograd output transform";
    out.op = "conv2d";
    out.host = [s, ep, has_bias](const std::vector<void*>& p) {
      TransformOutput(static_cast<const float*>(p[0]), has_bias ? static_cast<const float*>(p[1]) : nullptr,
                      static_cast<float*>(p.back()), s, ep);
    };
    out.args = {{0, temps[1]}};
    if (has_bias) out.args.emplace_back(1, inputs[2]);
    out.args.emplace_back(static_cast<int>(out.args.size()), output);
    return {std::move(in), std::move(gemm), std::move(out)};
  }

 private:
  std::string label_;
  WinoShape shape_;
  bool has_bias_;
  Epilogue epilogue_;
  dnnl::matmul::primitive_desc gemm_;
};

/*! \brief The value of an environment variable, or `fallback` when unset or empty. */
std::string EnvOr(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

}  // namespace

int64_t WinogradAutoMaxTaps() {
  // Winograd F(4x4, 3x3)'s transforms scale the data and weights by up to 10x (the points +-2,
  // +-1/2 ...), so its float32 rounding grows with the reduction length C x 9, about 10x the direct
  // convolution's.  Measured per layer against float64 (3x3, 28x28, 64 outputs, post-relu data,
  // 3 to 8 seeds, He-scaled weights; bench/ZOO.md, session 10): Winograd 4.1e-6 at 16 channels,
  // 6.3e-6 at 64, 8.9e-6 at 112, 1.0e-5 at 128, 1.1e-5 at 256, 1.5e-5 at 1024, 2.0e-5 at 2048;
  // direct 0.4e-6 to 1.9e-6 throughout.  So "auto" takes Winograd up to 112 channels (1008 taps).
  return 1008;
}

std::unique_ptr<Kernel> TryBuildWinogradConv2D(const KernelContext& ctx, const ConvParams& p) {
  // a node's own algorithm (a tuner's measured decision) wins over the process-wide knob
  const std::string algo = p.algo != "auto" ? p.algo : EnvOr("BYOC_HETERO_CONV_ALGO", "auto");
  if (algo == "direct") return nullptr;
  if (algo != "auto" && algo != "winograd") {
    ctx.Fail("BYOC_HETERO_CONV_ALGO must be auto, direct or winograd, got '" + algo + "'");
  }
  // Accuracy first: "auto" keeps float32 within 1e-5 of a float64 reference (WinogradAutoMaxTaps).
  if (algo == "auto" && p.c * p.kh * p.kw > WinogradAutoMaxTaps()) return nullptr;
  const bool shape_ok = p.kh == 3 && p.kw == 3 && p.strides[0] == 1 && p.strides[1] == 1 &&
                        p.dilation[0] == 1 && p.dilation[1] == 1 && p.groups == 1 &&
                        p.c % kLanes == 0 && p.k % kLanes == 0;
  // The weights must be known at __init_: transforming them per call would cost more than it saves.
  const bool const_weights = ctx.input_constant.size() > 1 && ctx.input_constant[1];
  if (!shape_ok || !const_weights) return nullptr;
  if (!CanActivate(p.epilogue.act) || !CanActivate(p.epilogue.post_act)) return nullptr;
  // Layouts: the one the data is stored in when that is nChw16c or nhwc (no reorder), else the
  // one oneDNN's direct convolution would choose here; the output in the same kind of layout, so
  // that neighbouring oneDNN primitives (which mostly pick the same) read it as it is.
  const memory::dims src_dims{p.n, p.c, p.h, p.w};
  const memory::desc stored = ctx.InputLayout(0);
  bool blocked16;
  const std::string forced = EnvOr("BYOC_HETERO_WINOGRAD_LAYOUT", "");  // tests: both layouts on any CPU
  if (forced == "nChw16c" || forced == "nhwc") {
    blocked16 = forced == "nChw16c";
  } else if (stored == PixelDesc(src_dims, true) || stored == PixelDesc(src_dims, false)) {
    blocked16 = stored == PixelDesc(src_dims, true);
  } else {
    const dnnl::convolution_forward::primitive_desc direct(
        ctx.engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        AnyDesc(src_dims), AnyDesc({p.k, p.c, 3, 3}), memory::desc(), AnyDesc({p.n, p.k, p.oh, p.ow}),
        {1, 1}, {p.pad_top, p.pad_left}, {p.oh + 2 - p.h - p.pad_top, p.ow + 2 - p.w - p.pad_left});
    blocked16 = direct.src_desc() == PixelDesc(src_dims, true);
  }
  // The output in the layout the planner asks for when it is one of the two (a DenseNet feature
  // written straight into its block's nChw16c concat buffer); the transform writes either.
  const memory::dims dst_dims{p.n, p.k, p.oh, p.ow};
  const bool follow_hint = forced.empty() && !p.epilogue.residual &&
                           (ctx.output_hint == PixelDesc(dst_dims, true) || ctx.output_hint == PixelDesc(dst_dims, false));
  const bool out_blocked16 = follow_hint ? ctx.output_hint == PixelDesc(dst_dims, true) : blocked16;
  WinoShape s{p.n, p.c, p.h, p.w, p.k, p.oh, p.ow, p.pad_top, p.pad_left,
              StridesOf(blocked16, p.c, p.h, p.w), StridesOf(out_blocked16, p.k, p.oh, p.ow)};
  // Measured on the benchmark's layers (bench/RESULTS.md): at 16 tiles (14x14 outputs) Winograd
  // and the direct convolution take about the same time, at 49 (28x28) Winograd is 2x faster;
  // with fewer tiles the GEMMs are too short to pay for streaming the 4x larger weights.
  constexpr int64_t kMinTiles = 25;
  if (algo == "auto" && s.tiles() < kMinTiles) return nullptr;
  // The tiles of all images are transformed at once: V and M take 36/16 of the input's and the
  // output's bytes. Large batches of large images would need gigabytes per execution context;
  // there the direct convolution runs in place.
  constexpr double kMaxTempBytes = 256.0 * (1 << 20);
  const double temp_bytes = 4.0 * kPoints * static_cast<double>(s.tiles()) * static_cast<double>(s.c + s.k);
  if (algo == "auto" && temp_bytes > kMaxTempBytes) return nullptr;
  return std::make_unique<WinogradConvKernel>(ctx, s, p.has_bias, p.epilogue);
}

}  // namespace byoc_hetero
