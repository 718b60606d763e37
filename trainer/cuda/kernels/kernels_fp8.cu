// FP8 casts, absolute maxima and scales (fp8.h).
#include <cuda_fp8.h>

#include <algorithm>

#include "trainer/core/adamw.h"
#include "trainer/cuda/kernels/fp8.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
using namespace detail;
namespace {

__device__ __forceinline__ float FromFp8(uint8_t q, Fp8Format f) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q, f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The block's maximum of m (every thread calls it), one atomic per block: atomics of every warp
// on the one address serialise in L2 and cost more than the cast.
__device__ __forceinline__ void BlockMaxAbs(float* amax, float m) {
  __shared__ float warp_max[32];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int warps = (blockDim.x * blockDim.y + 31) / 32;
  m = WarpMax(m);
  if ((tid & 31) == 0) warp_max[tid / 32] = m;
  __syncthreads();
  if (tid < 32) {
    m = WarpMax(tid < warps ? warp_max[tid] : 0.0f);
    if (tid == 0 && m > 0.0f) AtomicMaxAbs(amax, m);
  }
}

// A block per 32 x 32 tile, 32 x 8 threads: reads along rows, writes `out` along rows and, through
// shared memory, `out_t` along its rows (the columns of x). Any shape.
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
      if (out != nullptr) out[r * cols + c] = q;
      tile[i][tx] = q;
    }
  }
  if (amax != nullptr) BlockMaxAbs(amax, m);
  if (out_t == nullptr) return;
  __syncthreads();
  for (int i = ty; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + tx;
    if (r < rows && c < cols) out_t[c * rows + r] = tile[tx][i];
  }
}

// Four adjacent elements as floats, in one 8-byte (bf16) or 16-byte (float) load.
__device__ __forceinline__ void Load4(const bf16* p, float v[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&raw.x),
                       b = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
  v[0] = __low2float(a);
  v[1] = __high2float(a);
  v[2] = __low2float(b);
  v[3] = __high2float(b);
}
__device__ __forceinline__ void Load4(const float* p, float v[4]) {
  const float4 raw = *reinterpret_cast<const float4*>(p);
  v[0] = raw.x;
  v[1] = raw.y;
  v[2] = raw.z;
  v[3] = raw.w;
}

// The activations for casts to FP8, on the special-function unit (ex2.approx, rcp.approx): the
// library's tanhf made these casts compute-bound. Tanh GELU as x·σ(2u), u = √(2/π)(x + 0.044715x³)
// (0.5(1 + tanh u) = σ(2u)), so its value and gradient keep their relative accuracy (about 1e-6)
// where tanh u nears ±1; FP8 keeps 2^-4.
__device__ __forceinline__ float SigmoidApprox(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}
__device__ __forceinline__ float GeluFp8(float x, bool tanh_approx) {
  if (tanh_approx) return x * SigmoidApprox(2.0f * kSqrt2OverPi * (x + 0.044715f * x * x * x));
  return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}
__device__ __forceinline__ float GeluGradFp8(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float s = SigmoidApprox(2.0f * kSqrt2OverPi * (x + 0.044715f * x * x * x));
    return s + 2.0f * x * s * (1.0f - s) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
  }
  return 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * __expf(-0.5f * x * x);
}

// What the vector kernel reads, four adjacent elements (r, c..c+3) at a time as floats.
// kLoadsFirst: the kernel issues all of a thread's loads before it casts. That pays where the
// source is light on registers (a plain tensor: 5-7% on an H100; GELU's gradient: up to 7%) and
// costs where it is not (GELU and SwiGLU: 7-16% slower).
template <typename T>
struct PlainSource {
  static constexpr bool kLoadsFirst = true;
  const T* x;
  int64_t cols;
  __device__ void Load(int64_t r, int64_t c, float v[4]) const { Load4(x + r * cols + c, v); }
};

struct GeluSource {  // gelu(x), x [rows, cols]
  static constexpr bool kLoadsFirst = false;
  const bf16* x;
  int64_t cols;
  bool tanh_approx;
  __device__ void Load(int64_t r, int64_t c, float v[4]) const {
    Load4(x + r * cols + c, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = GeluFp8(v[j], tanh_approx);
  }
};

struct SwigluSource {  // silu(gate)·up, x [rows, 2w] = [gate | up]
  static constexpr bool kLoadsFirst = false;
  const bf16* x;
  int64_t w;
  __device__ void Load(int64_t r, int64_t c, float v[4]) const {
    float up[4];
    Load4(x + r * 2 * w + c, v);
    Load4(x + r * 2 * w + w + c, up);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = v[j] * SigmoidApprox(v[j]) * up[j];
  }
};

struct GeluGradSource {  // dact·gelu'(x)
  static constexpr bool kLoadsFirst = true;
  const bf16 *x, *dact;
  int64_t cols;
  bool tanh_approx;
  __device__ void Load(int64_t r, int64_t c, float v[4]) const {
    float xv[4];
    Load4(x + r * cols + c, xv);
    Load4(dact + r * cols + c, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] *= GeluGradFp8(xv[j], tanh_approx);
  }
};

// AdamW's update of a weight W [rows, cols] (core/adamw.h's element update): the fp32 weight and
// moments written back, the bf16 copy beside, and the copy's value cast. Each element is loaded
// once (the tile kernel visits it once). float4 loads and stores: 16-byte aligned, cols % 4 == 0.
struct AdamWSource {
  static constexpr bool kLoadsFirst = false;  // its loads wait for its stores either way
  float *param, *exp_avg, *exp_avg_sq;
  const float* grad;
  bf16* w16;
  int64_t cols;
  AdamWConstants c;
  __device__ void Load(int64_t r, int64_t col, float v[4]) const {
    const int64_t i = r * cols + col;
    float g[4], m[4], s[4];
    Load4(param + i, v);
    Load4(grad + i, g);
    Load4(exp_avg + i, m);
    Load4(exp_avg_sq + i, s);
    __nv_bfloat162 low[2];
#pragma unroll
    for (int j = 0; j < 4; ++j) AdamWElement(c, g[j], &v[j], &m[j], &s[j]);
    *reinterpret_cast<float4*>(param + i) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(exp_avg + i) = make_float4(m[0], m[1], m[2], m[3]);
    *reinterpret_cast<float4*>(exp_avg_sq + i) = make_float4(s[0], s[1], s[2], s[3]);
    low[0] = __floats2bfloat162_rn(v[0], v[1]);
    low[1] = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(w16 + i) = *reinterpret_cast<const uint2*>(low);
    v[0] = __low2float(low[0]);  // the cast reads the copy's value
    v[1] = __high2float(low[0]);
    v[2] = __low2float(low[1]);
    v[3] = __high2float(low[1]);
  }
};

// The cast on 64 x 64 tiles, 16 x 16 threads, four adjacent elements per thread and step: one
// vector load and one 4-byte store of `out`, and 4-byte stores of four adjacent elements of a
// row of `out_t`. Needs cols a multiple of 4 (and rows too with out_t) and aligned pointers.
// With `bias_partials` each tile's column sums go to bias_partials[blockIdx.y · cols + c].
constexpr int kVecTile = 64, kVecThreads = 16, kVecSteps = kVecTile / kVecThreads;

// The tile at (r0, c0) of a [rows, cols] tensor, written to the transpose out_t [cols, rows]: four
// adjacent rows' bytes of one column per 4-byte store.
__device__ __forceinline__ void StoreTileTransposed(const uint8_t (&tile)[kVecTile][kVecTile + 4],
                                                    uint8_t* out_t, int64_t r0, int64_t c0,
                                                    int64_t rows, int64_t cols) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t r = r0 + 4 * tx;
  for (int i = ty; i < kVecTile; i += kVecThreads) {
    const int64_t cc = c0 + i;
    if (cc < cols && r < rows) {
      const uint32_t packed = tile[4 * tx][i] | static_cast<uint32_t>(tile[4 * tx + 1][i]) << 8 |
                              static_cast<uint32_t>(tile[4 * tx + 2][i]) << 16 |
                              static_cast<uint32_t>(tile[4 * tx + 3][i]) << 24;
      *reinterpret_cast<uint32_t*>(out_t + cc * rows + r) = packed;
    }
  }
}

template <typename Source>
__global__ void CastToFp8Vec4Kernel(uint8_t* out, uint8_t* out_t, float* amax, Source src,
                                    int64_t rows, int64_t cols, const float* scale_p, Fp8Format f,
                                    float* bias_partials) {
  __shared__ uint8_t tile[kVecTile][kVecTile + 4];
  const float scale = *scale_p;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVecTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kVecTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = c0 + 4 * tx;
  float m = 0.0f, sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto cast = [&](int i, int64_t r, const float(&v)[4]) {
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      m = fmaxf(m, fabsf(v[j]));
      sums[j] += v[j];
      const uint8_t q = ToFp8(v[j] * scale, f);
      tile[i][4 * tx + j] = q;
      packed |= static_cast<uint32_t>(q) << (8 * j);
    }
    if (out != nullptr) *reinterpret_cast<uint32_t*>(out + r * cols + c) = packed;
  };
  if constexpr (Source::kLoadsFirst) {
    // Every load of the thread's rows first, then the casts and stores: a store to `out` may
    // alias the source as far as the compiler knows, so loads issued after one wait for it.
    float v[kVecSteps][4];
#pragma unroll
    for (int s = 0; s < kVecSteps; ++s) {
      const int64_t r = r0 + ty + s * kVecThreads;
      if (r < rows && c < cols) src.Load(r, c, v[s]);
    }
#pragma unroll
    for (int s = 0; s < kVecSteps; ++s) {
      const int i = ty + s * kVecThreads;
      if (r0 + i < rows && c < cols) cast(i, r0 + i, v[s]);
    }
  } else {
    for (int i = ty; i < kVecTile; i += kVecThreads) {
      if (r0 + i < rows && c < cols) {
        float v[4];
        src.Load(r0 + i, c, v);
        cast(i, r0 + i, v);
      }
    }
  }
  if (amax != nullptr) BlockMaxAbs(amax, m);
  if (bias_partials != nullptr) {
    __shared__ float col_sums[kVecThreads][kVecTile];
#pragma unroll
    for (int j = 0; j < 4; ++j) col_sums[ty][4 * tx + j] = sums[j];
    __syncthreads();
    const int t = ty * kVecThreads + tx;
    if (t < kVecTile && c0 + t < cols) {
      float total = 0.0f;
      for (int i = 0; i < kVecThreads; ++i) total += col_sums[i][t];
      bias_partials[static_cast<int64_t>(blockIdx.y) * cols + c0 + t] = total;
    }
  }
  if (out_t == nullptr) return;
  __syncthreads();
  StoreTileTransposed(tile, out_t, r0, c0, rows, cols);
}

// SwiGLU's gradient [d gate | d up] [rows, 2w] from dact [rows, w] and fc1's output x [rows, 2w]
// = [gate | up], cast as CastToFp8Vec4Kernel casts (the same tiles, amax and bias partials): a
// block per 64 x 64 tile of [rows, w] writes the gate's tile and the up projection's, so that
// gate, up and dact are each read once.
__global__ void CastSwigluGradKernel(uint8_t* out, uint8_t* out_t, float* amax, const bf16* x,
                                     const bf16* dact, int64_t rows, int64_t w,
                                     const float* scale_p, Fp8Format f, float* bias_partials) {
  __shared__ uint8_t tiles[2][kVecTile][kVecTile + 4];
  const float scale = *scale_p;
  const int64_t cols = 2 * w;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVecTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kVecTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = c0 + 4 * tx;
  float m = 0.0f, sums[2][4] = {};
  for (int i = ty; i < kVecTile; i += kVecThreads) {
    const int64_t r = r0 + i;
    if (r < rows && c < w) {
      float gate[4], up[4], dy[4], d[2][4];
      Load4(x + r * cols + c, gate);
      Load4(x + r * cols + w + c, up);
      Load4(dact + r * w + c, dy);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float sig = SigmoidApprox(gate[j]);
        d[0][j] = dy[j] * up[j] * sig * (1.0f + gate[j] * (1.0f - sig));
        d[1][j] = dy[j] * gate[j] * sig;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t packed = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          m = fmaxf(m, fabsf(d[h][j]));
          sums[h][j] += d[h][j];
          const uint8_t q = ToFp8(d[h][j] * scale, f);
          tiles[h][i][4 * tx + j] = q;
          packed |= static_cast<uint32_t>(q) << (8 * j);
        }
        if (out != nullptr) *reinterpret_cast<uint32_t*>(out + r * cols + h * w + c) = packed;
      }
    }
  }
  if (amax != nullptr) BlockMaxAbs(amax, m);
  if (bias_partials != nullptr) {
    __shared__ float col_sums[kVecThreads][kVecTile];
    const int t = ty * kVecThreads + tx;
    for (int h = 0; h < 2; ++h) {
      __syncthreads();
#pragma unroll
      for (int j = 0; j < 4; ++j) col_sums[ty][4 * tx + j] = sums[h][j];
      __syncthreads();
      if (t < kVecTile && c0 + t < w) {
        float total = 0.0f;
        for (int i = 0; i < kVecThreads; ++i) total += col_sums[i][t];
        bias_partials[static_cast<int64_t>(blockIdx.y) * cols + h * w + c0 + t] = total;
      }
    }
  }
  if (out_t == nullptr) return;
  __syncthreads();
  // Each half's transpose [w, rows] is rows [h·w, h·w + w) of out_t.
  for (int h = 0; h < 2; ++h) StoreTileTransposed(tiles[h], out_t + h * w * rows, r0, c0, rows, w);
}

// CastToFp8Vec4Kernel's tiles and transposed stores, of bytes already cast.
__global__ void TransposeFp8Kernel(uint8_t* out_t, const uint8_t* q, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kVecTile][kVecTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVecTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kVecTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = c0 + 4 * tx;
  for (int i = ty; i < kVecTile; i += kVecThreads) {
    const int64_t r = r0 + i;
    if (r < rows && c < cols) {
      const uint32_t packed = *reinterpret_cast<const uint32_t*>(q + r * cols + c);
#pragma unroll
      for (int j = 0; j < 4; ++j) tile[i][4 * tx + j] = static_cast<uint8_t>(packed >> (8 * j));
    }
  }
  __syncthreads();
  StoreTileTransposed(tile, out_t, r0, c0, rows, cols);
}

// dbias[c] += Σ_b partials[b · cols + c]: a block per 32 columns, kBiasGroups threads per column
// summing every kBiasGroups-th partial, then their sums in order (a fixed order: the same bits
// every run). A thread per column alone kept a few warps busy on a whole GPU.
constexpr int kBiasGroups = 8;

__global__ void AddBiasPartialsKernel(float* dbias, const float* partials, int64_t blocks,
                                      int64_t cols) {
  __shared__ float group_sums[kBiasGroups][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  float total = 0.0f;
  if (c < cols) {
#pragma unroll 8
    for (int64_t b = ty; b < blocks; b += kBiasGroups) total += partials[b * cols + c];
  }
  group_sums[ty][tx] = total;
  __syncthreads();
  if (ty != 0 || c >= cols) return;
  total = 0.0f;
  for (int g = 0; g < kBiasGroups; ++g) total += group_sums[g][tx];
  dbias[c] += total;
}

template <typename T>
__global__ void AbsMaxKernel(float* amax, const T* x, size_t n) {
  float m = 0.0f;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(ToFloat(x[i])));
  BlockMaxAbs(amax, m);
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

// TransformerEngine's delayed scaling for `count` tensors, a thread each, after a step whose casts
// recorded their amax in history[0] of their row: amax = max(row) or row[0]; the row rolls one
// place towards its start (row[i] = row[i + 1], the newest value moving to the end) and row[0] is
// cleared for the next step; then the scale as ComputeFp8Scale.
__global__ void DelayedScaleKernel(float* histories, int count, int len, bool most_recent,
                                   float* scales, float* scale_invs, int stride, float fp8_max,
                                   float margin) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= count) return;
  float* history = histories + static_cast<int64_t>(t) * len;
  float a = history[0];
  if (!most_recent)
    for (int i = 1; i < len; ++i) a = fmaxf(a, history[i]);
  const float newest = history[0];
  for (int i = 0; i + 1 < len; ++i) history[i] = history[i + 1];
  history[len - 1] = newest;
  history[0] = 0.0f;
  if (!(a > 0.0f) || !isfinite(a)) return;
  float sc = fp8_max / a / exp2f(margin);
  if (!isfinite(sc)) sc = 3.4028234663852886e38f;
  scales[int64_t{t} * stride] = sc;
  scale_invs[int64_t{t} * stride] = 1.0f / sc;
}

template <typename T>
bool Aligned(const T* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

float Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? 448.0f : 57344.0f; }

template <typename T>
void CastToFp8(uint8_t* out, uint8_t* out_t, float* amax, const T* x, int64_t rows, int64_t cols,
               const float* scale, Fp8Format format, cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  const bool vec = cols % 4 == 0 && (out_t == nullptr || rows % 4 == 0) &&
                   Aligned(x, 4 * sizeof(T)) && Aligned(out, 4) &&
                   (out_t == nullptr || Aligned(out_t, 4));
  if (vec) {
    const dim3 grid(static_cast<unsigned>(CeilDiv(cols, int64_t{kVecTile})),
                    static_cast<unsigned>(CeilDiv(rows, int64_t{kVecTile})));
    CastToFp8Vec4Kernel<<<grid, dim3(kVecThreads, kVecThreads), 0, s>>>(
        out, out_t, amax, PlainSource<T>{x, cols}, rows, cols, scale, format, nullptr);
  } else {
    const dim3 grid(static_cast<unsigned>(CeilDiv(cols, int64_t{kTile})),
                    static_cast<unsigned>(CeilDiv(rows, int64_t{kTile})));
    CastToFp8Kernel<T>
        <<<grid, dim3(kTile, kTileRows), 0, s>>>(out, out_t, amax, x, rows, cols, scale, format);
  }
  LT_CUDA_LAUNCH_CHECK();
}

void TransposeFp8(uint8_t* out_t, const uint8_t* q, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  if (rows % 4 != 0 || cols % 4 != 0 || !Aligned(q, 4) || !Aligned(out_t, 4))
    Die("TransposeFp8", "needs rows and columns in multiples of 4 and aligned tensors", __FILE__,
        __LINE__);
  const dim3 grid(static_cast<unsigned>(CeilDiv(cols, int64_t{kVecTile})),
                  static_cast<unsigned>(CeilDiv(rows, int64_t{kVecTile})));
  TransposeFp8Kernel<<<grid, dim3(kVecThreads, kVecThreads), 0, s>>>(out_t, q, rows, cols);
  LT_CUDA_LAUNCH_CHECK();
}

int64_t Fp8BiasWorkspace(int64_t rows, int64_t cols) {
  return CeilDiv(rows, int64_t{kVecTile}) * cols;
}

void CastSourceToFp8(uint8_t* out, uint8_t* out_t, float* amax, const Fp8Source& src, int64_t rows,
                     int64_t cols, const float* scale, Fp8Format format, float* dbias,
                     float* workspace, cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  if (rows % 4 != 0 || cols % 4 != 0 || !Aligned(src.x, 8) || !Aligned(src.dact, 8) ||
      !Aligned(out, 4) || !Aligned(out_t, 4))
    Die("CastSourceToFp8", "needs rows and columns in multiples of 4 and aligned tensors", __FILE__,
        __LINE__);
  const dim3 grid(static_cast<unsigned>(CeilDiv(cols, int64_t{kVecTile})),
                  static_cast<unsigned>(CeilDiv(rows, int64_t{kVecTile})));
  const dim3 block(kVecThreads, kVecThreads);
  float* partials = dbias != nullptr ? workspace : nullptr;
  auto launch = [&](auto source) {
    CastToFp8Vec4Kernel<<<grid, block, 0, s>>>(out, out_t, amax, source, rows, cols, scale, format,
                                               partials);
    LT_CUDA_LAUNCH_CHECK();
  };
  const bool tanh_approx = src.act == Fp8Activation::kGeluTanh;
  if (src.act == Fp8Activation::kNone) {
    launch(PlainSource<bf16>{src.x, cols});
  } else if (src.dact == nullptr) {
    if (src.act == Fp8Activation::kSwiglu) {
      launch(SwigluSource{src.x, cols});
    } else {
      launch(GeluSource{src.x, cols, tanh_approx});
    }
  } else if (src.act == Fp8Activation::kSwiglu) {
    const int64_t w = cols / 2;
    if (w % 4 != 0)
      Die("CastSourceToFp8", "SwiGLU's width must be a multiple of 4", __FILE__, __LINE__);
    const dim3 half(static_cast<unsigned>(CeilDiv(w, int64_t{kVecTile})), grid.y);
    CastSwigluGradKernel<<<half, block, 0, s>>>(out, out_t, amax, src.x, src.dact, rows, w, scale,
                                                format, partials);
    LT_CUDA_LAUNCH_CHECK();
  } else {
    launch(GeluGradSource{src.x, src.dact, cols, tanh_approx});
  }
  if (partials != nullptr) {
    AddBiasPartialsKernel<<<static_cast<unsigned>(CeilDiv(cols, int64_t{32})),
                            dim3(32, kBiasGroups), 0, s>>>(dbias, partials,
                                                           CeilDiv(rows, int64_t{kVecTile}), cols);
    LT_CUDA_LAUNCH_CHECK();
  }
}

void AdamWToFp8(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                const AdamWConstants& c, bf16* w16, int64_t rows, int64_t cols, uint8_t* out,
                uint8_t* out_t, float* amax, const float* scale, Fp8Format format, cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  const bool vec = rows % 4 == 0 && cols % 4 == 0 && Aligned(param, 16) && Aligned(grad, 16) &&
                   Aligned(exp_avg, 16) && Aligned(exp_avg_sq, 16) && Aligned(w16, 8) &&
                   Aligned(out, 4) && Aligned(out_t, 4);
  if (!vec) {  // the same values in two passes
    AdamW(param, grad, exp_avg, exp_avg_sq, static_cast<size_t>(rows * cols), c, w16, s);
    CastToFp8<bf16>(out, out_t, amax, w16, rows, cols, scale, format, s);
    return;
  }
  const dim3 grid(static_cast<unsigned>(CeilDiv(cols, int64_t{kVecTile})),
                  static_cast<unsigned>(CeilDiv(rows, int64_t{kVecTile})));
  CastToFp8Vec4Kernel<<<grid, dim3(kVecThreads, kVecThreads), 0, s>>>(
      out, out_t, amax, AdamWSource{param, exp_avg, exp_avg_sq, grad, w16, cols, c}, rows, cols,
      scale, format, nullptr);
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

void UpdateFp8DelayedScales(float* histories, int count, int len, bool most_recent, float* scales,
                            float* scale_invs, int stride, Fp8Format format, float margin,
                            cudaStream_t s) {
  if (count == 0) return;
  DelayedScaleKernel<<<CeilDiv(count, 128), 128, 0, s>>>(
      histories, count, len, most_recent, scales, scale_invs, stride, Fp8Max(format), margin);
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
