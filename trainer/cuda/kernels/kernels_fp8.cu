// FP8 casts, absolute maxima and scales (fp8.h).
#include <cuda_fp8.h>

#include <algorithm>

#include "trainer/cuda/kernels/fp8.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
using namespace detail;
namespace {

__device__ __forceinline__ uint8_t ToFp8(float v, Fp8Format f) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ float FromFp8(uint8_t q, Fp8Format f) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q, f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

// |v| of non-negative floats orders as their bits: an integer maximum is the float maximum.
__device__ __forceinline__ void AtomicMaxAbs(float* amax, float m) {
  atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A block per 32 x 32 tile, 32 x 8 threads: reads along rows, writes `out` along rows and, through
// shared memory, `out_t` along its rows (the columns of x).
constexpr int kTile = 32, kTileRows = 8;

template <typename T>
__global__ void CastToFp8Kernel(uint8_t* out, uint8_t* out_t, float* amax, const T* x, int64_t rows,
                                int64_t cols, const float* scale_p, Fp8Format f) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float scale = *scale_p;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  float m = 0.0f;
  for (int i = ty; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + tx;
    if (r < rows && c < cols) {
      const float v = ToFloat(x[r * cols + c]);
      m = fmaxf(m, fabsf(v));  // fmaxf ignores NaN
      const uint8_t q = ToFp8(v * scale, f);
      out[r * cols + c] = q;
      tile[i][tx] = q;
    }
  }
  if (amax != nullptr) {
    m = WarpMax(m);
    if (tx == 0 && m > 0.0f) AtomicMaxAbs(amax, m);
  }
  if (out_t == nullptr) return;
  __syncthreads();
  for (int i = ty; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + tx;
    if (r < rows && c < cols) out_t[c * rows + r] = tile[tx][i];
  }
}

template <typename T>
__global__ void AbsMaxKernel(float* amax, const T* x, size_t n) {
  float m = 0.0f;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(ToFloat(x[i])));
  m = WarpMax(m);
  if ((threadIdx.x & 31) == 0 && m > 0.0f) AtomicMaxAbs(amax, m);
}

template <typename T>
__global__ void CastFromFp8Kernel(T* x, const uint8_t* q, size_t n, const float* scale_inv,
                                  Fp8Format f) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = FromFloat<T>(FromFp8(q[i], f) * *scale_inv);
}

__global__ void ComputeFp8ScaleKernel(float* scale, float* scale_inv, const float* amax,
                                      float fp8_max, float margin) {
  const float a = *amax;
  if (!(a > 0.0f) || !isfinite(a)) return;
  float sc = fp8_max / a / exp2f(margin);
  if (!isfinite(sc)) sc = 3.4028234663852886e38f;  // amax so small that the quotient overflows
  *scale = sc;
  *scale_inv = 1.0f / sc;
}

}  // namespace

float Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? 448.0f : 57344.0f; }

template <typename T>
void CastToFp8(uint8_t* out, uint8_t* out_t, float* amax, const T* x, int64_t rows, int64_t cols,
               const float* scale, Fp8Format format, cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(CeilDiv(cols, int64_t{kTile})),
                  static_cast<unsigned>(CeilDiv(rows, int64_t{kTile})));
  CastToFp8Kernel<T>
      <<<grid, dim3(kTile, kTileRows), 0, s>>>(out, out_t, amax, x, rows, cols, scale, format);
  LT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void AbsMax(float* amax, const T* x, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>(CeilDiv(n, size_t{256}), 1024));
  AbsMaxKernel<T><<<blocks, 256, 0, s>>>(amax, x, n);
  LT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void CastFromFp8(T* x, const uint8_t* q, size_t n, const float* scale_inv, Fp8Format format,
                 cudaStream_t s) {
  if (n == 0) return;
  CastFromFp8Kernel<T>
      <<<static_cast<unsigned>(CeilDiv(n, size_t{256})), 256, 0, s>>>(x, q, n, scale_inv, format);
  LT_CUDA_LAUNCH_CHECK();
}

void ComputeFp8Scale(float* scale, float* scale_inv, const float* amax, Fp8Format format,
                     float margin, cudaStream_t s) {
  ComputeFp8ScaleKernel<<<1, 1, 0, s>>>(scale, scale_inv, amax, Fp8Max(format), margin);
  LT_CUDA_LAUNCH_CHECK();
}

#define LT_FP8_INSTANTIATE(T)                                                                      \
  template void CastToFp8<T>(uint8_t*, uint8_t*, float*, const T*, int64_t, int64_t, const float*, \
                             Fp8Format, cudaStream_t);                                             \
  template void AbsMax<T>(float*, const T*, size_t, cudaStream_t);                                 \
  template void CastFromFp8<T>(T*, const uint8_t*, size_t, const float*, Fp8Format, cudaStream_t);
LT_FP8_INSTANTIATE(float)
LT_FP8_INSTANTIATE(bf16)
#undef LT_FP8_INSTANTIATE

}  // namespace leantron::trainer::cuda
