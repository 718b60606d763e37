// Softmax cross-entropy: the fused full-vocabulary forward+backward of the bf16 model (one block
// per row: an online max/sum pass, then the gradient written over the logits), and the pieces of
// CudaOps's vocabulary-sharded CrossEntropyForward/Backward.
#include <cub/block/block_reduce.cuh>

#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
namespace {
using namespace detail;

constexpr int kCeThreads = 512;

// Running (max, Σ exp(x − max)) of a softmax denominator.
struct MaxSum {
  float m = -INFINITY;
  float s = 0.0f;
};
__device__ __forceinline__ float RescaleTo(float m_from, float m_to) {
  return m_from == -INFINITY ? 0.0f : expf(m_from - m_to);
}
// Commutative bitwise (a·b == b·a), so every lane of a butterfly gets the same result.
__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  MaxSum r;
  r.m = fmaxf(a.m, b.m);
  r.s = a.s * RescaleTo(a.m, r.m) + b.s * RescaleTo(b.m, r.m);
  return r;
}

__device__ __forceinline__ MaxSum BlockCombine(MaxSum v) {
  __shared__ float sh_m[32], sh_s[32];
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other;
    other.m = __shfl_xor_sync(0xffffffffu, v.m, o);
    other.s = __shfl_xor_sync(0xffffffffu, v.s, o);
    v = Combine(v, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) {
    sh_m[warp] = v.m;
    sh_s[warp] = v.s;
  }
  __syncthreads();
  MaxSum r{sh_m[0], sh_s[0]};
  for (int w = 1; w < warps; ++w) r = Combine(r, MaxSum{sh_m[w], sh_s[w]});
  return r;
}

template <typename T, int W>
__global__ void __launch_bounds__(kCeThreads)
    CrossEntropyFusedKernel(float* losses, T* logits, const int32_t* targets, int64_t vocab,
                            float grad_scale) {
  const int64_t r = blockIdx.x;
  T* row = logits + r * vocab;
  const int64_t t = targets[r];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * W;
  // The target's logit, read before any thread overwrites the row.
  float target_logit = 0.0f;
  if (threadIdx.x == 0 && t >= 0 && t < vocab) target_logit = ToFloat(row[t]);

  MaxSum acc;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < vocab; c += stride) {
    float x[W];
    Load<W>(x, row + c);
    float vm = x[0];
#pragma unroll
    for (int j = 1; j < W; ++j) vm = fmaxf(vm, x[j]);
    if (vm > acc.m) {
      acc.s *= RescaleTo(acc.m, vm);
      acc.m = vm;
    }
    if (acc.m != -INFINITY) {
#pragma unroll
      for (int j = 0; j < W; ++j) acc.s += expf(x[j] - acc.m);
    }
  }
  const MaxSum total = BlockCombine(acc);  // its barriers order the read above before the writes
  const float lse = total.m + logf(total.s);
  if (threadIdx.x == 0 && losses != nullptr) losses[r] = t < 0 ? 0.0f : lse - target_logit;
  if (grad_scale == 0.0f) return;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < vocab; c += stride) {
    float x[W];
    Load<W>(x, row + c);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      x[j] = t < 0 ? 0.0f : (expf(x[j] - lse) - (c + j == t ? 1.0f : 0.0f)) * grad_scale;
    }
    Store<W>(row + c, x);
  }
}

// ---- the float32 shard pieces of CudaOps ----

template <int W>
__global__ void __launch_bounds__(kCeThreads)
    RowMaxKernel(float* row_max, const float* logits, int64_t vocab) {
  const float m = BlockRowMax<W>(logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <int W>
__global__ void __launch_bounds__(kCeThreads)
    RowSumsKernel(float* sums, const float* logits, const float* row_max, const int32_t* targets,
                  int64_t vocab, int64_t vocab_begin) {
  const int64_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  const float s = BlockRowSumExp<W>(row, vocab, row_max[r]);
  if (threadIdx.x == 0) {
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    sums[2 * r] = s;
    sums[2 * r + 1] = targets[r] >= 0 && t >= 0 && t < vocab ? row[t] : 0.0f;
  }
}

__global__ void CrossEntropyFinishKernel(float* losses, float* stats, const float* row_max,
                                         const float* sums, const int32_t* targets, int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float lse = row_max[r] + logf(sums[2 * r]);
  stats[2 * r] = row_max[r];
  stats[2 * r + 1] = lse;
  losses[r] = targets[r] < 0 ? 0.0f : lse - sums[2 * r + 1];
}

struct CrossEntropyBackwardOp {
  float* dlogits;
  const float* dlosses;
  const float* stats;
  const float* logits;
  const int32_t* targets;
  int64_t vocab, vocab_begin;
  template <int W>
  __device__ void Apply(size_t i) const {
    const int64_t r = static_cast<int64_t>(i) / vocab, c = static_cast<int64_t>(i) - r * vocab;
    float x[W];
    if (targets[r] < 0) {
#pragma unroll
      for (int j = 0; j < W; ++j) x[j] = 0.0f;
    } else {
      const float lse = stats[2 * r + 1], g = dlosses[r];
      const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
      Load<W>(x, logits + i);
#pragma unroll
      for (int j = 0; j < W; ++j) x[j] = expf(x[j] - lse) * g - (c + j == t ? g : 0.0f);
    }
    Store<W>(dlogits + i, x);
  }
};

constexpr int kMeanLossThreads = 1024;

// One block: a fixed reduction order, so the same losses give the same bits.
__global__ void AccumulateMeanLossKernel(double* acc, const float* losses, const int32_t* targets,
                                         int64_t rows) {
  double sum = 0.0;
  long long count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (targets[r] < 0) continue;
    sum += static_cast<double>(losses[r]);
    ++count;
  }
  using SumReduce = cub::BlockReduce<double, kMeanLossThreads>;
  using CountReduce = cub::BlockReduce<long long, kMeanLossThreads>;
  __shared__ typename SumReduce::TempStorage sum_temp;
  __shared__ typename CountReduce::TempStorage count_temp;
  sum = SumReduce(sum_temp).Sum(sum);
  count = CountReduce(count_temp).Sum(count);
  if (threadIdx.x == 0 && count > 0) *acc += sum / static_cast<double>(count);
}

}  // namespace

void AccumulateMeanLoss(double* acc, const float* losses, const int32_t* targets, int64_t rows,
                        cudaStream_t s) {
  AccumulateMeanLossKernel<<<1, kMeanLossThreads, 0, s>>>(acc, losses, targets, rows);
  LT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void CrossEntropyForwardBackward(float* losses, T* logits, const int32_t* targets, int64_t rows,
                                 int64_t vocab, float grad_scale, cudaStream_t s) {
  if (rows == 0) return;
  constexpr int W = kVec<T>;
  const unsigned grid = static_cast<unsigned>(rows);
  if (vocab % W == 0 && Aligned16(logits)) {
    CrossEntropyFusedKernel<T, W>
        <<<grid, kCeThreads, 0, s>>>(losses, logits, targets, vocab, grad_scale);
  } else {
    CrossEntropyFusedKernel<T, 1>
        <<<grid, kCeThreads, 0, s>>>(losses, logits, targets, vocab, grad_scale);
  }
  LT_CUDA_LAUNCH_CHECK();
}

void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows, int64_t vocab_local,
                        cudaStream_t s) {
  if (rows == 0) return;
  const unsigned grid = static_cast<unsigned>(rows);
  if (vocab_local % 4 == 0 && Aligned16(logits)) {
    RowMaxKernel<4><<<grid, kCeThreads, 0, s>>>(row_max, logits, vocab_local);
  } else {
    RowMaxKernel<1><<<grid, kCeThreads, 0, s>>>(row_max, logits, vocab_local);
  }
  LT_CUDA_LAUNCH_CHECK();
}

void CrossEntropyRowSums(float* sums, const float* logits, const float* row_max,
                         const int32_t* targets, int64_t rows, int64_t vocab_local,
                         int64_t vocab_begin, cudaStream_t s) {
  if (rows == 0) return;
  const unsigned grid = static_cast<unsigned>(rows);
  if (vocab_local % 4 == 0 && Aligned16(logits)) {
    RowSumsKernel<4>
        <<<grid, kCeThreads, 0, s>>>(sums, logits, row_max, targets, vocab_local, vocab_begin);
  } else {
    RowSumsKernel<1>
        <<<grid, kCeThreads, 0, s>>>(sums, logits, row_max, targets, vocab_local, vocab_begin);
  }
  LT_CUDA_LAUNCH_CHECK();
}

void CrossEntropyFinish(float* losses, float* stats, const float* row_max, const float* sums,
                        const int32_t* targets, int64_t rows, cudaStream_t s) {
  if (rows == 0) return;
  CrossEntropyFinishKernel<<<static_cast<unsigned>(CeilDiv(rows, 256)), 256, 0, s>>>(
      losses, stats, row_max, sums, targets, rows);
  LT_CUDA_LAUNCH_CHECK();
}

void CrossEntropyBackward(float* dlogits, const float* dlosses, const float* stats,
                          const float* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab_local, int64_t vocab_begin, cudaStream_t s) {
  const bool vec = vocab_local % 4 == 0 && Aligned16(dlogits) && Aligned16(logits);
  LaunchMap<4>(
      CrossEntropyBackwardOp{dlogits, dlosses, stats, logits, targets, vocab_local, vocab_begin},
      static_cast<size_t>(rows * vocab_local), vec, s);
}

template void CrossEntropyForwardBackward<float>(float*, float*, const int32_t*, int64_t, int64_t,
                                                 float, cudaStream_t);
template void CrossEntropyForwardBackward<bf16>(float*, bf16*, const int32_t*, int64_t, int64_t,
                                                float, cudaStream_t);

}  // namespace leantron::trainer::cuda
