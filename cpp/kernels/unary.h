/*!
 * \file kernels/unary.h
 * \brief The host elementwise functions of kernels/unary.cc that other kernels call on their spans.
 */
#ifndef BYOC_HETERO_KERNELS_UNARY_H_
#define BYOC_HETERO_KERNELS_UNARY_H_

#include <cstdint>

namespace byoc_hetero {

/*! \brief y[0, n) = erf(x[0, n)): AVX2 + FMA where the CPU has them (absolute error below 2e-7), else std::erf. */
void ErfRun(const float* x, float* y, int64_t n);

}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_UNARY_H_
