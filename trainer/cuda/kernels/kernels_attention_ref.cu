// Reference attention and rotary embedding for CudaOps: CpuOps's float32 semantics (materialised
// probabilities, the same attention-dropout mask), written for clarity, not speed. The backward
// has no atomics: one kernel owns each query row (dq, and the score gradients it keeps in
// scratch), a second owns each key/value row and sums over the queries and heads that saw it.
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
namespace {
using namespace detail;

constexpr int kAttnThreads = 128;

// Megatron-Core's grouped QKV row (per query group: its query heads, its key head, its value head).
struct Layout {
  int64_t per, d, row;
  __host__ __device__ Layout(int64_t heads, int64_t groups, int64_t head_dim)
      : per(heads / groups), d(head_dim), row((heads + 2 * groups) * head_dim) {}
  __device__ int64_t q(int64_t h) const { return (h / per) * (per + 2) * d + (h % per) * d; }
  __device__ int64_t k(int64_t h) const { return (h / per) * (per + 2) * d + per * d; }
  __device__ int64_t v(int64_t h) const { return k(h) + d; }
};

struct AttnDims {
  int64_t batch, seq, heads, groups, head_dim;
};

// CpuOps's DropMask times the keep scale: 0 or 1/(1−p) (1 without dropout).
__device__ __forceinline__ float AttnMask(const AttentionDropout& dr, int64_t b, int64_t h,
                                          int64_t i, int64_t j, int64_t seq) {
  if (dr.p <= 0.0f) return 1.0f;
  const int64_t index = ((dr.head_offset + h) * seq + i) * seq + j;
  const bool keep = UniformFromKey(SampleKey(dr.seed, dr.first_sample + b), index) >= dr.p;
  return keep ? 1.0f / (1.0f - dr.p) : 0.0f;
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

// Block per (b, h, i): probs row i, then out row i from the dropout-weighted probabilities
// (kept in `weights`, laid out as probs).
__global__ void __launch_bounds__(kAttnThreads)
    AttnForwardKernel(float* out, float* probs, float* weights, const float* qkv, AttnDims dims,
                      AttentionDropout dr) {
  const int64_t T = dims.seq, H = dims.heads, D = dims.head_dim;
  const Layout L(H, dims.groups, D);
  const int64_t i = blockIdx.x % T, h = (blockIdx.x / T) % H, b = blockIdx.x / (T * H);
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const float* q = qkv + (b * T + i) * L.row + L.q(h);
  float* p = probs + ((b * H + h) * T + i) * T;
  float* w = weights + ((b * H + h) * T + i) * T;

  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float s = Dot(q, qkv + (b * T + j) * L.row + L.k(h), D) * scale;
    p[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = BlockMax(mx);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  sum = BlockSum(sum);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
    const float pj = j <= i ? p[j] / sum : 0.0f;
    p[j] = pj;
    w[j] = j <= i ? pj * AttnMask(dr, b, h, i, j, T) : 0.0f;
  }
  __syncthreads();
  float* y = out + (b * T + i) * H * D + h * D;
  for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j <= i; ++j) acc += w[j] * qkv[(b * T + j) * L.row + L.v(h) + e];
    y[e] = acc;
  }
}

// Block per (b, h, i): ds_j = p_j·(dp_j − Σ p·dp)·scale with dp_j = dy·v_j·mask_j into `ds`, the
// dropout-weighted probabilities into `pm` (both [B, H, T, T]), and dq row i.
__global__ void __launch_bounds__(kAttnThreads)
    AttnBackwardQueryKernel(float* dqkv, float* ds, float* pm, const float* dout, const float* qkv,
                            const float* probs, AttnDims dims, AttentionDropout dr) {
  const int64_t T = dims.seq, H = dims.heads, D = dims.head_dim;
  const Layout L(H, dims.groups, D);
  const int64_t i = blockIdx.x % T, h = (blockIdx.x / T) % H, b = blockIdx.x / (T * H);
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const float* dy = dout + (b * T + i) * H * D + h * D;
  const int64_t prow = ((b * H + h) * T + i) * T;
  const float* p = probs + prow;

  float pdp = 0.0f;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float mask = AttnMask(dr, b, h, i, j, T);
    const float dp = Dot(dy, qkv + (b * T + j) * L.row + L.v(h), D) * mask;
    ds[prow + j] = dp;
    pm[prow + j] = p[j] * mask;
    pdp += p[j] * dp;
  }
  pdp = BlockSum(pdp);
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    ds[prow + j] = p[j] * (ds[prow + j] - pdp) * scale;
  }
  __syncthreads();
  float* dq = dqkv + (b * T + i) * L.row + L.q(h);
  for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j <= i; ++j) acc += ds[prow + j] * qkv[(b * T + j) * L.row + L.k(h) + e];
    dq[e] = acc;
  }
}

// Block per (b, g, j): dk_j = Σ_{h ∈ g, i ≥ j} ds[b,h,i,j]·q_i(h), dv_j = Σ pm[b,h,i,j]·dy_i(h).
__global__ void __launch_bounds__(kAttnThreads)
    AttnBackwardKeyValueKernel(float* dqkv, const float* ds, const float* pm, const float* dout,
                               const float* qkv, AttnDims dims) {
  const int64_t T = dims.seq, H = dims.heads, G = dims.groups, D = dims.head_dim;
  const Layout L(H, G, D);
  const int64_t j = blockIdx.x % T, g = (blockIdx.x / T) % G, b = blockIdx.x / (T * G);
  float* dk = dqkv + (b * T + j) * L.row + L.k(g * L.per);
  float* dv = dqkv + (b * T + j) * L.row + L.v(g * L.per);
  for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
    float ak = 0.0f, av = 0.0f;
    for (int64_t h = g * L.per; h < (g + 1) * L.per; ++h) {
      for (int64_t i = j; i < T; ++i) {
        const int64_t idx = ((b * H + h) * T + i) * T + j;
        ak += ds[idx] * qkv[(b * T + i) * L.row + L.q(h) + e];
        av += pm[idx] * dout[(b * T + i) * H * D + h * D + e];
      }
    }
    dk[e] = ak;
    dv[e] = av;
  }
}

// Thread per (b, t, slot, i): slots [0, heads) are query heads, [heads, heads + groups) key heads.
__global__ void RopeRotateKernel(float* qkv, const float* cs, const float* sn,
                                 const int32_t* positions, AttnDims dims) {
  const int64_t T = dims.seq, H = dims.heads, G = dims.groups, half = dims.head_dim / 2;
  const Layout L(H, G, dims.head_dim);
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t slots = H + G;
  if (idx >= dims.batch * T * slots * half) return;
  const int64_t i = idx % half, slot = (idx / half) % slots, bt = idx / (half * slots);
  const int64_t t = positions != nullptr ? positions[bt] : bt % T;
  float* x = qkv + bt * L.row + (slot < H ? L.q(slot) : L.k((slot - H) * L.per));
  const float a = x[i], bb = x[i + half], c = cs[t * half + i], s = sn[t * half + i];
  x[i] = a * c - bb * s;
  x[i + half] = bb * c + a * s;
}

size_t AttnRows(int64_t batch, int64_t seq, int64_t heads) {
  return static_cast<size_t>(batch) * heads * seq * seq;
}

}  // namespace

void AttentionForwardReference(float* out, float* probs, const float* qkv, int64_t batch,
                               int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
                               const AttentionDropout& dropout, Scratch scratch, cudaStream_t s) {
  if (batch == 0 || seq == 0 || heads == 0) return;
  ScratchCarver carver(scratch);
  float* weights = carver.Take<float>(AttnRows(batch, seq, heads), "attention forward");
  const AttnDims dims{batch, seq, heads, groups, head_dim};
  AttnForwardKernel<<<static_cast<unsigned>(batch * heads * seq), kAttnThreads, 0, s>>>(
      out, probs, weights, qkv, dims, dropout);
  LT_CUDA_LAUNCH_CHECK();
}

size_t AttentionForwardScratchBytes(int64_t batch, int64_t seq, int64_t heads) {
  return ScratchCarver::Size(AttnRows(batch, seq, heads) * sizeof(float));
}

void AttentionBackwardReference(float* dqkv, const float* dout, const float* qkv,
                                const float* probs, int64_t batch, int64_t seq, int64_t heads,
                                int64_t groups, int64_t head_dim, const AttentionDropout& dropout,
                                Scratch scratch, cudaStream_t s) {
  if (batch == 0 || seq == 0 || heads == 0) return;
  ScratchCarver carver(scratch);
  float* ds = carver.Take<float>(AttnRows(batch, seq, heads), "attention backward");
  float* pm = carver.Take<float>(AttnRows(batch, seq, heads), "attention backward");
  const AttnDims dims{batch, seq, heads, groups, head_dim};
  // The two kernels write every q, k and v slot of dqkv, so it needs no zeroing.
  AttnBackwardQueryKernel<<<static_cast<unsigned>(batch * heads * seq), kAttnThreads, 0, s>>>(
      dqkv, ds, pm, dout, qkv, probs, dims, dropout);
  LT_CUDA_LAUNCH_CHECK();
  AttnBackwardKeyValueKernel<<<static_cast<unsigned>(batch * groups * seq), kAttnThreads, 0, s>>>(
      dqkv, ds, pm, dout, qkv, dims);
  LT_CUDA_LAUNCH_CHECK();
}

size_t AttentionBackwardScratchBytes(int64_t batch, int64_t seq, int64_t heads) {
  return 2 * ScratchCarver::Size(AttnRows(batch, seq, heads) * sizeof(float));
}

void Rope(float* qkv, int64_t batch, int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
          const float* cos, const float* sin, const int32_t* positions, cudaStream_t s) {
  const int64_t half = head_dim / 2;
  if (batch == 0 || seq == 0 || half == 0) return;
  const int64_t n = batch * seq * (heads + groups) * half;
  RopeRotateKernel<<<static_cast<unsigned>(CeilDiv(n, 256)), 256, 0, s>>>(
      qkv, cos, sin, positions, AttnDims{batch, seq, heads, groups, head_dim});
  LT_CUDA_LAUNCH_CHECK();
}

}  // namespace leantron::trainer::cuda
