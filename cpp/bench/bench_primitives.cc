/*!
 * \file bench/bench_primitives.cc
 * \brief See bench_primitives.h.
 */
#include "bench_primitives.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "../enums.h"
#include "../threading.h"

namespace byoc_hetero {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::primitive_attr Attr(const std::string& activation, const std::vector<double>& clip, bool residual) {
  const ActivationSpec* spec = FindEnum(Activations(), activation);
  if (spec == nullptr) {
    TVM_FFI_THROW(ValueError) << "bare benchmark: unknown activation '" << activation << "'";
  }
  if (spec->bounded != (clip.size() == 2)) {
    TVM_FFI_THROW(ValueError) << "bare benchmark: activation '" << activation << "' "
                              << (spec->bounded ? "needs clip = [min, max]" : "takes no clip");
  }
  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (spec->alg != dnnl::algorithm::undef) {
    const float alpha = spec->bounded ? static_cast<float>(clip[0]) : spec->alpha;
    const float beta = spec->bounded ? static_cast<float>(clip[1]) : spec->beta;
    ops.append_eltwise(spec->alg, alpha, beta);
  }
  if (residual) ops.append_sum(1.f);
  if (ops.len() > 0) attr.set_post_ops(ops);
  return attr;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/*! \brief A memory in md filled with small values (weights go through a reorder from plain). */
memory Filled(const memory::desc& md, const dnnl::engine& eng, float value) {
  memory m(md, eng);
  float* p = static_cast<float*>(m.get_data_handle());
  const size_t n = md.get_size() / sizeof(float);
  for (size_t i = 0; i < n; ++i) p[i] = value * static_cast<float>((i % 7) + 1) / 7.f;
  return m;
}

/*! \brief One primitive with its own weights and bias, ready to execute. */
struct Bare {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  std::string impl;
};

/*! \brief src: the previous primitive's dst when it has the layout this one chose, else fresh. */
void BindSrcDst(Bare* b, const memory::desc& src_md, const memory::desc& dst_md, const memory* prev_dst,
                const dnnl::engine& eng) {
  b->args[DNNL_ARG_SRC] = (prev_dst != nullptr && prev_dst->get_desc() == src_md) ? *prev_dst
                                                                                   : Filled(src_md, eng, 0.5f);
  b->args[DNNL_ARG_DST] = Filled(dst_md, eng, 0.f);
}

/*! \brief The weights (and bias) in the layout the primitive chose, reordered once from plain. */
void BindWeights(Bare* b, const memory::desc& chosen, const memory::desc& plain, const memory::desc& bias_md,
                 const dnnl::engine& eng, dnnl::stream& strm) {
  memory wei(chosen, eng);
  memory wei_user = Filled(plain, eng, 0.1f);
  dnnl::reorder(wei_user, wei).execute(strm, wei_user, wei);
  b->args[DNNL_ARG_WEIGHTS] = wei;
  if (!bias_md.is_zero()) b->args[DNNL_ARG_BIAS] = Filled(bias_md, eng, 0.01f);
}

Bare MakeConv2D(const BareLayer& l, const dnnl::engine& eng, dnnl::stream& strm, const memory* prev_dst) {
  const auto& x = l.data_shape;
  const auto& w = l.weight_shape;
  if (x.size() != 4 || w.size() != 4 || l.strides.size() != 2 || l.padding.size() != 4 ||
      l.dilation.size() != 2 || l.groups < 1) {
    TVM_FFI_THROW(ValueError) << "bare conv2d benchmark: expected 4-d data and weight shapes, 2 strides, "
                              << "4 paddings, 2 dilations and groups >= 1";
  }
  const int64_t oh = (x[2] + l.padding[0] + l.padding[2] - ((w[2] - 1) * l.dilation[0] + 1)) / l.strides[0] + 1;
  const int64_t ow = (x[3] + l.padding[1] + l.padding[3] - ((w[3] - 1) * l.dilation[1] + 1)) / l.strides[1] + 1;
  const memory::dims src_dims{x[0], x[1], x[2], x[3]}, dst_dims{x[0], w[0], oh, ow};
  memory::dims wei_dims{w[0], w[1], w[2], w[3]};
  tag wei_plain = tag::oihw;
  if (l.groups > 1) {
    wei_dims = {l.groups, w[0] / l.groups, w[1], w[2], w[3]};
    wei_plain = tag::goihw;
  }
  const memory::desc any_src(src_dims, dt::f32, tag::any), any_dst(dst_dims, dt::f32, tag::any);
  const memory::desc any_wei(wei_dims, dt::f32, tag::any);
  const memory::desc bias_md = l.bias ? memory::desc({w[0]}, dt::f32, tag::a) : memory::desc();
  dnnl::convolution_forward::primitive_desc pd(
      eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any_src, any_wei,
      bias_md, any_dst, {l.strides[0], l.strides[1]}, {l.dilation[0] - 1, l.dilation[1] - 1},
      {l.padding[0], l.padding[1]}, {l.padding[2], l.padding[3]}, Attr(l.activation, l.clip, l.residual));
  Bare b;
  BindSrcDst(&b, pd.src_desc(), pd.dst_desc(), prev_dst, eng);
  BindWeights(&b, pd.weights_desc(), memory::desc(wei_dims, dt::f32, wei_plain), bias_md, eng, strm);
  b.prim = dnnl::convolution_forward(pd);
  b.impl = pd.impl_info_str();
  return b;
}

Bare MakeMatmul(const BareLayer& l, const dnnl::engine& eng, dnnl::stream& strm, const memory* prev_dst) {
  if (l.m < 1 || l.k < 1 || l.n < 1) {
    TVM_FFI_THROW(ValueError) << "bare matmul benchmark: expected m, k, n >= 1, got " << l.m << ", " << l.k
                              << ", " << l.n;
  }
  const memory::desc src_md({l.m, l.k}, dt::f32, tag::ab), dst_md({l.m, l.n}, dt::f32, tag::ab);
  const memory::desc any_wei({l.k, l.n}, dt::f32, tag::any);
  const memory::desc bias_md = l.bias ? memory::desc({1, l.n}, dt::f32, tag::ab) : memory::desc();
  dnnl::matmul::primitive_desc pd(eng, src_md, any_wei, bias_md, dst_md, Attr(l.activation, l.clip, false));
  Bare b;
  BindSrcDst(&b, src_md, dst_md, prev_dst, eng);
  BindWeights(&b, pd.weights_desc(), memory::desc({l.k, l.n}, dt::f32, tag::ab), bias_md, eng, strm);
  b.prim = dnnl::matmul(pd);
  b.impl = pd.impl_info_str();
  return b;
}

}  // namespace

std::vector<BareTiming> TimeBareChain(const std::vector<BareLayer>& layers, int threads, int number,
                                      int repeat) {
  if (layers.empty()) TVM_FFI_THROW(ValueError) << "bare benchmark: no layers";
  OmpThreadsScope omp(threads);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  std::vector<Bare> chain;
  for (const BareLayer& l : layers) {
    const memory* prev = chain.empty() ? nullptr : &chain.back().args.at(DNNL_ARG_DST);
    if (l.op == "conv2d") {
      chain.push_back(MakeConv2D(l, eng, strm, prev));
    } else if (l.op == "dense") {
      chain.push_back(MakeMatmul(l, eng, strm, prev));
    } else {
      TVM_FFI_THROW(ValueError) << "bare benchmark: unknown op '" << l.op << "' (expected conv2d or dense)";
    }
  }
  strm.wait();
  std::vector<double> window(chain.size());
  auto pass = [&] {
    for (size_t i = 0; i < chain.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      chain[i].prim.execute(strm, chain[i].args);
      strm.wait();
      window[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  };
  for (int i = 0; i < 3; ++i) pass();  // warm-up (first touches, caches)
  const int passes = std::max(1, number);
  std::vector<std::vector<double>> per_layer(chain.size());
  for (int r = 0; r < std::max(1, repeat); ++r) {
    std::fill(window.begin(), window.end(), 0.0);
    for (int i = 0; i < passes; ++i) pass();
    for (size_t k = 0; k < chain.size(); ++k) per_layer[k].push_back(window[k] / passes);
  }
  std::vector<BareTiming> out(chain.size());
  for (size_t k = 0; k < chain.size(); ++k) {
    out[k].seconds = Median(per_layer[k]);
    out[k].impl = chain[k].impl;
  }
  return out;
}

}  // namespace byoc_hetero
