// Block attention for CudaOps: CpuOps::BlockAttentionForward/Backward's semantics (queries and
// keys at given positions of their sample, documents, the log-sum-exp merge, dropout by position),
// written for clarity, not speed, like kernels_attention_ref.cu. The forward keeps each row's
// scores in scratch; the backward has no atomics: one kernel owns each query row (dq, and the
// score gradients it leaves in scratch), a second each key row (dk, dv summed over the queries
// and heads that saw it).
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 128;

struct Grouped {
  int64_t per, d, row, kv_row;
  __host__ __device__ Grouped(int64_t heads, int64_t groups, int64_t head_dim)
      : per(heads / groups),
        d(head_dim),
        row((heads + 2 * groups) * head_dim),
        kv_row(groups * 2 * head_dim) {}
  __device__ int64_t q(int64_t h) const { return (h / per) * (per + 2) * d + (h % per) * d; }
  __device__ int64_t k(int64_t h) const { return (h / per) * 2 * d; }  // in a kv row
};

__device__ __forceinline__ bool Sees(const BlockAttentionArgs& a, int64_t b, int64_t qpos,
                                     int64_t kpos) {
  if (kpos > qpos) return false;
  if (a.documents == nullptr) return true;
  const int32_t* doc = a.documents + b * a.seq_length;
  return doc[kpos] == doc[qpos];
}

// 0 or 1/(1 − p), CpuOps's mask of (head, query position, key position).
__device__ __forceinline__ float Mask(const AttentionDropout& dr, const BlockAttentionArgs& a,
                                      int64_t b, int64_t h, int64_t qpos, int64_t kpos) {
  if (dr.p <= 0.0f) return 1.0f;
  const int64_t t = a.seq_length;
  const int64_t index = ((dr.head_offset + h) * t + qpos) * t + kpos;
  const bool keep = UniformFromKey(SampleKey(dr.seed, dr.first_sample + b), index) >= dr.p;
  return keep ? 1.0f / (1.0f - dr.p) : 0.0f;
}

__device__ __forceinline__ float Dot(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
  for (int64_t k = 0; k < n; ++k) s += x[k] * y[k];
  return s;
}

// Block per (b, h, i): the row's weights (softmax over the visible keys times the dropout mask)
// in `w`, then the output row, merged with what (out, lse) hold when asked.
__global__ void __launch_bounds__(kThreads)
    BlockForwardKernel(float* out, float* lse, float* w, const float* qkv, const float* kv,
                       BlockAttentionArgs a, AttentionDropout dr, bool merge) {
  const int64_t Tq = a.queries, Tk = a.keys, H = a.heads, D = a.head_dim;
  const Grouped L(H, a.groups, D);
  const int64_t i = blockIdx.x % Tq, h = (blockIdx.x / Tq) % H, b = blockIdx.x / (Tq * H);
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const int64_t qpos = a.query_pos[i];
  const float* q = qkv + (b * Tq + i) * L.row + L.q(h);
  float* row = w + ((b * H + h) * Tq + i) * Tk;
  float* y = out + (b * Tq + i) * H * D + h * D;
  float* l = lse + (b * H + h) * Tq + i;

  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    float s = -INFINITY;
    if (Sees(a, b, qpos, a.key_pos[j]))
      s = Dot(q, kv + (b * Tk + j) * L.kv_row + L.k(h), D) * scale;
    row[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = BlockMax(mx);
  if (mx == -INFINITY) {  // no visible key in this block (the same for every thread)
    if (!merge) {
      for (int64_t e = threadIdx.x; e < D; e += blockDim.x) y[e] = 0.0f;
      if (threadIdx.x == 0) *l = -INFINITY;
    }
    return;
  }
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    const float e = row[j] == -INFINITY ? 0.0f : expf(row[j] - mx);
    row[j] = e;
    sum += e;
  }
  sum = BlockSum(sum);
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    if (row[j] != 0.0f) row[j] = row[j] / sum * Mask(dr, a, b, h, qpos, a.key_pos[j]);
  }
  const float block_lse = mx + logf(sum);
  const float old = *l;
  __syncthreads();  // every thread has read the old log-sum-exp and written its weights
  float wa = 0.0f, wb = 1.0f, total = block_lse;
  if (merge && old != -INFINITY) {
    const float top = fmaxf(old, block_lse);
    total = top + logf(expf(old - top) + expf(block_lse - top));
    wa = expf(old - total);
    wb = expf(block_lse - total);
  }
  for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < Tk; ++j) {
      if (row[j] != 0.0f) acc += row[j] * kv[(b * Tk + j) * L.kv_row + L.k(h) + D + e];
    }
    y[e] = (wa != 0.0f ? wa * y[e] : 0.0f) + wb * acc;
  }
  if (threadIdx.x == 0) *l = total;
}

// Block per (b, h, i): ds = p·(dp − Σ_whole p·dp)·scale with p = exp(score − lse) and
// dp = dy·v·mask into `ds`, p·mask into `pm` (both [B, H, Tq, Tk], zero where unseen); dq += .
__global__ void __launch_bounds__(kThreads)
    BlockBackwardQueryKernel(float* dqkv, float* ds, float* pm, const float* dout, const float* out,
                             const float* lse, const float* qkv, const float* kv,
                             BlockAttentionArgs a, AttentionDropout dr) {
  const int64_t Tq = a.queries, Tk = a.keys, H = a.heads, D = a.head_dim;
  const Grouped L(H, a.groups, D);
  const int64_t i = blockIdx.x % Tq, h = (blockIdx.x / Tq) % H, b = blockIdx.x / (Tq * H);
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const int64_t qpos = a.query_pos[i];
  const float* q = qkv + (b * Tq + i) * L.row + L.q(h);
  const float* dy = dout + (b * Tq + i) * H * D + h * D;
  const float* y = out + (b * Tq + i) * H * D + h * D;
  const float l = lse[(b * H + h) * Tq + i];
  const int64_t at = ((b * H + h) * Tq + i) * Tk;

  float delta = 0.0f;
  for (int64_t e = threadIdx.x; e < D; e += blockDim.x) delta += dy[e] * y[e];
  delta = BlockSum(delta);
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) {
    const int64_t kpos = a.key_pos[j];
    float g = 0.0f, pmask = 0.0f;
    if (Sees(a, b, qpos, kpos)) {
      const float* k = kv + (b * Tk + j) * L.kv_row + L.k(h);
      const float p = expf(Dot(q, k, D) * scale - l);
      const float mask = Mask(dr, a, b, h, qpos, kpos);
      const float dp = Dot(dy, k + D, D) * mask;
      g = p * (dp - delta) * scale;
      pmask = p * mask;
    }
    ds[at + j] = g;
    pm[at + j] = pmask;
  }
  __syncthreads();
  float* dq = dqkv + (b * Tq + i) * L.row + L.q(h);
  for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < Tk; ++j) acc += ds[at + j] * kv[(b * Tk + j) * L.kv_row + L.k(h) + e];
    dq[e] += acc;
  }
}

// Block per (b, g, j): dk_j += Σ_{h ∈ g, i} ds·q_i(h), dv_j += Σ pm·dy_i(h).
__global__ void __launch_bounds__(kThreads)
    BlockBackwardKeyValueKernel(float* dkv, const float* ds, const float* pm, const float* dout,
                                const float* qkv, BlockAttentionArgs a) {
  const int64_t Tq = a.queries, Tk = a.keys, H = a.heads, G = a.groups, D = a.head_dim;
  const Grouped L(H, G, D);
  const int64_t j = blockIdx.x % Tk, g = (blockIdx.x / Tk) % G, b = blockIdx.x / (Tk * G);
  float* dk = dkv + (b * Tk + j) * L.kv_row + g * 2 * D;
  float* dv = dk + D;
  for (int64_t e = threadIdx.x; e < D; e += blockDim.x) {
    float ak = 0.0f, av = 0.0f;
    for (int64_t h = g * L.per; h < (g + 1) * L.per; ++h) {
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t idx = ((b * H + h) * Tq + i) * Tk + j;
        ak += ds[idx] * qkv[(b * Tq + i) * L.row + L.q(h) + e];
        av += pm[idx] * dout[(b * Tq + i) * H * D + h * D + e];
      }
    }
    dk[e] += ak;
    dv[e] += av;
  }
}

size_t Pairs(const BlockAttentionArgs& a) {
  return static_cast<size_t>(a.batch) * a.heads * a.queries * a.keys;
}

}  // namespace

void BlockAttentionForwardReference(float* out, float* lse, const float* qkv, const float* kv,
                                    const BlockAttentionArgs& args, const AttentionDropout& dropout,
                                    bool merge, Scratch scratch, cudaStream_t s) {
  if (args.batch == 0 || args.queries == 0 || args.heads == 0) return;
  ScratchCarver carver(scratch);
  float* w = carver.Take<float>(std::max<size_t>(1, Pairs(args)), "block attention forward");
  BlockForwardKernel<<<static_cast<unsigned>(args.batch * args.heads * args.queries), kThreads, 0,
                       s>>>(out, lse, w, qkv, kv, args, dropout, merge);
  LT_CUDA_LAUNCH_CHECK();
}

size_t BlockAttentionForwardScratchBytes(const BlockAttentionArgs& args) {
  return ScratchCarver::Size(std::max<size_t>(1, Pairs(args)) * sizeof(float));
}

void BlockAttentionBackwardReference(float* dqkv, float* dkv, const float* dout, const float* out,
                                     const float* lse, const float* qkv, const float* kv,
                                     const BlockAttentionArgs& args,
                                     const AttentionDropout& dropout, Scratch scratch,
                                     cudaStream_t s) {
  if (args.batch == 0 || args.queries == 0 || args.keys == 0 || args.heads == 0) return;
  ScratchCarver carver(scratch);
  float* ds = carver.Take<float>(Pairs(args), "block attention backward");
  float* pm = carver.Take<float>(Pairs(args), "block attention backward");
  BlockBackwardQueryKernel<<<static_cast<unsigned>(args.batch * args.heads * args.queries),
                             kThreads, 0, s>>>(dqkv, ds, pm, dout, out, lse, qkv, kv, args,
                                               dropout);
  LT_CUDA_LAUNCH_CHECK();
  BlockBackwardKeyValueKernel<<<static_cast<unsigned>(args.batch * args.groups * args.keys),
                                kThreads, 0, s>>>(dkv, ds, pm, dout, qkv, args);
  LT_CUDA_LAUNCH_CHECK();
}

size_t BlockAttentionBackwardScratchBytes(const BlockAttentionArgs& args) {
  return 2 * ScratchCarver::Size(std::max<size_t>(1, Pairs(args)) * sizeof(float));
}

}  // namespace leantron::trainer::cuda
