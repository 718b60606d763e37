// Vocabulary-parallel softmax cross-entropy of the bf16 model under tensor parallelism: each rank
// holds the logits of its vocabulary shard; per-row partials (max, Σexp, target logit) are combined
// across ranks by two small all-reduces between these kernels, then the loss and the gradient
// (written over the logits) come from the global statistics.
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 512;

// part[3r] = max, part[3r+1] = Σ exp(x − max), part[3r+2] = the target's logit if owned, else 0.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    ShardPartialsKernel(float* part, const T* logits, const int32_t* targets, int64_t vocab,
                        int64_t vocab_begin) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * vocab;
  const float m = BlockRowMax<W>(row, vocab);
  const float s = BlockRowSumExp<W>(row, vocab, m);
  if (threadIdx.x == 0) {
    const int64_t t = static_cast<int64_t>(targets[r]) - vocab_begin;
    part[3 * r] = m;
    part[3 * r + 1] = s;
    part[3 * r + 2] = targets[r] >= 0 && t >= 0 && t < vocab ? ToFloat(row[t]) : 0.0f;
  }
}

// global_max[r] starts as this shard's max (all-reduced by the caller); sums[2r] = Σexp rescaled
// to it, sums[2r+1] = target logit (both all-reduced by the caller next).
__global__ void ShardRescaleKernel(float* global_max, float* sums, const float* part, int64_t rows,
                                   bool fill_max) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  if (fill_max) {
    global_max[r] = part[3 * r];
    return;
  }
  const float m = part[3 * r], g = global_max[r];
  sums[2 * r] = m == -INFINITY ? 0.0f : part[3 * r + 1] * expf(m - g);
  sums[2 * r + 1] = part[3 * r + 2];
}

template <typename T, int W>
__global__ void __launch_bounds__(kThreads)
    ShardFinishKernel(float* losses, T* logits, const int32_t* targets, const float* global_max,
                      const float* sums, int64_t vocab, int64_t vocab_begin, float grad_scale) {
  const int64_t r = blockIdx.x;
  const float lse = global_max[r] + logf(sums[2 * r]);
  const int64_t target = targets[r];
  if (threadIdx.x == 0 && losses != nullptr) losses[r] = target < 0 ? 0.0f : lse - sums[2 * r + 1];
  if (grad_scale == 0.0f) return;
  T* row = logits + r * vocab;
  const int64_t t = target - vocab_begin;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < vocab;
       c += static_cast<int64_t>(blockDim.x) * W) {
    float x[W];
    Load<W>(x, row + c);
#pragma unroll
    for (int j = 0; j < W; ++j)
      x[j] = target < 0 ? 0.0f : (expf(x[j] - lse) - (c + j == t ? 1.0f : 0.0f)) * grad_scale;
    Store<W>(row + c, x);
  }
}

}  // namespace

template <typename T>
void CrossEntropyShardPartials(float* part, const T* logits, const int32_t* targets, int64_t rows,
                               int64_t vocab_local, int64_t vocab_begin, cudaStream_t s) {
  if (rows == 0) return;
  constexpr int W = kVec<T>;
  const unsigned grid = static_cast<unsigned>(rows);
  if (vocab_local % W == 0 && Aligned16(logits)) {
    ShardPartialsKernel<T, W>
        <<<grid, kThreads, 0, s>>>(part, logits, targets, vocab_local, vocab_begin);
  } else {
    ShardPartialsKernel<T, 1>
        <<<grid, kThreads, 0, s>>>(part, logits, targets, vocab_local, vocab_begin);
  }
  LT_CUDA_LAUNCH_CHECK();
}

void CrossEntropyShardMax(float* global_max, const float* part, int64_t rows, cudaStream_t s) {
  if (rows == 0) return;
  ShardRescaleKernel<<<static_cast<unsigned>(CeilDiv(rows, 256)), 256, 0, s>>>(global_max, nullptr,
                                                                               part, rows, true);
  LT_CUDA_LAUNCH_CHECK();
}

void CrossEntropyShardRescale(float* sums, const float* part, const float* global_max, int64_t rows,
                              cudaStream_t s) {
  if (rows == 0) return;
  ShardRescaleKernel<<<static_cast<unsigned>(CeilDiv(rows, 256)), 256, 0, s>>>(
      const_cast<float*>(global_max), sums, part, rows, false);
  LT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void CrossEntropyShardFinish(float* losses, T* logits, const int32_t* targets,
                             const float* global_max, const float* sums, int64_t rows,
                             int64_t vocab_local, int64_t vocab_begin, float grad_scale,
                             cudaStream_t s) {
  if (rows == 0) return;
  constexpr int W = kVec<T>;
  const unsigned grid = static_cast<unsigned>(rows);
  if (vocab_local % W == 0 && Aligned16(logits)) {
    ShardFinishKernel<T, W><<<grid, kThreads, 0, s>>>(losses, logits, targets, global_max, sums,
                                                      vocab_local, vocab_begin, grad_scale);
  } else {
    ShardFinishKernel<T, 1><<<grid, kThreads, 0, s>>>(losses, logits, targets, global_max, sums,
                                                      vocab_local, vocab_begin, grad_scale);
  }
  LT_CUDA_LAUNCH_CHECK();
}

#define LT_INSTANTIATE(T)                                                                          \
  template void CrossEntropyShardPartials<T>(float*, const T*, const int32_t*, int64_t, int64_t,   \
                                             int64_t, cudaStream_t);                               \
  template void CrossEntropyShardFinish<T>(float*, T*, const int32_t*, const float*, const float*, \
                                           int64_t, int64_t, int64_t, float, cudaStream_t);
LT_INSTANTIATE(float)
LT_INSTANTIATE(bf16)
#undef LT_INSTANTIATE

}  // namespace leantron::trainer::cuda
