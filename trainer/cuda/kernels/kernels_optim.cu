// The optimizer's kernels: AdamW (float4-vectorised, core/adamw.h's element update, bit for bit
// the cpu backend's and the offloaded host step's) and the float64 sum of squares behind the global
// gradient norm (CUB's TransformReduce: a fixed grid and no atomics, so run-to-run deterministic on
// a device).
#include <cub/device/device_reduce.cuh>

#include "trainer/core/adamw.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
namespace {
using namespace detail;

template <bool kBf16Out>
struct AdamWOp {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  bf16* bf16_out;
  AdamWConstants c;
  template <int W>
  __device__ void Apply(size_t i) const {
    float p[W], g[W], m[W], v[W];
    Load<W>(p, param + i);
    Load<W>(g, grad + i);
    Load<W>(m, exp_avg + i);
    Load<W>(v, exp_avg_sq + i);
#pragma unroll
    for (int j = 0; j < W; ++j) AdamWElement(c, g[j], &p[j], &m[j], &v[j]);
    Store<W>(param + i, p);
    Store<W>(exp_avg + i, m);
    Store<W>(exp_avg_sq + i, v);
    if constexpr (kBf16Out) Store<W>(bf16_out + i, p);
  }
};

struct SquareToDouble {
  __host__ __device__ double operator()(float x) const {
    return static_cast<double>(x) * static_cast<double>(x);
  }
};
struct PlusDouble {
  __host__ __device__ double operator()(double a, double b) const { return a + b; }
};

size_t ReduceTempBytes(size_t n) {
  size_t bytes = 0;
  LT_CUDA_CHECK(cub::DeviceReduce::TransformReduce(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<double*>(nullptr), n,
      PlusDouble{}, SquareToDouble{}, 0.0));
  return bytes;
}

}  // namespace

void AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, float lr,
           float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
           bf16* bf16_out, cudaStream_t s) {
  AdamW(param, grad, exp_avg, exp_avg_sq, n,
        MakeAdamWConstants(lr, beta1, beta2, eps, weight_decay, step, grad_scale), bf16_out, s);
}

void AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
           const AdamWConstants& c, bf16* bf16_out, cudaStream_t s) {
  const bool vec =
      Aligned16(param) && Aligned16(grad) && Aligned16(exp_avg) && Aligned16(exp_avg_sq);
  if (bf16_out != nullptr) {
    LaunchMap<4>(AdamWOp<true>{param, grad, exp_avg, exp_avg_sq, bf16_out, c}, n, vec, s);
  } else {
    LaunchMap<4>(AdamWOp<false>{param, grad, exp_avg, exp_avg_sq, nullptr, c}, n, vec, s);
  }
}

double SumSquares(const float* x, size_t n, Scratch scratch, cudaStream_t s) {
  if (n == 0) return 0.0;
  ScratchCarver carver(scratch);
  double* out = carver.Take<double>(1, "SumSquares");
  size_t temp_bytes = ReduceTempBytes(n);
  void* temp = carver.Take<char>(temp_bytes, "SumSquares");
  LT_CUDA_CHECK(cub::DeviceReduce::TransformReduce(temp, temp_bytes, x, out, n, PlusDouble{},
                                                   SquareToDouble{}, 0.0, s));
  double host = 0.0;
  LT_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof(double), cudaMemcpyDeviceToHost, s));
  LT_CUDA_CHECK(cudaStreamSynchronize(s));
  return host;
}

size_t SumSquaresScratchBytes(size_t n) {
  return ScratchCarver::Size(sizeof(double)) + ScratchCarver::Size(ReduceTempBytes(n));
}

}  // namespace leantron::trainer::cuda
