// Device helpers shared by the kernels_*.cu files (not part of the kernels.h interface): float
// conversions, 16-byte vector loads and stores, deterministic block reductions, the dropout hash
// and launch arithmetic.
#pragma once

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/kernels/fp8.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer::cuda::detail {

// ---- host-side launch arithmetic ----

template <typename A, typename B>
constexpr A CeilDiv(A a, B b) {
  return (a + static_cast<A>(b) - 1) / static_cast<A>(b);
}
template <typename A, typename B>
constexpr A RoundUp(A a, B b) {
  return CeilDiv(a, b) * static_cast<A>(b);
}
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Elements of T per 16-byte vector.
template <typename T>
inline constexpr int kVec = static_cast<int>(16 / sizeof(T));

// Carves 256-byte-aligned pieces off a Scratch in order; Take dies when it runs out.
class ScratchCarver {
 public:
  explicit ScratchCarver(Scratch s) : base_(static_cast<char*>(s.ptr)), bytes_(s.bytes) {}
  static size_t Size(size_t bytes) { return RoundUp(bytes, size_t{256}); }
  template <typename U>
  U* Take(size_t count, const char* what) {
    const size_t need = Size(count * sizeof(U));
    if (used_ + need > bytes_) Die("scratch", what, __FILE__, __LINE__);
    U* p = reinterpret_cast<U*>(base_ + used_);
    used_ += need;
    return p;
  }

 private:
  char* base_;
  size_t bytes_;
  size_t used_ = 0;
};

// ---- conversions ----

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 FromFloat<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
// x as it reads back after a store in T.
template <typename T>
__device__ __forceinline__ float RoundTo(float x) {
  return ToFloat(FromFloat<T>(x));
}

// ---- vector loads and stores ----

template <typename T>
struct alignas(16) Pack16 {
  T v[16 / sizeof(T)];
};

// W consecutive elements at p as floats. When W·sizeof(T) is a multiple of 16, p must be 16-byte
// aligned and the loads are 128-bit.
template <int W, typename T>
__device__ __forceinline__ void Load(float (&f)[W], const T* p) {
  if constexpr ((W * sizeof(T)) % 16 == 0) {
    constexpr int kPer = 16 / sizeof(T);
#pragma unroll
    for (int k = 0; k < W / kPer; ++k) {
      const Pack16<T> pk = reinterpret_cast<const Pack16<T>*>(p)[k];
#pragma unroll
      for (int j = 0; j < kPer; ++j) f[k * kPer + j] = ToFloat(pk.v[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) f[j] = ToFloat(p[j]);
  }
}

template <int W, typename T>
__device__ __forceinline__ void Store(T* p, const float (&f)[W]) {
  if constexpr ((W * sizeof(T)) % 16 == 0) {
    constexpr int kPer = 16 / sizeof(T);
#pragma unroll
    for (int k = 0; k < W / kPer; ++k) {
      Pack16<T> pk;
#pragma unroll
      for (int j = 0; j < kPer; ++j) pk.v[j] = FromFloat<T>(f[k * kPer + j]);
      reinterpret_cast<Pack16<T>*>(p)[k] = pk;
    }
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) p[j] = FromFloat<T>(f[j]);
  }
}

// ---- FP8 ----

// fp8(v): rounded to nearest even, saturating to the largest finite value, NaN kept.
__device__ __forceinline__ uint8_t ToFp8(float v, Fp8Format f) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}
// amax = max(amax, m) for m >= 0: non-negative floats order as their bits.
__device__ __forceinline__ void AtomicMaxAbs(float* amax, float m) {
  atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
}

// ---- activations (the formulas of CpuOps::GeluForward / GeluBackward and SwiGLU's) ----

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__device__ __forceinline__ float Gelu(float x, bool tanh_approx) {
  if (tanh_approx) return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}
__device__ __forceinline__ float GeluGrad(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float t = tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
  }
  return 0.5f * (1.0f + erff(x * kInvSqrt2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}
// silu(gate) · up, and its gradients for the output gradient dy.
__device__ __forceinline__ float Swiglu(float gate, float up) {
  return gate / (1.0f + expf(-gate)) * up;
}
__device__ __forceinline__ float SwigluGradGate(float gate, float up, float dy) {
  const float sig = 1.0f / (1.0f + expf(-gate));
  return dy * up * sig * (1.0f + gate * (1.0f - sig));
}
__device__ __forceinline__ float SwigluGradUp(float gate, float dy) {
  const float sig = 1.0f / (1.0f + expf(-gate));
  return dy * gate * sig;
}

// ---- reductions (blockDim.x a multiple of 32, at most 1024) ----

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly: every lane ends with the same value (a+b and b+a are bitwise equal).
template <typename Op>
__device__ __forceinline__ float WarpReduce(float v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduces N values over the block in a fixed order; every thread gets the results. All threads
// of the block must call it.
template <int N, typename Op>
__device__ __forceinline__ void BlockReduce(float (&v)[N], Op op) {
  __shared__ float sh[N][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = WarpReduce(v[k], op);
  __syncthreads();  // readers of a previous call are done with sh
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) sh[k][warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) {
    float r = sh[k][0];
    for (int w = 1; w < warps; ++w) r = op(r, sh[k][w]);
    v[k] = r;
  }
}

__device__ __forceinline__ float BlockSum(float v) {
  float a[1] = {v};
  BlockReduce(a, SumOp{});
  return a[0];
}
__device__ __forceinline__ float BlockMax(float v) {
  float a[1] = {v};
  BlockReduce(a, MaxOp{});
  return a[0];
}

// A block's pass over one row of `n` elements, its threads striding W at a time (each thread
// returns the block's result): the row's maximum, and Σ exp(x − m).
template <int W, typename T>
__device__ float BlockRowMax(const T* row, int64_t n) {
  float m = -INFINITY;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < n;
       c += static_cast<int64_t>(blockDim.x) * W) {
    float x[W];
    Load<W>(x, row + c);
#pragma unroll
    for (int j = 0; j < W; ++j) m = fmaxf(m, x[j]);
  }
  return BlockMax(m);
}
template <int W, typename T>
__device__ float BlockRowSumExp(const T* row, int64_t n, float m) {
  float s = 0.0f;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < n;
       c += static_cast<int64_t>(blockDim.x) * W) {
    float x[W];
    Load<W>(x, row + c);
#pragma unroll
    for (int j = 0; j < W; ++j) s += expf(x[j] - m);
  }
  return BlockSum(s);
}

// ---- dropout (ops.h's SplitMix64 / DropoutUniform, split so a row hashes its key once) ----

__host__ __device__ __forceinline__ uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// DropoutUniform(seed, sample, index) == UniformFromKey(SampleKey(seed, sample), index).
__host__ __device__ __forceinline__ uint64_t SampleKey(uint64_t seed, int64_t sample) {
  return Mix64(seed ^ (static_cast<uint64_t>(sample) * 0x2545f4914f6cdd1dULL));
}
__host__ __device__ __forceinline__ float UniformFromKey(uint64_t key, int64_t index) {
  return static_cast<float>(Mix64(key + static_cast<uint64_t>(index)) >> 40) * (1.0f / 16777216.0f);
}

// Where row r of a [rows, cols] activation sits in HiddenDropout's (sample, index) space.
struct RowDropout {
  uint64_t key = 0;
  int64_t base = 0;  // index of the row's column 0
  RowDropout() = default;
  __device__ __forceinline__ RowDropout(const HiddenDropout& d, int64_t r, int64_t cols) {
    int64_t sample, position;
    DropoutRowPlace(d, r, &sample, &position);
    key = SampleKey(d.seed, sample);
    base = position * cols;
  }
  __device__ __forceinline__ bool Keep(float p, int64_t c) const {
    return UniformFromKey(key, base + c) >= p;
  }
};

// ---- grid-stride elementwise launcher ----

// op.template Apply<W>(i) handles elements [i, i + W): W-wide for the first nvec vectors, then
// one at a time for the remaining elements.
template <int W, typename Op>
__global__ void MapKernel(Op op, size_t nvec, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t v = tid; v < nvec; v += stride) op.template Apply<W>(v * W);
  for (size_t i = nvec * W + tid; i < n; i += stride) op.template Apply<1>(i);
}

constexpr int kMapThreads = 256;
constexpr size_t kMapMaxBlocks = 8192;

// Vectorised when `vec` (every pointer 16-byte aligned and, for row-structured ops, the row length
// a multiple of W).
template <int W, typename Op>
void LaunchMap(const Op& op, size_t n, bool vec, cudaStream_t s) {
  if (n == 0) return;
  const size_t nvec = vec ? n / W : 0;
  const size_t work = nvec + (n - nvec * W);
  const size_t blocks = std::min(CeilDiv(work, size_t{kMapThreads}), kMapMaxBlocks);
  MapKernel<W><<<static_cast<unsigned>(blocks), kMapThreads, 0, s>>>(op, nvec, n);
  LT_CUDA_LAUNCH_CHECK();
}

// dst0[c] += Σ_g part[g, c] for c < n0 and dst1[c − n0] += … for n0 ≤ c < n (either destination
// may be null), summing the groups in a fixed order.
void ColumnReduce(float* dst0, float* dst1, const float* part, int64_t groups, int64_t n,
                  int64_t n0, cudaStream_t s);

}  // namespace leantron::trainer::cuda::detail
