// AdamW's update of one element (torch.optim.AdamW's formula, decoupled weight decay), shared by
// the cpu backend, the GPU kernel and the host step of --optimizer-cpu-offload, so that all three
// give the same bits: every operation is one IEEE-rounded float operation in the same order, with
// no multiply-add contracted on either side (the device spells each rounding out; the host files
// that call AdamWElement, ops_cpu.cc and host_adamw.cc, are built with -ffp-contract=off).
#pragma once

#include <cmath>
#include <cstdint>

#include "trainer/core/context_parallel.h"  // LEANTRON_HOST_DEVICE

namespace leantron::trainer {

// The per-step constants, computed on the host in float64 and rounded once.
struct AdamWConstants {
  float beta1, beta2, eps;
  float step_size;  // lr / (1 − beta1^step)
  float bc2_sqrt;   // sqrt(1 − beta2^step)
  float decay;      // 1 − lr · weight_decay (in float64, as torch's scalar)
  float grad_scale;
};

inline AdamWConstants MakeAdamWConstants(float lr, float beta1, float beta2, float eps,
                                         float weight_decay, int64_t step, float grad_scale) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  return {beta1, beta2, eps, static_cast<float>(lr / bc1), static_cast<float>(std::sqrt(bc2)),
          // The product of two floats is exact in float64: no contraction can change it.
          static_cast<float>(1.0 - static_cast<double>(lr) * static_cast<double>(weight_decay)),
          grad_scale};
}

// p, m, v updated from the gradient g (scaled by grad_scale here).
LEANTRON_HOST_DEVICE inline void AdamWElement(const AdamWConstants& c, float g, float* p, float* m,
                                              float* v) {
#ifdef __CUDA_ARCH__
  g = __fmul_rn(g, c.grad_scale);
  *m = __fadd_rn(__fmul_rn(c.beta1, *m), __fmul_rn(__fsub_rn(1.0f, c.beta1), g));
  *v = __fadd_rn(__fmul_rn(c.beta2, *v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, c.beta2), g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(*v), c.bc2_sqrt), c.eps);
  *p = __fsub_rn(__fmul_rn(*p, c.decay), __fdiv_rn(__fmul_rn(c.step_size, *m), denom));
#else
  g = g * c.grad_scale;
  *m = c.beta1 * *m + (1.0f - c.beta1) * g;
  *v = c.beta2 * *v + (1.0f - c.beta2) * g * g;
  const float denom = std::sqrt(*v) / c.bc2_sqrt + c.eps;
  *p = *p * c.decay - c.step_size * *m / denom;
#endif
}

}  // namespace leantron::trainer
