// LayerNorm and RMSNorm (fused with the residual add and hidden dropout) and column sums (bias
// gradients). Forward: one block per row; the row stays in registers when it is 16-byte
// vectorisable and short enough (4096 vectors forward, 2048 backward), else a strided loop
// re-reads it. Backward: one wave of blocks (as many as fit on the device) stride over the rows,
// each keeping its weight-gradient partials in registers and writing them to scratch; a second
// kernel sums the partials in a fixed order.
#include <type_traits>

#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
namespace detail {
namespace {

constexpr int kColY = 8;  // row lanes of the column-sum blocks (32 columns × kColY rows)

__global__ void __launch_bounds__(32 * kColY)
    ColumnReduceKernel(float* dst0, float* dst1, const float* part, int64_t groups, int64_t n,
                       int64_t n0) {
  __shared__ float sh[kColY][32];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < n) {
#pragma unroll 4
    for (int64_t g = threadIdx.y; g < groups; g += kColY) s += part[g * n + c];
  }
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= n) return;
  float t = sh[0][threadIdx.x];
  for (int y = 1; y < kColY; ++y) t += sh[y][threadIdx.x];
  if (c < n0) {
    if (dst0 != nullptr) dst0[c] += t;
  } else if (dst1 != nullptr) {
    dst1[c - n0] += t;
  }
}

}  // namespace

void ColumnReduce(float* dst0, float* dst1, const float* part, int64_t groups, int64_t n,
                  int64_t n0, cudaStream_t s) {
  if (n == 0 || groups == 0) return;
  ColumnReduceKernel<<<static_cast<unsigned>(CeilDiv(n, 32)), dim3(32, kColY), 0, s>>>(
      dst0, dst1, part, groups, n, n0);
  LT_CUDA_LAUNCH_CHECK();
}

}  // namespace detail

namespace {
using namespace detail;

constexpr int kNormThreads = 512;  // most threads per row block

template <typename T>
struct NormFwdArgs {
  T* x_out;
  T* out;
  float* mean;
  float* rstd;
  const T* residual;
  const T* branch;
  const float* w;
  const float* b;
  int64_t rows, cols;
  float eps;
  HiddenDropout drop;
  const T* branch2 = nullptr;  // added to branch (rounded to T) before the dropout
  Fp8Out fp8 = {};             // with fp8.q, written in place of out
};

// W bytes at p (aligned to W when W is 4 or 8).
template <int W>
__device__ __forceinline__ void StoreBytes(uint8_t* p, const uint8_t (&b)[W]) {
  if constexpr (W == 8) {
    uint2 v;
    v.x = b[0] | b[1] << 8 | b[2] << 16 | static_cast<uint32_t>(b[3]) << 24;
    v.y = b[4] | b[5] << 8 | b[6] << 16 | static_cast<uint32_t>(b[7]) << 24;
    *reinterpret_cast<uint2*>(p) = v;
  } else if constexpr (W == 4) {
    *reinterpret_cast<uint32_t*>(p) =
        b[0] | b[1] << 8 | b[2] << 16 | static_cast<uint32_t>(b[3]) << 24;
  } else {
#pragma unroll
    for (int j = 0; j < W; ++j) p[j] = b[j];
  }
}

// The output's FP8 amax, once per block (every thread calls it).
__device__ __forceinline__ void NormFp8Amax(const Fp8Out& f, float m) {
  if (f.q == nullptr || f.amax == nullptr) return;
  m = BlockMax(m);
  if (threadIdx.x == 0 && m > 0.0f) AtomicMaxAbs(f.amax, m);
}

template <typename T>
struct NormBwdArgs {
  T* dx;
  T* dbranch;
  float* part;  // [groups, (1 or 2)·cols] weight (and bias) gradient partials
  const T* dout;
  const T* dresidual;
  const T* x;
  const float* w;
  const float* mean;
  const float* rstd;
  int64_t rows, cols;
  HiddenDropout drop;
};

// Elements [c, c + W) of the norm's input: branch, or residual + Dropout(branch [+ branch2])
// rounded to T and stored to x_out.
template <typename T, int W>
__device__ __forceinline__ void NormInput(float (&x)[W], const NormFwdArgs<T>& a, int64_t off,
                                          int64_t c, bool drop, const RowDropout& rd,
                                          float keep_scale) {
  Load<W>(x, a.branch + off + c);
  if (a.residual == nullptr) return;
  if (a.branch2 != nullptr) {
    float other[W];
    Load<W>(other, a.branch2 + off + c);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] = RoundTo<T>(x[j] + other[j]);
  }
  float res[W];
  Load<W>(res, a.residual + off + c);
#pragma unroll
  for (int j = 0; j < W; ++j) {
    float bj = x[j];
    if (drop) bj = rd.Keep(a.drop.p, c + j) ? bj * keep_scale : 0.0f;
    x[j] = RoundTo<T>(res[j] + bj);
  }
  Store<W>(a.x_out + off + c, x);
}

template <typename T, int W, int kIters, bool kRms>
__global__ void __launch_bounds__(kNormThreads) NormForwardCached(NormFwdArgs<T> a) {
  const int64_t r = blockIdx.x, cols = a.cols, off = r * cols;
  const bool drop = a.residual != nullptr && a.drop.p > 0.0f;
  RowDropout rd;
  if (drop) rd = RowDropout(a.drop, r, cols);
  const float keep_scale = drop ? 1.0f / (1.0f - a.drop.p) : 1.0f;

  float x[kIters][W];
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + i * blockDim.x) * W;
    if (c < cols) {
      NormInput<T, W>(x[i], a, off, c, drop, rd, keep_scale);
#pragma unroll
      for (int j = 0; j < W; ++j) sum += x[i][j];
    } else {
#pragma unroll
      for (int j = 0; j < W; ++j) x[i][j] = 0.0f;
    }
  }
  float mu = 0.0f;
  if constexpr (!kRms) mu = BlockSum(sum) / static_cast<float>(cols);
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + i * blockDim.x) * W;
    if (c < cols) {
#pragma unroll
      for (int j = 0; j < W; ++j) sq += (x[i][j] - mu) * (x[i][j] - mu);
    }
  }
  const float rs = 1.0f / sqrtf(BlockSum(sq) / static_cast<float>(cols) + a.eps);
  const float fp8_scale = a.fp8.q != nullptr ? *a.fp8.scale : 0.0f;
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + i * blockDim.x) * W;
    if (c < cols) {
      float wv[W], y[W];
      Load<W>(wv, a.w + c);
#pragma unroll
      for (int j = 0; j < W; ++j) y[j] = (x[i][j] - mu) * rs * wv[j];
      if (!kRms && a.b != nullptr) {
        float bv[W];
        Load<W>(bv, a.b + c);
#pragma unroll
        for (int j = 0; j < W; ++j) y[j] += bv[j];
      }
      if (a.fp8.q != nullptr) {
        uint8_t q[W];
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float v = RoundTo<T>(y[j]);  // the bytes a cast of the stored output gives
          m = fmaxf(m, fabsf(v));
          q[j] = ToFp8(v * fp8_scale, a.fp8.format);
        }
        StoreBytes<W>(a.fp8.q + off + c, q);
      } else {
        Store<W>(a.out + off + c, y);
      }
    }
  }
  NormFp8Amax(a.fp8, m);
  if (threadIdx.x == 0) {
    if (!kRms && a.mean != nullptr) a.mean[r] = mu;
    if (a.rstd != nullptr) a.rstd[r] = rs;
  }
}

// Any row length and alignment: three strided passes, re-reading x from memory.
template <typename T, bool kRms>
__global__ void __launch_bounds__(kNormThreads) NormForwardLoop(NormFwdArgs<T> a) {
  const int64_t r = blockIdx.x, cols = a.cols, off = r * cols;
  const bool drop = a.residual != nullptr && a.drop.p > 0.0f;
  RowDropout rd;
  if (drop) rd = RowDropout(a.drop, r, cols);
  const float keep_scale = drop ? 1.0f / (1.0f - a.drop.p) : 1.0f;
  // Where x lives once pass 1 is done (each thread re-reads only what it wrote).
  const T* xs = (a.residual != nullptr ? a.x_out : a.branch) + off;

  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float x[1];
    NormInput<T, 1>(x, a, off, c, drop, rd, keep_scale);
    sum += x[0];
  }
  float mu = 0.0f;
  if constexpr (!kRms) mu = BlockSum(sum) / static_cast<float>(cols);
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = ToFloat(xs[c]) - mu;
    sq += d * d;
  }
  const float rs = 1.0f / sqrtf(BlockSum(sq) / static_cast<float>(cols) + a.eps);
  const float fp8_scale = a.fp8.q != nullptr ? *a.fp8.scale : 0.0f;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float y = (ToFloat(xs[c]) - mu) * rs * a.w[c];
    if (!kRms && a.b != nullptr) y += a.b[c];
    if (a.fp8.q != nullptr) {
      const float v = RoundTo<T>(y);
      m = fmaxf(m, fabsf(v));
      a.fp8.q[off + c] = ToFp8(v * fp8_scale, a.fp8.format);
    } else {
      a.out[off + c] = FromFloat<T>(y);
    }
  }
  NormFp8Amax(a.fp8, m);
  if (threadIdx.x == 0) {
    if (!kRms && a.mean != nullptr) a.mean[r] = mu;
    if (a.rstd != nullptr) a.rstd[r] = rs;
  }
}

template <typename T, int W, int kIters, bool kRms>
__global__ void __launch_bounds__(kNormThreads) NormBackwardCached(NormBwdArgs<T> a) {
  const int64_t cols = a.cols;
  const bool drop = a.dbranch != nullptr && a.drop.p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - a.drop.p) : 1.0f;
  float wv[kIters][W], dw[kIters][W], db[kIters][W];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + i * blockDim.x) * W;
#pragma unroll
    for (int j = 0; j < W; ++j) wv[i][j] = dw[i][j] = db[i][j] = 0.0f;
    if (c < cols) Load<W>(wv[i], a.w + c);
  }
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t off = r * cols;
    const float mu = kRms ? 0.0f : a.mean[r], rs = a.rstd[r];
    float xn[kIters][W], dy[kIters][W];
    // The residual's gradient is loaded with the rest, not after the row's reduction, where the
    // block would wait for it (up to two vectors per thread; more would spill).
    constexpr int kEarly = kIters <= 2 ? kIters : 0;
    float dr[kEarly > 0 ? kEarly : 1][W];
    float s[2] = {0.0f, 0.0f};  // Σ dnorm, Σ dnorm·norm
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int64_t c = (static_cast<int64_t>(threadIdx.x) + i * blockDim.x) * W;
      if (c < cols) {
        Load<W>(xn[i], a.x + off + c);
        Load<W>(dy[i], a.dout + off + c);
        if (i < kEarly && a.dresidual != nullptr) Load<W>(dr[i], a.dresidual + off + c);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          xn[i][j] = (xn[i][j] - mu) * rs;
          const float dn = wv[i][j] * dy[i][j];
          s[0] += dn;
          s[1] += dn * xn[i][j];
          dw[i][j] += xn[i][j] * dy[i][j];
          db[i][j] += dy[i][j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) xn[i][j] = dy[i][j] = 0.0f;
      }
    }
    BlockReduce(s, SumOp{});
    const float m1 = kRms ? 0.0f : s[0] / static_cast<float>(cols);
    const float m2 = s[1] / static_cast<float>(cols);
    RowDropout rd;
    if (drop) rd = RowDropout(a.drop, r, cols);
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int64_t c = (static_cast<int64_t>(threadIdx.x) + i * blockDim.x) * W;
      if (c >= cols) continue;
      float g[W];
#pragma unroll
      for (int j = 0; j < W; ++j) g[j] = (wv[i][j] * dy[i][j] - m1 - xn[i][j] * m2) * rs;
      if (a.dresidual != nullptr) {
        float late[W];
        if (i >= kEarly) Load<W>(late, a.dresidual + off + c);
#pragma unroll
        for (int j = 0; j < W; ++j) g[j] += i < kEarly ? dr[i][j] : late[j];
      }
      Store<W>(a.dx + off + c, g);
      if (a.dbranch != nullptr) {
        if (drop) {
#pragma unroll
          for (int j = 0; j < W; ++j) g[j] = rd.Keep(a.drop.p, c + j) ? g[j] * keep_scale : 0.0f;
        }
        Store<W>(a.dbranch + off + c, g);
      }
    }
  }
  float* part = a.part + static_cast<int64_t>(blockIdx.x) * (kRms ? 1 : 2) * cols;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int64_t c = (static_cast<int64_t>(threadIdx.x) + i * blockDim.x) * W;
    if (c >= cols) continue;
    Store<W>(part + c, dw[i]);
    if (!kRms) Store<W>(part + cols + c, db[i]);
  }
}

// Any row length and alignment; the partials accumulate in the block's scratch row (each column
// owned by one thread).
template <typename T, bool kRms>
__global__ void __launch_bounds__(kNormThreads) NormBackwardLoop(NormBwdArgs<T> a) {
  const int64_t cols = a.cols;
  const bool drop = a.dbranch != nullptr && a.drop.p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - a.drop.p) : 1.0f;
  float* pdw = a.part + static_cast<int64_t>(blockIdx.x) * (kRms ? 1 : 2) * cols;
  float* pdb = pdw + cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    pdw[c] = 0.0f;
    if (!kRms) pdb[c] = 0.0f;
  }
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t off = r * cols;
    const float mu = kRms ? 0.0f : a.mean[r], rs = a.rstd[r];
    float s[2] = {0.0f, 0.0f};
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xn = (ToFloat(a.x[off + c]) - mu) * rs, dy = ToFloat(a.dout[off + c]);
      const float dn = a.w[c] * dy;
      s[0] += dn;
      s[1] += dn * xn;
      pdw[c] += xn * dy;
      if (!kRms) pdb[c] += dy;
    }
    BlockReduce(s, SumOp{});
    const float m1 = kRms ? 0.0f : s[0] / static_cast<float>(cols);
    const float m2 = s[1] / static_cast<float>(cols);
    RowDropout rd;
    if (drop) rd = RowDropout(a.drop, r, cols);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xn = (ToFloat(a.x[off + c]) - mu) * rs, dy = ToFloat(a.dout[off + c]);
      float g = (a.w[c] * dy - m1 - xn * m2) * rs;
      if (a.dresidual != nullptr) g += ToFloat(a.dresidual[off + c]);
      a.dx[off + c] = FromFloat<T>(g);
      if (a.dbranch != nullptr) {
        if (drop) g = rd.Keep(a.drop.p, c) ? g * keep_scale : 0.0f;
        a.dbranch[off + c] = FromFloat<T>(g);
      }
    }
  }
}

template <int kIters>
using Iters = std::integral_constant<int, kIters>;

// Threads of a cached-row block: nvec vectors at k per thread, whole warps.
int CachedThreads(int64_t nvec, int k) { return static_cast<int>(RoundUp(CeilDiv(nvec, k), 32)); }

// Calls f(Iters<k>{}, threads) for the smallest k ∈ {1, 2, 4, 8}, k ≤ kMaxIters, that covers
// nvec vectors with kNormThreads threads; false when none does.
template <int kMaxIters, typename F>
bool DispatchIters(int64_t nvec, F&& f) {
  if (nvec <= kNormThreads) {
    f(Iters<1>{}, CachedThreads(nvec, 1));
    return true;
  }
  if (nvec <= 2 * kNormThreads) {
    f(Iters<2>{}, CachedThreads(nvec, 2));
    return true;
  }
  if constexpr (kMaxIters >= 4) {
    if (nvec <= 4 * kNormThreads) {
      f(Iters<4>{}, CachedThreads(nvec, 4));
      return true;
    }
  }
  if constexpr (kMaxIters >= 8) {
    if (nvec <= 8 * kNormThreads) {
      f(Iters<8>{}, CachedThreads(nvec, 8));
      return true;
    }
  }
  return false;
}

int LoopThreads(int64_t cols) {
  return static_cast<int>(std::min<int64_t>(kNormThreads, RoundUp(CeilDiv(cols, 4), 32)));
}

template <typename T, bool kRms>
void LaunchNormForward(const NormFwdArgs<T>& a, cudaStream_t s) {
  if (a.rows == 0 || a.cols == 0) return;
  constexpr int W = kVec<T>;
  const bool vec = a.cols % W == 0 && Aligned16(a.x_out) && Aligned16(a.out) &&
                   Aligned16(a.residual) && Aligned16(a.branch) && Aligned16(a.branch2) &&
                   Aligned16(a.w) && Aligned16(a.b) &&
                   reinterpret_cast<uintptr_t>(a.fp8.q) % W == 0;
  const unsigned grid = static_cast<unsigned>(a.rows);
  const bool done =
      vec && DispatchIters<8>(a.cols / W, [&](auto iters, int threads) {
        NormForwardCached<T, W, decltype(iters)::value, kRms><<<grid, threads, 0, s>>>(a);
      });
  if (!done) NormForwardLoop<T, kRms><<<grid, LoopThreads(a.cols), 0, s>>>(a);
  LT_CUDA_LAUNCH_CHECK();
}

int DeviceSMs() {
  int device = 0, sms = 0;
  LT_CUDA_CHECK(cudaGetDevice(&device));
  LT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// The backward runs one wave of blocks (as many as the device holds at once, so no partial last
// wave), each striding over the rows. A function of the device and the shape only: deterministic.
template <typename Kernel>
int64_t ResidentGroups(Kernel kernel, int threads, int64_t rows) {
  int per_sm = 0;
  LT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return std::min<int64_t>(rows, static_cast<int64_t>(DeviceSMs()) * std::max(per_sm, 1));
}

// An upper bound of ResidentGroups for any T and path: at most 2048 threads and 32 blocks per SM,
// with the fewest threads any launch of this row length uses.
size_t NormBackwardScratch(int64_t rows, int64_t cols, int arrays) {
  int threads = LoopThreads(cols);
  for (int w : {kVec<float>, kVec<bf16>}) {
    const int64_t nvec = CeilDiv(cols, w);
    for (int k : {1, 2, 4}) {
      if (nvec <= k * kNormThreads) threads = std::min(threads, CachedThreads(nvec, k));
    }
  }
  const int64_t per_sm = std::min(32, 2048 / threads);
  const int64_t groups = std::min<int64_t>(rows, DeviceSMs() * per_sm);
  return ScratchCarver::Size(static_cast<size_t>(groups) * arrays * cols * sizeof(float));
}

template <typename T, bool kRms>
void LaunchNormBackward(NormBwdArgs<T> a, float* dw, float* db, Scratch scratch, cudaStream_t s) {
  if (a.rows == 0 || a.cols == 0) return;
  constexpr int W = kVec<T>;
  const int arrays = kRms ? 1 : 2;
  auto run = [&](auto kernel, int threads) {
    const int64_t groups = ResidentGroups(kernel, threads, a.rows);
    ScratchCarver carver(scratch);
    a.part = carver.Take<float>(static_cast<size_t>(groups) * arrays * a.cols, "norm backward");
    kernel<<<static_cast<unsigned>(groups), threads, 0, s>>>(a);
    LT_CUDA_LAUNCH_CHECK();
    ColumnReduce(dw, db, a.part, groups, arrays * a.cols, a.cols, s);
  };
  const bool vec = a.cols % W == 0 && Aligned16(a.dx) && Aligned16(a.dbranch) &&
                   Aligned16(a.dout) && Aligned16(a.dresidual) && Aligned16(a.x) && Aligned16(a.w);
  // Beyond 4 vectors per thread the backward's five register arrays would spill.
  const bool done = vec && DispatchIters<4>(a.cols / W, [&](auto iters, int threads) {
                      run(NormBackwardCached<T, W, decltype(iters)::value, kRms>, threads);
                    });
  if (!done) run(NormBackwardLoop<T, kRms>, LoopThreads(a.cols));
}

// Column sums: blocks of 32 column vectors × kColY row lanes over a chunk of rows, each writing
// one partial row; ColumnReduce adds the partials up.
template <typename T, int W>
__global__ void __launch_bounds__(32 * kColY)
    ColumnPartialKernel(float* part, const T* in, int64_t rows, int64_t cols, int64_t chunk) {
  __shared__ float sh[kColY][W][32];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * W;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float acc[W];
#pragma unroll
  for (int j = 0; j < W; ++j) acc[j] = 0.0f;
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColY) {
      float v[W];
      Load<W>(v, in + r * cols + c);
#pragma unroll
      for (int j = 0; j < W; ++j) acc[j] += v[j];
    }
  }
#pragma unroll
  for (int j = 0; j < W; ++j) sh[threadIdx.y][j][threadIdx.x] = acc[j];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float t[W];
#pragma unroll
  for (int j = 0; j < W; ++j) {
    t[j] = sh[0][j][threadIdx.x];
    for (int y = 1; y < kColY; ++y) t[j] += sh[y][j][threadIdx.x];
  }
  Store<W>(part + static_cast<int64_t>(blockIdx.y) * cols + c, t);
}

// Row chunks of the column sums: a function of rows only, so scratch grows with cols.
int64_t ColumnGroups(int64_t rows) { return std::min<int64_t>(CeilDiv(rows, int64_t{32}), 512); }

}  // namespace

template <typename T>
void AddLayerNormForward(T* x_out, T* out, float* mean, float* rstd, const T* residual,
                         const T* branch, const float* w, const float* b, int64_t rows,
                         int64_t cols, float eps, const HiddenDropout& drop, cudaStream_t s,
                         const T* branch2, const Fp8Out& fp8) {
  if (residual == nullptr && branch2 != nullptr)
    Die("AddLayerNormForward", "a second branch needs a residual", __FILE__, __LINE__);
  LaunchNormForward<T, false>(
      {x_out, out, mean, rstd, residual, branch, w, b, rows, cols, eps, drop, branch2, fp8}, s);
}

template <typename T>
void LayerNormBackward(T* dx, T* dbranch, float* dw, float* db, const T* dout, const T* dresidual,
                       const T* x, const float* w, const float* mean, const float* rstd,
                       int64_t rows, int64_t cols, const HiddenDropout& drop, Scratch scratch,
                       cudaStream_t s) {
  LaunchNormBackward<T, false>(
      {dx, dbranch, nullptr, dout, dresidual, x, w, mean, rstd, rows, cols, drop}, dw, db, scratch,
      s);
}

size_t LayerNormBackwardScratchBytes(int64_t rows, int64_t cols) {
  return NormBackwardScratch(rows, cols, 2);
}

template <typename T>
void AddRmsNormForward(T* x_out, T* out, float* rstd, const T* residual, const T* branch,
                       const float* w, int64_t rows, int64_t cols, float eps,
                       const HiddenDropout& drop, cudaStream_t s, const T* branch2,
                       const Fp8Out& fp8) {
  if (residual == nullptr && branch2 != nullptr)
    Die("AddRmsNormForward", "a second branch needs a residual", __FILE__, __LINE__);
  LaunchNormForward<T, true>({x_out, out, nullptr, rstd, residual, branch, w, nullptr, rows, cols,
                              eps, drop, branch2, fp8},
                             s);
}

template <typename T>
void RmsNormBackward(T* dx, T* dbranch, float* dw, const T* dout, const T* dresidual, const T* x,
                     const float* w, const float* rstd, int64_t rows, int64_t cols,
                     const HiddenDropout& drop, Scratch scratch, cudaStream_t s) {
  LaunchNormBackward<T, true>(
      {dx, dbranch, nullptr, dout, dresidual, x, w, nullptr, rstd, rows, cols, drop}, dw, nullptr,
      scratch, s);
}

size_t RmsNormBackwardScratchBytes(int64_t rows, int64_t cols) {
  return NormBackwardScratch(rows, cols, 1);
}

template <typename T>
void ColumnSumAccumulate(float* dbias, const T* dout, int64_t rows, int64_t cols, Scratch scratch,
                         cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  const int64_t groups = ColumnGroups(rows), chunk = CeilDiv(rows, groups);
  ScratchCarver carver(scratch);
  float* part = carver.Take<float>(static_cast<size_t>(groups) * cols, "column sum");
  constexpr int W = kVec<T>;
  const bool vec = cols % W == 0 && Aligned16(dout);
  const dim3 block(32, kColY);
  if (vec) {
    const dim3 grid(static_cast<unsigned>(CeilDiv(cols / W, 32)), static_cast<unsigned>(groups));
    ColumnPartialKernel<T, W><<<grid, block, 0, s>>>(part, dout, rows, cols, chunk);
  } else {
    const dim3 grid(static_cast<unsigned>(CeilDiv(cols, 32)), static_cast<unsigned>(groups));
    ColumnPartialKernel<T, 1><<<grid, block, 0, s>>>(part, dout, rows, cols, chunk);
  }
  LT_CUDA_LAUNCH_CHECK();
  ColumnReduce(dbias, nullptr, part, groups, cols, cols, s);
}

size_t ColumnSumScratchBytes(int64_t rows, int64_t cols) {
  return ScratchCarver::Size(static_cast<size_t>(ColumnGroups(rows)) * cols * sizeof(float));
}

#define LT_NORM_INSTANTIATE(T)                                                                     \
  template void AddLayerNormForward<T>(                                                            \
      T*, T*, float*, float*, const T*, const T*, const float*, const float*, int64_t, int64_t,    \
      float, const HiddenDropout&, cudaStream_t, const T*, const Fp8Out&);                         \
  template void LayerNormBackward<T>(T*, T*, float*, float*, const T*, const T*, const T*,         \
                                     const float*, const float*, const float*, int64_t, int64_t,   \
                                     const HiddenDropout&, Scratch, cudaStream_t);                 \
  template void AddRmsNormForward<T>(T*, T*, float*, const T*, const T*, const float*, int64_t,    \
                                     int64_t, float, const HiddenDropout&, cudaStream_t, const T*, \
                                     const Fp8Out&);                                               \
  template void RmsNormBackward<T>(T*, T*, float*, const T*, const T*, const T*, const float*,     \
                                   const float*, int64_t, int64_t, const HiddenDropout&, Scratch,  \
                                   cudaStream_t);                                                  \
  template void ColumnSumAccumulate<T>(float*, const T*, int64_t, int64_t, Scratch, cudaStream_t);
LT_NORM_INSTANTIATE(float)
LT_NORM_INSTANTIATE(bf16)
#undef LT_NORM_INSTANTIATE

}  // namespace leantron::trainer::cuda
