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

// Block per row; a thread per (slot, W consecutive rotate-half pairs): slots [0, heads) are
// query heads, [heads, heads + groups) keys, [heads + groups, heads + 2·groups) values. A thread
// moves W elements of each half of its head with vector loads (W divides head_dim/2, so every
// offset is a multiple of W elements).
template <int W, typename T>
__global__ void RearrangeQkvKernel(T* out, const T* in, QkvDims d, const float* cos,
                                   const float* sin, bool to_attention) {
  const int half = static_cast<int>(d.head_dim / 2), H = static_cast<int>(d.heads),
            G = static_cast<int>(d.groups), D = static_cast<int>(d.head_dim);
  const int slots = H + 2 * G, per = H / G, chunks = half / W;
  const int64_t r = blockIdx.x;
  const int64_t row = r * slots * D;
  const int t = static_cast<int>(r % d.seq);
  for (int j = threadIdx.x; j < slots * chunks; j += blockDim.x) {
    const int slot = j / chunks, i = (j - slot * chunks) * W;
    int grouped, attention;  // offsets of this slot's head in either layout
    bool rotate = cos != nullptr;
    if (slot < H) {
      grouped = (slot / per) * (per + 2) * D + (slot % per) * D;
      attention = slot * D;
    } else if (slot < H + G) {
      const int g = slot - H;
      grouped = g * (per + 2) * D + per * D;
      attention = H * D + 2 * g * D;
    } else {
      const int g = slot - H - G;
      grouped = g * (per + 2) * D + (per + 1) * D;
      attention = H * D + 2 * g * D + D;
      rotate = false;
    }
    const T* src = in + row + (to_attention ? grouped : attention) + i;
    T* dst = out + row + (to_attention ? attention : grouped) + i;
    float a[W], b[W];
    Load<W>(a, src);
    Load<W>(b, src + half);
    if (rotate) {
      float c[W], sn[W];
      Load<W>(c, cos + static_cast<int64_t>(t) * half + i);
      Load<W>(sn, sin + static_cast<int64_t>(t) * half + i);
      const float sign = to_attention ? 1.0f : -1.0f;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float s = sign * sn[k], x = a[k], y = b[k];
        a[k] = x * c[k] - y * s;
        b[k] = y * c[k] + x * s;
      }
    }
    Store<W>(dst, a);
    Store<W>(dst + half, b);
  }
}

}  // namespace

template <typename T>
void RearrangeQkv(T* out, const T* in, int64_t rows, int64_t seq, int64_t heads, int64_t groups,
                  int64_t head_dim, const float* cos, const float* sin, bool to_attention,
                  cudaStream_t s) {
  if (rows == 0) return;
  const QkvDims d{rows, seq, heads, groups, head_dim};
  const int64_t half = head_dim / 2;
  const bool aligned = Aligned16(out) && Aligned16(in) && (cos == nullptr || Aligned16(cos)) &&
                       (sin == nullptr || Aligned16(sin));
  const unsigned grid = static_cast<unsigned>(rows);
  if (aligned && half % 8 == 0) {
    RearrangeQkvKernel<8, T><<<grid, 128, 0, s>>>(out, in, d, cos, sin, to_attention);
  } else if (aligned && half % 4 == 0) {
    RearrangeQkvKernel<4, T><<<grid, 128, 0, s>>>(out, in, d, cos, sin, to_attention);
  } else {
    RearrangeQkvKernel<1, T><<<grid, 128, 0, s>>>(out, in, d, cos, sin, to_attention);
  }
  LT_CUDA_LAUNCH_CHECK();
}

template void RearrangeQkv<float>(float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                  const float*, const float*, bool, cudaStream_t);
template void RearrangeQkv<bf16>(bf16*, const bf16*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                 const float*, const float*, bool, cudaStream_t);

}  // namespace leantron::trainer::cuda
