// RearrangeQkv (kernels.h): the grouped qkv layout to the attention layout and back, with the
// rotary embedding of queries and keys on the way.
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
using namespace detail;
namespace {

struct QkvDims {
  int64_t rows, seq, heads, groups, head_dim;
};

// Thread per (row, slot, i): slots [0, heads) are query heads, [heads, heads + groups) keys,
// [heads + groups, heads + 2·groups) values; i < head_dim/2 a rotate-half pair (i, i + half).
template <typename T>
__global__ void RearrangeQkvKernel(T* out, const T* in, QkvDims d, const float* cos,
                                   const float* sin, bool to_attention) {
  const int64_t half = d.head_dim / 2, H = d.heads, G = d.groups, D = d.head_dim;
  const int64_t slots = H + 2 * G, per = H / G, row_width = slots * D;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= d.rows * slots * half) return;
  const int64_t i = idx % half, slot = (idx / half) % slots, r = idx / (half * slots);
  int64_t grouped, attention;  // offsets of this slot's head in either layout
  bool rotate = cos != nullptr;
  if (slot < H) {
    grouped = (slot / per) * (per + 2) * D + (slot % per) * D;
    attention = slot * D;
  } else if (slot < H + G) {
    const int64_t g = slot - H;
    grouped = g * (per + 2) * D + per * D;
    attention = H * D + 2 * g * D;
  } else {
    const int64_t g = slot - H - G;
    grouped = g * (per + 2) * D + (per + 1) * D;
    attention = H * D + 2 * g * D + D;
    rotate = false;
  }
  const T* src = in + r * row_width + (to_attention ? grouped : attention);
  T* dst = out + r * row_width + (to_attention ? attention : grouped);
  if (!rotate) {
    dst[i] = src[i];
    dst[i + half] = src[i + half];
    return;
  }
  const int64_t t = r % d.seq;
  const float a = ToFloat(src[i]), b = ToFloat(src[i + half]);
  const float c = cos[t * half + i], s = to_attention ? sin[t * half + i] : -sin[t * half + i];
  dst[i] = FromFloat<T>(a * c - b * s);
  dst[i + half] = FromFloat<T>(b * c + a * s);
}

}  // namespace

template <typename T>
void RearrangeQkv(T* out, const T* in, int64_t rows, int64_t seq, int64_t heads, int64_t groups,
                  int64_t head_dim, const float* cos, const float* sin, bool to_attention,
                  cudaStream_t s) {
  const int64_t n = rows * (heads + 2 * groups) * (head_dim / 2);
  if (n == 0) return;
  RearrangeQkvKernel<T><<<static_cast<unsigned>(CeilDiv(n, int64_t{256})), 256, 0, s>>>(
      out, in, QkvDims{rows, seq, heads, groups, head_dim}, cos, sin, to_attention);
  LT_CUDA_LAUNCH_CHECK();
}

template void RearrangeQkv<float>(float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                  int64_t, const float*, const float*, bool, cudaStream_t);
template void RearrangeQkv<bf16>(bf16*, const bf16*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                 const float*, const float*, bool, cudaStream_t);

}  // namespace leantron::trainer::cuda
