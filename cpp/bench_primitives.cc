/*!
 * \file bench_primitives.cc
 * \brief See bench_primitives.h.
 */
#include "bench_primitives.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "threading.h"

namespace byoc_hetero {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

dnnl::algorithm EltwiseAlg(const std::string& name, float* alpha, float* beta) {
  *alpha = 0.f;
  *beta = 0.f;
  if (name == "relu") return dnnl::algorithm::eltwise_relu;
  if (name == "relu6") {
    *beta = 6.f;
    return dnnl::algorithm::eltwise_clip;
  }
  if (name == "sigmoid") return dnnl::algorithm::eltwise_logistic;
  if (name == "tanh") return dnnl::algorithm::eltwise_tanh;
  if (name == "gelu_erf") return dnnl::algorithm::eltwise_gelu_erf;
  if (name == "gelu_tanh") return dnnl::algorithm::eltwise_gelu_tanh;
  if (name == "silu") {
    *alpha = 1.f;
    return dnnl::algorithm::eltwise_swish;
  }
  TVM_FFI_THROW(ValueError) << "bare benchmark: unknown activation '" << name << "'";
  TVM_FFI_UNREACHABLE();
}

dnnl::primitive_attr Attr(const std::string& activation, bool residual) {
  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (activation != "none") {
    float alpha, beta;
    dnnl::algorithm alg = EltwiseAlg(activation, &alpha, &beta);
    ops.append_eltwise(alg, alpha, beta);
  }
  if (residual) ops.append_sum(1.f);
  if (ops.len() > 0) attr.set_post_ops(ops);
  return attr;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Run>
double TimeIt(Run&& run, int number, int repeat) {
  for (int i = 0; i < 3; ++i) run();  // warm-up (first touches, caches)
  std::vector<double> times;
  for (int r = 0; r < std::max(1, repeat); ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < std::max(1, number); ++i) run();
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
    times.push_back(d.count() / std::max(1, number));
  }
  return Median(times);
}

/*! \brief A memory in md filled with small values (weights go through a reorder from plain). */
memory Filled(const memory::desc& md, const dnnl::engine& eng, float value) {
  memory m(md, eng);
  float* p = static_cast<float*>(m.get_data_handle());
  const size_t n = md.get_size() / sizeof(float);
  for (size_t i = 0; i < n; ++i) p[i] = value * static_cast<float>((i % 7) + 1) / 7.f;
  return m;
}

}  // namespace

BareTiming TimeBareConv2D(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                          const std::vector<int64_t>& strides, const std::vector<int64_t>& padding,
                          const std::vector<int64_t>& dilation, int64_t groups, bool bias,
                          const std::string& activation, bool residual, int threads, int number,
                          int repeat) {
  if (x.size() != 4 || w.size() != 4 || strides.size() != 2 || padding.size() != 4 ||
      dilation.size() != 2 || groups < 1) {
    TVM_FFI_THROW(ValueError) << "bare conv2d benchmark: bad shapes or attributes";
  }
  OmpThreadsScope omp(threads);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const int64_t oh = (x[2] + padding[0] + padding[2] - ((w[2] - 1) * dilation[0] + 1)) / strides[0] + 1;
  const int64_t ow = (x[3] + padding[1] + padding[3] - ((w[3] - 1) * dilation[1] + 1)) / strides[1] + 1;
  const memory::dims src_dims{x[0], x[1], x[2], x[3]}, dst_dims{x[0], w[0], oh, ow};
  memory::dims wei_dims{w[0], w[1], w[2], w[3]};
  tag wei_plain = tag::oihw;
  if (groups > 1) {
    wei_dims = {groups, w[0] / groups, w[1], w[2], w[3]};
    wei_plain = tag::goihw;
  }
  const memory::desc any_src(src_dims, dt::f32, tag::any), any_dst(dst_dims, dt::f32, tag::any);
  const memory::desc any_wei(wei_dims, dt::f32, tag::any);
  const memory::desc bias_md = bias ? memory::desc({w[0]}, dt::f32, tag::a) : memory::desc();
  dnnl::convolution_forward::primitive_desc pd(
      eng, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any_src,
      any_wei, bias_md, any_dst, {strides[0], strides[1]}, {dilation[0] - 1, dilation[1] - 1},
      {padding[0], padding[1]}, {padding[2], padding[3]}, Attr(activation, residual));
  memory src = Filled(pd.src_desc(), eng, 0.5f);
  memory dst = Filled(pd.dst_desc(), eng, 0.f);
  memory wei(pd.weights_desc(), eng);
  memory wei_user = Filled(memory::desc(wei_dims, dt::f32, wei_plain), eng, 0.1f);
  dnnl::reorder(wei_user, wei).execute(strm, wei_user, wei);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (bias) args[DNNL_ARG_BIAS] = Filled(bias_md, eng, 0.01f);
  dnnl::convolution_forward conv(pd);
  strm.wait();
  BareTiming t;
  t.impl = pd.impl_info_str();
  t.seconds = TimeIt([&] { conv.execute(strm, args); strm.wait(); }, number, repeat);
  return t;
}

BareTiming TimeBareMatmul(int64_t m, int64_t k, int64_t n, bool bias, const std::string& activation,
                          int threads, int number, int repeat) {
  OmpThreadsScope omp(threads);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::desc src_md({m, k}, dt::f32, tag::ab), dst_md({m, n}, dt::f32, tag::ab);
  const memory::desc any_wei({k, n}, dt::f32, tag::any);
  const memory::desc bias_md = bias ? memory::desc({1, n}, dt::f32, tag::ab) : memory::desc();
  dnnl::matmul::primitive_desc pd(eng, src_md, any_wei, bias_md, dst_md, Attr(activation, false));
  memory src = Filled(src_md, eng, 0.5f), dst = Filled(dst_md, eng, 0.f);
  memory wei(pd.weights_desc(), eng);
  memory wei_user = Filled(memory::desc({k, n}, dt::f32, tag::ab), eng, 0.1f);
  dnnl::reorder(wei_user, wei).execute(strm, wei_user, wei);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (bias) args[DNNL_ARG_BIAS] = Filled(bias_md, eng, 0.01f);
  dnnl::matmul mm(pd);
  strm.wait();
  BareTiming t;
  t.impl = pd.impl_info_str();
  t.seconds = TimeIt([&] { mm.execute(strm, args); strm.wait(); }, number, repeat);
  return t;
}

}  // namespace byoc_hetero
