// Token and position embeddings. The backward is deterministic: a stable radix sort (CUB) groups
// the rows by table row, then one block per distinct table row and column tile sums that row's
// gradients in row order and adds the total to the table gradient.
#include <cub/device/device_radix_sort.cuh>

#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
namespace {
using namespace detail;

template <typename T>
struct EmbeddingForwardOp {
  T* out;
  const int32_t* ids;
  const float* table;
  int64_t cols, vocab_begin, vocab_end;
  template <int W>
  __device__ void Apply(size_t i) const {
    const int64_t r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) - r * cols;
    const int64_t id = ids[r];
    float v[W];
    if (id >= vocab_begin && id < vocab_end) {
      Load<W>(v, table + (id - vocab_begin) * cols + c);
    } else {
#pragma unroll
      for (int j = 0; j < W; ++j) v[j] = 0.0f;
    }
    Store<W>(out + i, v);
  }
};

template <typename T>
struct PositionForwardOp {
  T* out;
  const int32_t* positions;
  const float* table;
  int64_t cols;
  template <int W>
  __device__ void Apply(size_t i) const {
    const int64_t r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) - r * cols;
    float x[W], t[W];
    Load<W>(x, out + i);
    Load<W>(t, table + static_cast<int64_t>(positions[r]) * cols + c);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] += t[j];
    Store<W>(out + i, x);
  }
};

// keys[r] = the table row of ids[r] relative to begin, or `sentinel` when outside [begin, end).
__global__ void MakeKeysKernel(uint32_t* keys, int32_t* rows_idx, const int32_t* ids, int64_t rows,
                               int64_t begin, int64_t end, uint32_t sentinel) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t id = ids[r];
  keys[r] = id >= begin && id < end ? static_cast<uint32_t>(id - begin) : sentinel;
  rows_idx[r] = static_cast<int32_t>(r);
}

// Block (p, tile): when sorted position p starts a run of equal keys, sums the run's rows (in
// row order, the sort being stable) over the tile's columns and adds the sum to the table row.
template <typename T, int W>
__global__ void AccumulateRunsKernel(float* dtable, const T* dout, const uint32_t* keys,
                                     const int32_t* rows_idx, int64_t rows, int64_t cols,
                                     uint32_t sentinel) {
  const int64_t p = blockIdx.x;
  const uint32_t key = keys[p];
  if (key == sentinel || (p > 0 && keys[p - 1] == key)) return;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * W;
  if (c >= cols) return;
  int64_t end = p + 1;
  while (end < rows && keys[end] == key) ++end;
  float acc[W];
#pragma unroll
  for (int j = 0; j < W; ++j) acc[j] = 0.0f;
#pragma unroll 4
  for (int64_t q = p; q < end; ++q) {
    float v[W];
    Load<W>(v, dout + static_cast<int64_t>(rows_idx[q]) * cols + c);
#pragma unroll
    for (int j = 0; j < W; ++j) acc[j] += v[j];
  }
  float* dst = dtable + static_cast<int64_t>(key) * cols + c;
  float t[W];
  Load<W>(t, dst);
#pragma unroll
  for (int j = 0; j < W; ++j) t[j] += acc[j];
  Store<W>(dst, t);
}

int BitsFor(uint32_t max_key) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= max_key) ++bits;
  return bits;
}

size_t SortTempBytes(int64_t rows, int end_bit) {
  size_t bytes = 0;
  LT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), rows, 0, end_bit));
  return bytes;
}

// dtable[id − begin] += dout[r] for ids in [begin, end).
template <typename T>
void SortedScatterAdd(float* dtable, const T* dout, const int32_t* ids, int64_t rows, int64_t cols,
                      int64_t begin, int64_t end, Scratch scratch, cudaStream_t s) {
  if (rows == 0 || cols == 0 || end <= begin) return;
  if (rows > INT32_MAX || end - begin >= INT64_C(0xffffffff)) {
    Die("EmbeddingBackward", "more rows or table rows than 32-bit keys hold", __FILE__, __LINE__);
  }
  const uint32_t sentinel = static_cast<uint32_t>(end - begin);
  const int bits = BitsFor(sentinel);
  ScratchCarver carver(scratch);
  uint32_t* keys_in = carver.Take<uint32_t>(rows, "embedding backward");
  uint32_t* keys = carver.Take<uint32_t>(rows, "embedding backward");
  int32_t* rows_in = carver.Take<int32_t>(rows, "embedding backward");
  int32_t* rows_idx = carver.Take<int32_t>(rows, "embedding backward");
  size_t temp_bytes = SortTempBytes(rows, bits);
  void* temp = carver.Take<char>(temp_bytes, "embedding backward (sort)");

  MakeKeysKernel<<<static_cast<unsigned>(CeilDiv(rows, 256)), 256, 0, s>>>(
      keys_in, rows_in, ids, rows, begin, end, sentinel);
  LT_CUDA_LAUNCH_CHECK();
  LT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys, rows_in, rows_idx,
                                                rows, 0, bits, s));

  constexpr int W = kVec<T>;
  const bool vec = cols % W == 0 && Aligned16(dout) && Aligned16(dtable);
  const int64_t nvec = vec ? cols / W : cols;
  const int threads = static_cast<int>(std::min<int64_t>(256, RoundUp(nvec, 32)));
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(CeilDiv(nvec, threads)));
  if (vec) {
    AccumulateRunsKernel<T, W>
        <<<grid, threads, 0, s>>>(dtable, dout, keys, rows_idx, rows, cols, sentinel);
  } else {
    AccumulateRunsKernel<T, 1>
        <<<grid, threads, 0, s>>>(dtable, dout, keys, rows_idx, rows, cols, sentinel);
  }
  LT_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename T>
void EmbeddingForward(T* out, const int32_t* ids, const float* table, int64_t rows, int64_t cols,
                      int64_t vocab_begin, int64_t vocab_end, cudaStream_t s) {
  const bool vec = cols % kVec<T> == 0 && Aligned16(out) && Aligned16(table);
  LaunchMap<kVec<T>>(EmbeddingForwardOp<T>{out, ids, table, cols, vocab_begin, vocab_end},
                     static_cast<size_t>(rows * cols), vec, s);
}

template <typename T>
void PositionForward(T* out, const int32_t* positions, const float* table, int64_t rows,
                     int64_t cols, cudaStream_t s) {
  const bool vec = cols % kVec<T> == 0 && Aligned16(out) && Aligned16(table);
  LaunchMap<kVec<T>>(PositionForwardOp<T>{out, positions, table, cols},
                     static_cast<size_t>(rows * cols), vec, s);
}

template <typename T>
void EmbeddingBackward(float* dtable, const T* dout, const int32_t* ids, int64_t rows, int64_t cols,
                       int64_t vocab_begin, int64_t vocab_end, Scratch scratch, cudaStream_t s) {
  SortedScatterAdd(dtable, dout, ids, rows, cols, vocab_begin, vocab_end, scratch, s);
}

template <typename T>
void PositionBackward(float* dtable, const T* dout, const int32_t* positions, int64_t rows,
                      int64_t cols, Scratch scratch, cudaStream_t s) {
  // Every non-negative int32 position is a table row.
  SortedScatterAdd(dtable, dout, positions, rows, cols, 0, INT32_MAX, scratch, s);
}

size_t EmbeddingBackwardScratchBytes(int64_t rows, int64_t /*cols*/) {
  // Four key/index arrays and the sort's temporary storage, sized for 32-bit keys (the most).
  return 4 * ScratchCarver::Size(static_cast<size_t>(rows) * 4) +
         ScratchCarver::Size(SortTempBytes(rows, 32));
}

#define LT_EMBEDDING_INSTANTIATE(T)                                                               \
  template void EmbeddingForward<T>(T*, const int32_t*, const float*, int64_t, int64_t, int64_t,  \
                                    int64_t, cudaStream_t);                                       \
  template void PositionForward<T>(T*, const int32_t*, const float*, int64_t, int64_t,            \
                                   cudaStream_t);                                                 \
  template void EmbeddingBackward<T>(float*, const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                     int64_t, Scratch, cudaStream_t);                             \
  template void PositionBackward<T>(float*, const T*, const int32_t*, int64_t, int64_t, Scratch,  \
                                    cudaStream_t);
LT_EMBEDDING_INSTANTIATE(float)
LT_EMBEDDING_INSTANTIATE(bf16)
#undef LT_EMBEDDING_INSTANTIATE

}  // namespace leantron::trainer::cuda
