/*!
 * \file bench/bench_primitives.h
 * \brief Bare oneDNN primitives, timed alone or chained, written straight against the oneDNN API
 *        (no region graph, no planner, no kernels/ code): the references the benchmark compares
 *        the offloaded convolutions and dense layers with.
 *
 * Each primitive is created the way a oneDNN user would (format_tag::any for src, weights and
 * dst, forward_inference, the same post-ops), its weights reordered once, src/dst allocated in
 * the chosen layouts.  A chain runs its primitives one after the other, each reading the previous
 * one's dst when the layouts agree: a layer finds its input where the previous layer left it and
 * its weights wherever the other layers' traffic left them, as in a network.  A single primitive
 * is a chain of one: its data stay hot in cache.  After 3 warm-up passes, each layer's time is the
 * median over `repeat` windows of the mean over `number` passes (seconds per execution).
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

/*! \brief One layer of a chain: conv2d (data/weight shapes and attributes) or dense ([m,k] x [k,n]). */
struct BareLayer {
  std::string op;  // "conv2d" | "dense"
  std::vector<int64_t> data_shape, weight_shape, strides{1, 1}, padding{0, 0, 0, 0}, dilation{1, 1};
  int64_t groups = 1;
  int64_t m = 0, k = 0, n = 0;
  bool bias = false;
  std::string activation = "none";  // a name of Activations() (enums.h)
  std::vector<double> clip;          // [min, max] for "clip"
  bool residual = false;  // conv2d: sum post-op
};

/*! \brief The layers run in order as bare primitives; one timing per layer (a single layer: alone). */
std::vector<BareTiming> TimeBareChain(const std::vector<BareLayer>& layers, int threads, int number,
                                      int repeat);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_BENCH_PRIMITIVES_H_
