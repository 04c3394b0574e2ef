/*!
 * \file bench_primitives.h
 * \brief Bare oneDNN primitives timed on their own, written straight against the oneDNN API
 *        (no region graph, no planner, no kernels/ code): the reference the benchmark compares
 *        the offloaded convolutions and dense layers with.
 *
 * Each function creates the primitive the way a oneDNN user would (format_tag::any for src,
 * weights and dst, forward_inference, the same post-ops), reorders the weights once, allocates
 * src/dst in the chosen layouts, runs `warmup` executions, then returns the median of `repeat`
 * timings of `number` back-to-back executions each (seconds per execution).
 */
#ifndef BYOC_HETERO_BENCH_PRIMITIVES_H_
#define BYOC_HETERO_BENCH_PRIMITIVES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace byoc_hetero {

struct BareTiming {
  double seconds = 0;  // median per execution
  std::string impl;    // oneDNN implementation name
};

/*! \brief conv2d NCHW/OIHW; activation "none"|"relu"|... (as in the region format); residual: sum post-op. */
BareTiming TimeBareConv2D(const std::vector<int64_t>& data_shape,
                          const std::vector<int64_t>& weight_shape,
                          const std::vector<int64_t>& strides, const std::vector<int64_t>& padding,
                          const std::vector<int64_t>& dilation, int64_t groups, bool bias,
                          const std::string& activation, bool residual, int threads, int number,
                          int repeat);

/*! \brief [M, K] x [K, N] matmul with optional bias/activation. */
BareTiming TimeBareMatmul(int64_t m, int64_t k, int64_t n, bool bias, const std::string& activation,
                          int threads, int number, int repeat);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_BENCH_PRIMITIVES_H_
