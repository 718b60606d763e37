// Elementwise kernels: conversions, fills, GELU, SwiGLU, hidden dropout, the float32 helpers of
// CudaOps (add, bias) and the bf16 gradient reduction's add. Grid-stride over 16-byte vectors when
// every pointer is aligned (and rows are whole vectors), element by element otherwise.
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/kernels/kernels_common.cuh"

namespace leantron::trainer::cuda {
namespace {
using namespace detail;

// out = in, converted (rounded to nearest even when narrowing).
template <typename Out, typename In>
struct ConvertOp {
  Out* out;
  const In* in;
  template <int W>
  __device__ void Apply(size_t i) const {
    float v[W];
    Load<W>(v, in + i);
    Store<W>(out + i, v);
  }
};

template <typename T>
struct FillOp {
  T* p;
  float value;
  template <int W>
  __device__ void Apply(size_t i) const {
    float v[W];
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = value;
    Store<W>(p + i, v);
  }
};

template <typename T>
struct GeluForwardOp {
  T* out;
  const T* in;
  bool tanh_approx;
  template <int W>
  __device__ void Apply(size_t i) const {
    float v[W];
    Load<W>(v, in + i);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = Gelu(v[j], tanh_approx);
    Store<W>(out + i, v);
  }
};

template <typename T>
struct GeluBackwardOp {
  T* din;
  const T* dout;  // may alias din: each element is read before it is written, by one thread
  const T* in;
  bool tanh_approx;
  template <int W>
  __device__ void Apply(size_t i) const {
    float x[W], g[W];
    Load<W>(x, in + i);
    Load<W>(g, dout + i);
#pragma unroll
    for (int j = 0; j < W; ++j) g[j] *= GeluGrad(x[j], tanh_approx);
    Store<W>(din + i, g);
  }
};

// Element i of out [rows, width] ↔ gate in[r, c] and up in[r, width + c].
template <typename T>
struct SwigluForwardOp {
  T* out;
  const T* in;
  int64_t width;
  template <int W>
  __device__ void Apply(size_t i) const {
    const int64_t r = static_cast<int64_t>(i) / width, c = static_cast<int64_t>(i) - r * width;
    float gate[W], up[W];
    Load<W>(gate, in + r * 2 * width + c);
    Load<W>(up, in + r * 2 * width + width + c);
#pragma unroll
    for (int j = 0; j < W; ++j) gate[j] = Swiglu(gate[j], up[j]);
    Store<W>(out + i, gate);
  }
};

template <typename T>
struct SwigluBackwardOp {
  T* din;
  const T* dout;
  const T* in;
  int64_t width;
  template <int W>
  __device__ void Apply(size_t i) const {
    const int64_t r = static_cast<int64_t>(i) / width, c = static_cast<int64_t>(i) - r * width;
    float gate[W], up[W], dy[W], dgate[W], dup[W];
    Load<W>(gate, in + r * 2 * width + c);
    Load<W>(up, in + r * 2 * width + width + c);
    Load<W>(dy, dout + i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      dup[j] = SwigluGradUp(gate[j], dy[j]);
      dgate[j] = SwigluGradGate(gate[j], up[j], dy[j]);
    }
    Store<W>(din + r * 2 * width + c, dgate);
    Store<W>(din + r * 2 * width + width + c, dup);
  }
};

template <typename T>
struct DropoutOp {
  T* x;
  int64_t cols;
  HiddenDropout d;
  float keep_scale;
  template <int W>
  __device__ void Apply(size_t i) const {
    const int64_t r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) - r * cols;
    const RowDropout rd(d, r, cols);
    float v[W];
    Load<W>(v, x + i);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = rd.Keep(d.p, c + j) ? v[j] * keep_scale : 0.0f;
    Store<W>(x + i, v);
  }
};

struct AddOp {
  float* a;
  const float* b;
  template <int W>
  __device__ void Apply(size_t i) const {
    float x[W], y[W];
    Load<W>(x, a + i);
    Load<W>(y, b + i);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] += y[j];
    Store<W>(a + i, x);
  }
};

struct AddRoundedOp {
  float* a;
  const bf16* b;
  bf16* out;
  template <int W>
  __device__ void Apply(size_t i) const {
    float x[W], y[W];
    Load<W>(x, a + i);
    Load<W>(y, b + i);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] = RoundTo<bf16>(RoundTo<bf16>(x[j]) + y[j]);
    Store<W>(a + i, x);
    if (out != nullptr) Store<W>(out + i, x);
  }
};

template <typename T>
struct AddBiasOp {
  T* out;
  const T* bias;
  int64_t cols;
  template <int W>
  __device__ void Apply(size_t i) const {
    const int64_t c = static_cast<int64_t>(i % static_cast<size_t>(cols));
    float x[W], b[W];
    Load<W>(x, out + i);
    Load<W>(b, bias + c);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] += b[j];
    Store<W>(out + i, x);
  }
};

}  // namespace

template <typename T>
void ConvertFromFloat(T* out, const float* in, size_t n, cudaStream_t s) {
  LaunchMap<kVec<T>>(ConvertOp<T, float>{out, in}, n, Aligned16(out) && Aligned16(in), s);
}

template <typename T>
void Fill(T* p, size_t n, float value, cudaStream_t s) {
  LaunchMap<kVec<T>>(FillOp<T>{p, value}, n, Aligned16(p), s);
}

template <typename T>
void GeluForward(T* out, const T* in, size_t n, bool tanh_approx, cudaStream_t s) {
  LaunchMap<kVec<T>>(GeluForwardOp<T>{out, in, tanh_approx}, n, Aligned16(out) && Aligned16(in), s);
}

template <typename T>
void GeluBackward(T* din, const T* dout, const T* in, size_t n, bool tanh_approx, cudaStream_t s) {
  LaunchMap<kVec<T>>(GeluBackwardOp<T>{din, dout, in, tanh_approx}, n,
                     Aligned16(din) && Aligned16(dout) && Aligned16(in), s);
}

template <typename T>
void SwigluForward(T* out, const T* in, int64_t rows, int64_t width, cudaStream_t s) {
  const bool vec = width % kVec<T> == 0 && Aligned16(out) && Aligned16(in);
  LaunchMap<kVec<T>>(SwigluForwardOp<T>{out, in, width}, static_cast<size_t>(rows * width), vec, s);
}

template <typename T>
void SwigluBackward(T* din, const T* dout, const T* in, int64_t rows, int64_t width,
                    cudaStream_t s) {
  const bool vec = width % kVec<T> == 0 && Aligned16(din) && Aligned16(dout) && Aligned16(in);
  LaunchMap<kVec<T>>(SwigluBackwardOp<T>{din, dout, in, width}, static_cast<size_t>(rows * width),
                     vec, s);
}

template <typename T>
void Dropout(T* x, int64_t rows, int64_t cols, const HiddenDropout& d, cudaStream_t s) {
  if (d.p <= 0.0f) return;
  const bool vec = cols % kVec<T> == 0 && Aligned16(x);
  LaunchMap<kVec<T>>(DropoutOp<T>{x, cols, d, 1.0f / (1.0f - d.p)},
                     static_cast<size_t>(rows * cols), vec, s);
}

void AddInPlace(float* a, const float* b, size_t n, cudaStream_t s) {
  LaunchMap<4>(AddOp{a, b}, n, Aligned16(a) && Aligned16(b), s);
}

void AddRoundedBf16(float* a, const bf16* b, bf16* out, size_t n, cudaStream_t s) {
  LaunchMap<kVec<bf16>>(AddRoundedOp{a, b, out}, n,
                        Aligned16(a) && Aligned16(b) && (out == nullptr || Aligned16(out)), s);
}

void ConvertToFloat(float* out, const bf16* in, size_t n, cudaStream_t s) {
  LaunchMap<kVec<bf16>>(ConvertOp<float, bf16>{out, in}, n, Aligned16(out) && Aligned16(in), s);
}

void LoadPeerExchangeKernels() {
  cudaFuncAttributes attributes;
  LT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, MapKernel<4, AddOp>));
  LT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, MapKernel<kVec<bf16>, AddRoundedOp>));
  LT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, MapKernel<kVec<bf16>, ConvertOp<float, bf16>>));
  LT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, MapKernel<kVec<bf16>, ConvertOp<bf16, float>>));
}

template <typename T>
void AddBias(T* out, const T* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  const bool vec = cols % 4 == 0 && Aligned16(out) && Aligned16(bias);
  LaunchMap<4>(AddBiasOp<T>{out, bias, cols}, static_cast<size_t>(rows * cols), vec, s);
}
template void AddBias<float>(float*, const float*, int64_t, int64_t, cudaStream_t);
template void AddBias<bf16>(bf16*, const bf16*, int64_t, int64_t, cudaStream_t);

#define LT_ELEMENTWISE_INSTANTIATE(T)                                                      \
  template void ConvertFromFloat<T>(T*, const float*, size_t, cudaStream_t);               \
  template void Fill<T>(T*, size_t, float, cudaStream_t);                                  \
  template void GeluForward<T>(T*, const T*, size_t, bool, cudaStream_t);                  \
  template void GeluBackward<T>(T*, const T*, const T*, size_t, bool, cudaStream_t);       \
  template void SwigluForward<T>(T*, const T*, int64_t, int64_t, cudaStream_t);            \
  template void SwigluBackward<T>(T*, const T*, const T*, int64_t, int64_t, cudaStream_t); \
  template void Dropout<T>(T*, int64_t, int64_t, const HiddenDropout&, cudaStream_t);
LT_ELEMENTWISE_INSTANTIATE(float)
LT_ELEMENTWISE_INSTANTIATE(bf16)
#undef LT_ELEMENTWISE_INSTANTIATE

}  // namespace leantron::trainer::cuda
