// Helpers of the GPU tests (one binary, gpu_ops_test): random inputs, bf16/float conversion on the
// host, tolerance comparisons relative to the output's scale, poisoned device buffers (NaN bit
// patterns, so an element a kernel does not write fails), and the fixtures that skip without a
// CUDA device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer::cuda::testutil {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline bool HaveGpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) cudaGetLastError();
  return ok;
}

inline std::vector<float> Rand(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
inline std::vector<int32_t> RandInts(size_t n, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// ---- bf16 / float on the host ----

template <typename T>
std::vector<T> ToT(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    std::vector<T> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
    return out;
  }
}
template <typename T>
std::vector<float> FromT(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
    return out;
  }
}
// v as T holds it.
template <typename T>
std::vector<float> RoundT(const std::vector<float>& v) {
  return FromT<T>(ToT<T>(v));
}
template <typename T>
double Tol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}
template <typename T>
const char* TypeName() {
  return std::is_same_v<T, float> ? "float" : "bf16";
}

// ---- comparisons ----

inline double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / v.size());
}

// Every |got − want| ≤ atol + rtol·|want|, atol = rtol·RMS(want) (relative to the output's scale)
// unless given; NaN anywhere in got fails.
inline ::testing::AssertionResult Close(const std::vector<float>& got,
                                        const std::vector<float>& want, double rtol,
                                        double atol = -1.0) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  if (atol < 0) atol = rtol * std::max(Rms(want), 1e-30);
  size_t bad = 0;
  std::ostringstream first;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    const double tol = atol + rtol * std::abs(want[i]);
    if (!(d <= tol)) {
      if (bad < 5) first << " [" << i << "] got " << got[i] << " want " << want[i] << ";";
      ++bad;
      if (!(d <= worst)) worst = d;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << "/" << got.size() << " elements off (worst |diff| "
                                       << worst << "):" << first.str();
}

template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---- device buffers for the direct kernel tests (all traffic on MainStream) ----

template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    LT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    Poison();
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { Upload(h); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p_); }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n_);
    LT_CUDA_CHECK(
        cudaMemcpyAsync(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  }
  std::vector<T> Download() const {
    std::vector<T> h(n_);
    LT_CUDA_CHECK(
        cudaMemcpyAsync(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    return h;
  }
  // All-ones bytes: NaN in float and in bf16.
  void Poison() {
    LT_CUDA_CHECK(cudaMemsetAsync(p_, 0xff, std::max<size_t>(n_, 1) * sizeof(T), MainStream()));
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// A device copy of float data as T.
template <typename T>
std::unique_ptr<Dev<T>> DevT(const std::vector<float>& h) {
  return std::make_unique<Dev<T>>(ToT<T>(h));
}
template <typename T>
std::vector<float> DownF(const Dev<T>& d) {
  return FromT<T>(d.Download());
}

struct DevScratch {
  explicit DevScratch(size_t bytes) : buf(bytes) {}
  Scratch get() const { return {buf.get(), buf.size()}; }
  Dev<char> buf;
};

inline std::unique_ptr<Ops> Cpu() { return *CreateOps("cpu"); }

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    cpu_ = Cpu();
  }
  std::unique_ptr<Ops> cpu_;
};

// A dropout site's parameters as the kernels and CpuOps take them.
inline HiddenDropout TestDropout(float p) {
  HiddenDropout d;
  d.p = p;
  d.seed = 0xfeedbeefULL;
  d.first_sample = 3;
  d.seq_length = 16;
  d.row_offset = 5;
  return d;
}

template <typename T>
class KernelTest : public GpuTest {};
using KernelTypes = ::testing::Types<float, bf16>;

}  // namespace leantron::trainer::cuda::testutil
