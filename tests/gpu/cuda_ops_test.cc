// The cuda backend against the cpu reference: every Ops method of CudaOps on fresh random inputs
// of awkward sizes (GPU outputs poisoned with NaN first, so a skipped element fails), the bf16
// instantiations of the templated kernels against CpuOps run in float on the same bf16-rounded
// inputs, and bitwise determinism of the reductions. Skipped without a CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer::cuda {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool HaveGpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) cudaGetLastError();
  return ok;
}

std::vector<float> Rand(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
std::vector<int32_t> RandInts(size_t n, uint32_t seed, int32_t lo, int32_t hi) {
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

double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / v.size());
}

// Every |got − want| ≤ atol + rtol·|want|, atol = rtol·RMS(want) (relative to the output's scale)
// unless given; NaN anywhere in got fails.
::testing::AssertionResult Close(const std::vector<float>& got, const std::vector<float>& want,
                                 double rtol, double atol = -1.0) {
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

std::unique_ptr<Ops> Cpu() { return *CreateOps("cpu"); }

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    cpu_ = Cpu();
  }
  std::unique_ptr<Ops> cpu_;
};

// ================================================================ CudaOps vs CpuOps

class CudaOpsTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    auto gpu = CreateOps("cuda");
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
  }
  void TearDown() override {
    if (gpu_ == nullptr) return;
    for (void* p : owned_) gpu_->FreeBytes(p);
  }
  // Device copy of host data through the backend's own transfers.
  template <typename U>
  U* Up(const std::vector<U>& h) {
    void* p = gpu_->AllocBytes(h.size() * sizeof(U));
    gpu_->CopyFromHost(p, h.data(), h.size() * sizeof(U));
    owned_.push_back(p);
    return static_cast<U*>(p);
  }
  float* Poisoned(size_t n) { return Up(std::vector<float>(n, kNaN)); }
  std::vector<float> Down(const float* p, size_t n) {
    std::vector<float> h(n);
    gpu_->CopyToHost(h.data(), p, n * sizeof(float));
    return h;
  }

  std::unique_ptr<Ops> gpu_;
  std::vector<void*> owned_;
};

TEST_F(CudaOpsTest, MemoryAndTransfers) {
  EXPECT_EQ(gpu_->name(), "cuda");
  const size_t n = 100003;
  float* a = gpu_->Alloc(n);
  EXPECT_TRUE(Close(Down(a, n), std::vector<float>(n, 0.0f), 0, 0)) << "Alloc is zero-filled";
  void* bytes = gpu_->AllocBytes(77);
  std::vector<uint8_t> hb(77, 1);
  gpu_->CopyToHost(hb.data(), bytes, 77);
  EXPECT_EQ(hb, std::vector<uint8_t>(77, 0)) << "AllocBytes is zero-filled";
  gpu_->FreeBytes(bytes);

  const auto x = Rand(n, 1);
  gpu_->CopyFromHost(a, x.data(), n * sizeof(float));
  EXPECT_TRUE(Close(Down(a, n), x, 0, 0));
  float* b = Poisoned(n);
  gpu_->Copy(b, a, n);
  EXPECT_TRUE(Close(Down(b, n), x, 0, 0));
  gpu_->Zero(b + 1, n - 2);
  auto hz = Down(b, n);
  EXPECT_EQ(hz[0], x[0]);
  EXPECT_EQ(hz[n - 1], x[n - 1]);
  for (size_t i = 1; i + 1 < n; ++i) ASSERT_EQ(hz[i], 0.0f) << i;
  gpu_->Free(a);
}

TEST_F(CudaOpsTest, AddInPlace) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{100003}}) {
    for (int offset : {0, 1}) {  // 1: misaligned, element-wise path
      auto x = Rand(n + 1, 2), y = Rand(n + 1, 3);
      float* dx = Up(x);
      float* dy = Up(y);
      gpu_->AddInPlace(dx + offset, dy + offset, n);
      cpu_->AddInPlace(x.data() + offset, y.data() + offset, n);
      EXPECT_TRUE(Close(Down(dx, n + 1), x, 1e-6)) << "AddInPlace n=" << n << " offset " << offset;
    }
  }
}

TEST_F(CudaOpsTest, AddBiasAndBiasBackward) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 129}, {1000, 1280}, {1000, 1283}}) {
    auto out = Rand(rows * cols, 4), bias = Rand(cols, 5);
    float* d_out = Up(out);
    gpu_->AddBias(d_out, Up(bias), rows, cols);
    cpu_->AddBias(out.data(), bias.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-6)) << rows << "x" << cols;

    auto dout = Rand(rows * cols, 6), dbias = Rand(cols, 7);
    float* d_dbias = Up(dbias);
    gpu_->BiasBackward(d_dbias, Up(dout), rows, cols);
    cpu_->BiasBackward(dbias.data(), dout.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_dbias, cols), dbias, 1e-5)) << rows << "x" << cols;
  }
}

TEST_F(CudaOpsTest, Linear) {
  struct Shape {
    int64_t m, k, n;
  };
  for (const Shape& s : {Shape{37, 129, 65}, Shape{200, 1283, 515}, Shape{64, 256, 1280}}) {
    for (bool with_bias : {true, false}) {
      const auto in = Rand(s.m * s.k, 8), w = Rand(s.n * s.k, 9, 0.05f), b = Rand(s.n, 10);
      std::vector<float> out(s.m * s.n);
      float* d_out = Poisoned(out.size());
      float* d_in = Up(in);
      float* d_w = Up(w);
      gpu_->LinearForward(d_out, d_in, d_w, with_bias ? Up(b) : nullptr, s.m, s.k, s.n);
      cpu_->LinearForward(out.data(), in.data(), w.data(), with_bias ? b.data() : nullptr, s.m, s.k,
                          s.n);
      EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "forward m=" << s.m;

      for (int mode = 0; mode < 3; ++mode) {  // din overwritten, accumulated, skipped
        const bool accumulate = mode == 1;
        const auto dout = Rand(s.m * s.n, 11);
        auto din = mode == 1 ? Rand(s.m * s.k, 12) : std::vector<float>(s.m * s.k, 0.0f);
        auto dw = Rand(s.n * s.k, 13), db = Rand(s.n, 14);
        float* d_din = mode == 2 ? nullptr : (mode == 1 ? Up(din) : Poisoned(din.size()));
        float* d_dw = Up(dw);
        float* d_db = with_bias ? Up(db) : nullptr;
        gpu_->LinearBackward(d_din, d_dw, d_db, Up(dout), d_in, d_w, s.m, s.k, s.n, accumulate);
        cpu_->LinearBackward(mode == 2 ? nullptr : din.data(), dw.data(),
                             with_bias ? db.data() : nullptr, dout.data(), in.data(), w.data(), s.m,
                             s.k, s.n, accumulate);
        if (mode != 2) {
          EXPECT_TRUE(Close(Down(d_din, din.size()), din, 1e-5)) << "din mode " << mode;
        }
        EXPECT_TRUE(Close(Down(d_dw, dw.size()), dw, 1e-5)) << "dweight mode " << mode;
        if (with_bias) {
          EXPECT_TRUE(Close(Down(d_db, db.size()), db, 1e-5)) << "dbias";
        }
      }
    }
  }
}

// Row shapes that reach every norm path: unaligned (loop), cached with 1/2/4/8 vectors per
// thread, and rows longer than the backward's register cache.
const std::vector<std::pair<int64_t, int64_t>> kNormShapes = {
    {37, 129}, {1000, 1280}, {1000, 1283}, {3000, 64}, {16, 5120}, {8, 10240}, {3, 40000}};

TEST_F(CudaOpsTest, LayerNorm) {
  for (auto [rows, cols] : kNormShapes) {
    SCOPED_TRACE(testing::Message() << rows << "x" << cols);
    const auto in = Rand(rows * cols, 20, 2.0f, 0.5f), w = Rand(cols, 21, 1.0f, 1.0f),
               b = Rand(cols, 22);
    std::vector<float> out(rows * cols), mean(rows), rstd(rows);
    float* d_out = Poisoned(out.size());
    float* d_mean = Poisoned(rows);
    float* d_rstd = Poisoned(rows);
    float* d_in = Up(in);
    float* d_w = Up(w);
    gpu_->LayerNormForward(d_out, d_mean, d_rstd, d_in, d_w, Up(b), rows, cols, 1e-5f);
    cpu_->LayerNormForward(out.data(), mean.data(), rstd.data(), in.data(), w.data(), b.data(),
                           rows, cols, 1e-5f);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "out";
    EXPECT_TRUE(Close(Down(d_mean, rows), mean, 1e-5)) << "mean";
    EXPECT_TRUE(Close(Down(d_rstd, rows), rstd, 1e-5)) << "rstd";

    const auto dout = Rand(rows * cols, 23);
    auto din = Rand(rows * cols, 24), dw = Rand(cols, 25), db = Rand(cols, 26);
    float* d_din = Up(din);
    float* d_dw = Up(dw);
    float* d_db = Up(db);
    gpu_->LayerNormBackward(d_din, d_dw, d_db, Up(dout), d_in, d_w, Up(mean), Up(rstd), rows, cols);
    cpu_->LayerNormBackward(din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(),
                            mean.data(), rstd.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_din, din.size()), din, 1e-5)) << "din";
    EXPECT_TRUE(Close(Down(d_dw, cols), dw, 1e-5)) << "dweight";
    EXPECT_TRUE(Close(Down(d_db, cols), db, 1e-5)) << "dbias";
  }
}

TEST_F(CudaOpsTest, RmsNorm) {
  for (auto [rows, cols] : kNormShapes) {
    SCOPED_TRACE(testing::Message() << rows << "x" << cols);
    const auto in = Rand(rows * cols, 30, 2.0f, 0.5f), w = Rand(cols, 31, 1.0f, 1.0f);
    std::vector<float> out(rows * cols), rstd(rows);
    float* d_out = Poisoned(out.size());
    float* d_rstd = Poisoned(rows);
    float* d_in = Up(in);
    float* d_w = Up(w);
    gpu_->RmsNormForward(d_out, d_rstd, d_in, d_w, rows, cols, 1e-6f);
    cpu_->RmsNormForward(out.data(), rstd.data(), in.data(), w.data(), rows, cols, 1e-6f);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "out";
    EXPECT_TRUE(Close(Down(d_rstd, rows), rstd, 1e-5)) << "rstd";

    const auto dout = Rand(rows * cols, 32);
    auto din = Rand(rows * cols, 33), dw = Rand(cols, 34);
    float* d_din = Up(din);
    float* d_dw = Up(dw);
    gpu_->RmsNormBackward(d_din, d_dw, Up(dout), d_in, d_w, Up(rstd), rows, cols);
    cpu_->RmsNormBackward(din.data(), dw.data(), dout.data(), in.data(), w.data(), rstd.data(),
                          rows, cols);
    EXPECT_TRUE(Close(Down(d_din, din.size()), din, 1e-5)) << "din";
    EXPECT_TRUE(Close(Down(d_dw, cols), dw, 1e-5)) << "dweight";
  }
}

TEST_F(CudaOpsTest, Swiglu) {
  for (auto [rows, width] : {std::pair<int64_t, int64_t>{37, 129}, {100, 1280}, {64, 1283}}) {
    const auto in = Rand(rows * 2 * width, 40, 2.0f), dout = Rand(rows * width, 41);
    std::vector<float> out(rows * width), din(rows * 2 * width);
    float* d_out = Poisoned(out.size());
    float* d_din = Poisoned(din.size());
    float* d_in = Up(in);
    gpu_->SwigluForward(d_out, d_in, rows, width);
    cpu_->SwigluForward(out.data(), in.data(), rows, width);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "forward width " << width;
    gpu_->SwigluBackward(d_din, Up(dout), d_in, rows, width);
    cpu_->SwigluBackward(din.data(), dout.data(), in.data(), rows, width);
    EXPECT_TRUE(Close(Down(d_din, din.size()), din, 1e-5)) << "backward width " << width;
  }
}

TEST_F(CudaOpsTest, Rope) {
  struct Case {
    int64_t batch, seq, heads, groups, dim;
  };
  for (const Case& c : {Case{2, 37, 4, 4, 16}, Case{2, 37, 4, 2, 16}, Case{1, 300, 8, 1, 64}}) {
    for (bool inverse : {false, true}) {
      auto qkv = Rand(c.batch * c.seq * (c.heads + 2 * c.groups) * c.dim, 50);
      float* d = Up(qkv);
      gpu_->Rope(d, c.batch, c.seq, c.heads, c.groups, c.dim, 10000.0, inverse);
      cpu_->Rope(qkv.data(), c.batch, c.seq, c.heads, c.groups, c.dim, 10000.0, inverse);
      EXPECT_TRUE(Close(Down(d, qkv.size()), qkv, 1e-5))
          << "groups " << c.groups << " inverse " << inverse;
    }
  }
}

TEST_F(CudaOpsTest, Gelu) {
  for (size_t n : {size_t{5}, size_t{100003}}) {
    for (bool tanh_approx : {false, true}) {
      const auto in = Rand(n, 60, 3.0f), dout = Rand(n, 61);
      std::vector<float> out(n), din(n);
      float* d_out = Poisoned(n);
      float* d_in = Up(in);
      gpu_->GeluForward(d_out, d_in, n, tanh_approx);
      cpu_->GeluForward(out.data(), in.data(), n, tanh_approx);
      EXPECT_TRUE(Close(Down(d_out, n), out, 1e-5)) << "forward tanh " << tanh_approx;
      float* d_din = Up(dout);  // din aliases dout
      gpu_->GeluBackward(d_din, d_din, d_in, n, tanh_approx);
      cpu_->GeluBackward(din.data(), dout.data(), in.data(), n, tanh_approx);
      EXPECT_TRUE(Close(Down(d_din, n), din, 1e-5)) << "backward tanh " << tanh_approx;
    }
  }
}

TEST_F(CudaOpsTest, Attention) {
  struct Case {
    int64_t batch, seq, heads, groups, dim;
    float p;
  };
  for (const Case& c : {Case{2, 37, 4, 4, 16, 0.0f}, Case{2, 37, 4, 2, 16, 0.1f},
                        Case{1, 70, 6, 1, 24, 0.2f}, Case{3, 1, 2, 2, 8, 0.0f}}) {
    SCOPED_TRACE(testing::Message() << "groups " << c.groups << " p " << c.p);
    AttentionDropout drop;
    drop.p = c.p;
    drop.seed = 0x1234567;
    drop.first_sample = 5;
    drop.head_offset = 2;
    drop.total_heads = c.heads + 2;
    const int64_t row = (c.heads + 2 * c.groups) * c.dim;
    const auto qkv = Rand(c.batch * c.seq * row, 70);
    std::vector<float> out(c.batch * c.seq * c.heads * c.dim),
        probs(c.batch * c.heads * c.seq * c.seq);
    float* d_out = Poisoned(out.size());
    float* d_probs = Poisoned(probs.size());
    float* d_qkv = Up(qkv);
    gpu_->AttentionForward(d_out, d_probs, d_qkv, c.batch, c.seq, c.heads, c.groups, c.dim, drop);
    cpu_->AttentionForward(out.data(), probs.data(), qkv.data(), c.batch, c.seq, c.heads, c.groups,
                           c.dim, drop);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "out";
    EXPECT_TRUE(Close(Down(d_probs, probs.size()), probs, 1e-5)) << "probs";

    const auto dout = Rand(out.size(), 71);
    std::vector<float> dqkv(qkv.size());
    float* d_dqkv = Poisoned(dqkv.size());
    gpu_->AttentionBackward(d_dqkv, Up(dout), d_qkv, Up(probs), c.batch, c.seq, c.heads, c.groups,
                            c.dim, drop);
    cpu_->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), probs.data(), c.batch, c.seq,
                            c.heads, c.groups, c.dim, drop);
    EXPECT_TRUE(Close(Down(d_dqkv, dqkv.size()), dqkv, 1e-5)) << "dqkv";
  }
}

HiddenDropout TestDropout(float p) {
  HiddenDropout d;
  d.p = p;
  d.seed = 0xfeedbeefULL;
  d.first_sample = 3;
  d.seq_length = 16;
  d.row_offset = 5;
  return d;
}

TEST_F(CudaOpsTest, DropoutMaskIsCpuOps) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 129}, {64, 1280}}) {
    for (float p : {0.0f, 0.1f, 0.5f}) {
      auto x = Rand(rows * cols, 80);
      float* d = Up(x);
      gpu_->Dropout(d, rows, cols, TestDropout(p));
      cpu_->Dropout(x.data(), rows, cols, TestDropout(p));
      // One multiplication per element: bitwise equal.
      EXPECT_TRUE(Close(Down(d, x.size()), x, 0, 0)) << rows << "x" << cols << " p " << p;
    }
  }
}

TEST_F(CudaOpsTest, EmbeddingAndPosition) {
  for (int64_t cols : {129, 1280}) {
    const int64_t rows = 1000, vocab = 50, vb = 10, ve = 40;  // a shard; ids repeat
    const auto ids = RandInts(rows, 90, 0, vocab);
    const auto table = Rand((ve - vb) * cols, 91);
    std::vector<float> out(rows * cols);
    float* d_out = Poisoned(out.size());
    int32_t* d_ids = Up(ids);
    gpu_->EmbeddingForward(d_out, d_ids, Up(table), rows, cols, vb, ve);
    cpu_->EmbeddingForward(out.data(), ids.data(), table.data(), rows, cols, vb, ve);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 0, 0)) << "embedding forward cols " << cols;

    const auto dout = Rand(rows * cols, 92);
    auto dtable = Rand(table.size(), 93);
    float* d_dtable = Up(dtable);
    float* d_dout = Up(dout);
    gpu_->EmbeddingBackward(d_dtable, d_dout, d_ids, rows, cols, vb, ve);
    cpu_->EmbeddingBackward(dtable.data(), dout.data(), ids.data(), rows, cols, vb, ve);
    EXPECT_TRUE(Close(Down(d_dtable, dtable.size()), dtable, 1e-5)) << "embedding backward";

    const int64_t seq = 37;
    std::vector<int32_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>(r % seq);
    const auto ptable = Rand(seq * cols, 94);
    auto pout = Rand(rows * cols, 95);
    float* d_pout = Up(pout);
    int32_t* d_pos = Up(pos);
    gpu_->PositionForward(d_pout, d_pos, Up(ptable), rows, cols);
    cpu_->PositionForward(pout.data(), pos.data(), ptable.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_pout, pout.size()), pout, 1e-6)) << "position forward";
    auto dptable = Rand(ptable.size(), 96);
    float* d_dptable = Up(dptable);
    gpu_->PositionBackward(d_dptable, d_dout, d_pos, rows, cols);
    cpu_->PositionBackward(dptable.data(), dout.data(), pos.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_dptable, dptable.size()), dptable, 1e-5)) << "position backward";
  }
}

// A reduce hook that changes the data the same way on either backend (max + 0.25, sums · 1.5),
// so the hooks' placement shows in the results; counts its calls and checks the pointer kind.
ReduceHook TestHook(bool device, float add, float mul, int* calls, int64_t* n_seen) {
  return [=](float* data, int64_t n) {
    ++*calls;
    *n_seen = n;
    std::vector<float> h(n);
    if (device) {
      cudaPointerAttributes attr{};
      EXPECT_EQ(cudaPointerGetAttributes(&attr, data), cudaSuccess);
      EXPECT_EQ(attr.type, cudaMemoryTypeDevice) << "hooks get device pointers";
      LT_CUDA_CHECK(
          cudaMemcpyAsync(h.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost, MainStream()));
      LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    } else {
      std::copy(data, data + n, h.begin());
    }
    for (float& x : h) x = x * mul + add;
    if (device) {
      LT_CUDA_CHECK(
          cudaMemcpyAsync(data, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, MainStream()));
      LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    } else {
      std::copy(h.begin(), h.end(), data);
    }
  };
}

TEST_F(CudaOpsTest, CrossEntropy) {
  struct Case {
    int64_t rows, vocab_local, vocab_begin, vocab_total;
    bool hooks;
  };
  for (const Case& c : {Case{37, 1283, 0, 1283, false}, Case{37, 1280, 0, 1280, true},
                        Case{64, 1000, 600, 2600, true}}) {
    SCOPED_TRACE(testing::Message() << "vocab " << c.vocab_local << " begin " << c.vocab_begin);
    const auto logits = Rand(c.rows * c.vocab_local, 100, 3.0f);
    auto targets = RandInts(c.rows, 101, 0, static_cast<int32_t>(c.vocab_total));
    targets[0] = -1;
    targets[c.rows / 2] = -1;
    targets[1] = static_cast<int32_t>(c.vocab_begin);  // the shard's first and last columns
    targets[2] = static_cast<int32_t>(c.vocab_begin + c.vocab_local - 1);
    std::vector<float> losses(c.rows), stats(2 * c.rows);
    float* d_losses = Poisoned(c.rows);
    float* d_stats = Poisoned(2 * c.rows);
    float* d_logits = Up(logits);
    int32_t* d_targets = Up(targets);
    int calls[4] = {0, 0, 0, 0};
    int64_t seen[4] = {0, 0, 0, 0};
    ReduceHook none;
    gpu_->CrossEntropyForward(d_losses, d_stats, d_logits, d_targets, c.rows, c.vocab_local,
                              c.vocab_begin,
                              c.hooks ? TestHook(true, 0.25f, 1.0f, &calls[0], &seen[0]) : none,
                              c.hooks ? TestHook(true, 0.0f, 1.5f, &calls[1], &seen[1]) : none);
    cpu_->CrossEntropyForward(losses.data(), stats.data(), logits.data(), targets.data(), c.rows,
                              c.vocab_local, c.vocab_begin,
                              c.hooks ? TestHook(false, 0.25f, 1.0f, &calls[2], &seen[2]) : none,
                              c.hooks ? TestHook(false, 0.0f, 1.5f, &calls[3], &seen[3]) : none);
    if (c.hooks) {
      EXPECT_EQ(calls[0], 1);
      EXPECT_EQ(calls[1], 1);
      EXPECT_EQ(seen[0], c.rows);
      EXPECT_EQ(seen[1], 2 * c.rows);
    }
    EXPECT_TRUE(Close(Down(d_losses, c.rows), losses, 1e-5)) << "losses";
    EXPECT_TRUE(Close(Down(d_stats, 2 * c.rows), stats, 1e-5)) << "stats";

    const auto dlosses = Rand(c.rows, 102);
    std::vector<float> dlogits(logits.size());
    float* d_dlogits = Poisoned(dlogits.size());
    gpu_->CrossEntropyBackward(d_dlogits, Up(dlosses), Up(stats), d_logits, d_targets, c.rows,
                               c.vocab_local, c.vocab_begin);
    cpu_->CrossEntropyBackward(dlogits.data(), dlosses.data(), stats.data(), logits.data(),
                               targets.data(), c.rows, c.vocab_local, c.vocab_begin);
    EXPECT_TRUE(Close(Down(d_dlogits, dlogits.size()), dlogits, 1e-5)) << "dlogits";
  }
}

TEST_F(CudaOpsTest, SumSquares) {
  for (size_t n : {size_t{1}, size_t{1000003}}) {
    const auto x = Rand(n, 110, 2.0f);
    double want = 0.0;
    for (float v : x) want += static_cast<double>(v) * v;
    float* d = Up(x);
    EXPECT_NEAR(gpu_->SumSquares(d, n), want, 1e-12 * want) << n;
    EXPECT_NEAR(gpu_->SumSquares(d, n), cpu_->SumSquares(x.data(), n), 1e-12 * want) << n;
  }
  auto x = Rand(1000, 111);
  x[517] = kNaN;
  EXPECT_TRUE(std::isnan(gpu_->SumSquares(Up(x), x.size())));
  x[517] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(gpu_->SumSquares(Up(x), x.size())));
}

TEST_F(CudaOpsTest, AdamWStep) {
  for (int offset : {0, 1}) {
    const size_t n = 100003;
    auto p = Rand(n + 1, 120), g = Rand(n + 1, 121, 0.1f), m = Rand(n + 1, 122, 0.01f),
         v = Rand(n + 1, 123, 0.001f);
    for (float& x : v) x = std::abs(x);
    float* dp = Up(p);
    float* dm = Up(m);
    float* dv = Up(v);
    float* dg = Up(g);
    for (int64_t step = 1; step <= 3; ++step) {
      const float scale = step == 2 ? 0.6f : 1.0f;  // gradient scaling folded into the step
      gpu_->AdamWStep(dp + offset, dg + offset, dm + offset, dv + offset, n, 3e-3f, 0.9f, 0.95f,
                      1e-8f, 0.1f, step, scale, nullptr);
      cpu_->AdamWStep(p.data() + offset, g.data() + offset, m.data() + offset, v.data() + offset, n,
                      3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, scale, nullptr);
    }
    EXPECT_TRUE(Close(Down(dp, n + 1), p, 1e-5)) << "param offset " << offset;
    EXPECT_TRUE(Close(Down(dm, n + 1), m, 1e-5)) << "exp_avg offset " << offset;
    EXPECT_TRUE(Close(Down(dv, n + 1), v, 1e-5)) << "exp_avg_sq offset " << offset;
  }
}

// ================================================================ templated kernels (float, bf16)

template <typename T>
class KernelTest : public GpuTest {};
using KernelTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(KernelTest, KernelTypes);

// Unaligned (loop), 1/2/4/8 vectors per thread in bf16 (float: 1/4/8/loop), and beyond.
const std::vector<std::pair<int64_t, int64_t>> kFusedShapes = {
    {37, 129}, {1000, 1280}, {1000, 1283}, {16, 6144}, {16, 12288}, {5, 20480}, {2, 70000}};

TYPED_TEST(KernelTest, ConvertAndFill) {
  using T = TypeParam;
  for (size_t n : {size_t{3}, size_t{100005}}) {
    const auto x = Rand(n, 130);
    Dev<float> in(x);
    Dev<T> out(n);
    ConvertFromFloat<T>(out.get(), in.get(), n, MainStream());
    EXPECT_TRUE(BitwiseEqual(out.Download(), ToT<T>(x))) << n;
    Fill<T>(out.get(), n, 0.375f, MainStream());
    EXPECT_EQ(DownF(out), std::vector<float>(n, 0.375f)) << n;
  }
}

// The data-parallel reduction in bf16 (--grad-reduce-in-bf16): s = bf16(bf16(a) + b) into a and
// out, and bf16 back to float, bit for bit against the host's rounding; vector and misaligned
// (element by element) paths.
TEST_F(GpuTest, AddRoundedBf16AndConvertToFloat) {
  auto rounded_sum = [](float a, float b) { return RoundT<bf16>({RoundT<bf16>({a})[0] + b})[0]; };
  for (size_t n : {size_t{5}, size_t{100007}}) {
    for (size_t offset : {size_t{0}, size_t{1}}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " offset " << offset);
      const auto a = Rand(n + 1, 150, 3.0f), b = RoundT<bf16>(Rand(n + 1, 151, 3.0f));
      Dev<float> da(a);
      Dev<bf16> db(ToT<bf16>(b)), out(ToT<bf16>(std::vector<float>(n + 1, 7.0f)));
      AddRoundedBf16(da.get() + offset, db.get() + offset, out.get() + offset, n, MainStream());
      std::vector<float> want = a, sent(n + 1, 7.0f);
      for (size_t i = offset; i < offset + n; ++i) sent[i] = want[i] = rounded_sum(a[i], b[i]);
      EXPECT_TRUE(BitwiseEqual(da.Download(), want)) << "sum kept";
      EXPECT_TRUE(BitwiseEqual(DownF(out), sent)) << "sum sent";
      AddRoundedBf16(da.get() + offset, db.get() + offset, nullptr, n, MainStream());
      for (size_t i = offset; i < offset + n; ++i) want[i] = rounded_sum(want[i], b[i]);
      EXPECT_TRUE(BitwiseEqual(da.Download(), want)) << "without out";
      Dev<float> f(std::vector<float>(n + 1, -1.0f));
      ConvertToFloat(f.get() + offset, out.get() + offset, n, MainStream());
      std::vector<float> conv = sent;
      if (offset == 1) conv[0] = -1.0f;
      if (offset == 0) conv[n] = -1.0f;
      EXPECT_TRUE(BitwiseEqual(f.Download(), conv)) << "to float";
    }
  }
}

// x = residual + Dropout(branch), LayerNorm(x) (or RMSNorm), against CpuOps on the T-rounded
// inputs, with x rounded to T as the kernel stores it. With `two_branches` (LayerNorm) the branch
// comes in two addends, summed and rounded to T first.
template <typename T>
void CheckFusedNormForward(Ops* cpu, bool rms, int64_t rows, int64_t cols, bool residual, float p,
                           bool two_branches = false) {
  SCOPED_TRACE(testing::Message() << TypeName<T>() << (rms ? " rms " : " ln ") << rows << "x"
                                  << cols << " residual " << residual << " p " << p
                                  << " two branches " << two_branches);
  const HiddenDropout drop = TestDropout(p);
  const auto res = RoundT<T>(Rand(rows * cols, 140, 2.0f, 0.3f));
  const auto br = RoundT<T>(Rand(rows * cols, 141));
  const auto br2 = RoundT<T>(Rand(rows * cols, 144));
  const auto w = Rand(cols, 142, 0.5f, 1.0f), b = Rand(cols, 143);
  std::vector<float> x = br;
  if (two_branches) {
    cpu->AddInPlace(x.data(), br2.data(), x.size());
    x = RoundT<T>(x);
  }
  if (residual) {
    cpu->Dropout(x.data(), rows, cols, drop);
    cpu->AddInPlace(x.data(), res.data(), x.size());
    x = RoundT<T>(x);
  }
  std::vector<float> out(rows * cols), mean(rows), rstd(rows);
  if (rms) {
    cpu->RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-5f);
  } else {
    cpu->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows,
                          cols, 1e-5f);
  }

  auto d_res = DevT<T>(res);
  auto d_br = DevT<T>(br);
  auto d_br2 = DevT<T>(br2);
  Dev<float> d_w(w), d_b(b), d_mean(rows), d_rstd(rows);
  Dev<T> d_x(rows * cols), d_out(rows * cols);
  if (rms) {
    AddRmsNormForward<T>(residual ? d_x.get() : nullptr, d_out.get(), d_rstd.get(),
                         residual ? d_res->get() : nullptr, d_br->get(), d_w.get(), rows, cols,
                         1e-5f, drop, MainStream());
  } else {
    AddLayerNormForward<T>(residual ? d_x.get() : nullptr, d_out.get(), d_mean.get(), d_rstd.get(),
                           residual ? d_res->get() : nullptr, d_br->get(), d_w.get(), d_b.get(),
                           rows, cols, 1e-5f, drop, MainStream(),
                           two_branches ? d_br2->get() : nullptr);
  }
  if (residual) {
    EXPECT_TRUE(Close(DownF(d_x), x, Tol<T>())) << "x_out";
  }
  EXPECT_TRUE(Close(DownF(d_out), out, Tol<T>())) << "out";
  if (!rms) {
    EXPECT_TRUE(Close(d_mean.Download(), mean, Tol<T>())) << "mean";
  }
  EXPECT_TRUE(Close(d_rstd.Download(), rstd, Tol<T>())) << "rstd";
}

TYPED_TEST(KernelTest, AddLayerNormForward) {
  for (auto [rows, cols] : kFusedShapes) {
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), false, rows, cols, false, 0.0f);
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), false, rows, cols, true, 0.0f);
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), false, rows, cols, true, 0.1f);
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), false, rows, cols, true, 0.1f, true);
  }
}

TYPED_TEST(KernelTest, AddRmsNormForward) {
  for (auto [rows, cols] : kFusedShapes) {
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), true, rows, cols, false, 0.0f);
    CheckFusedNormForward<TypeParam>(this->cpu_.get(), true, rows, cols, true, 0.1f);
  }
}

// dx = dresidual + ∂norm, dbranch = Dropout(dx), dw/db +=, against CpuOps on rounded inputs.
// `in_place` makes dx alias dresidual.
template <typename T>
void CheckNormBackward(Ops* cpu, bool rms, int64_t rows, int64_t cols, bool with_residual,
                       bool with_branch, bool in_place, float p) {
  SCOPED_TRACE(testing::Message() << TypeName<T>() << (rms ? " rms " : " ln ") << rows << "x"
                                  << cols << " dresidual " << with_residual << " dbranch "
                                  << with_branch << " in_place " << in_place << " p " << p);
  const HiddenDropout drop = TestDropout(p);
  const auto x = RoundT<T>(Rand(rows * cols, 150, 2.0f, 0.3f));
  const auto w = Rand(cols, 151, 0.5f, 1.0f), b = Rand(cols, 152);
  std::vector<float> out(rows * cols), mean(rows), rstd(rows);
  if (rms) {
    cpu->RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-5f);
  } else {
    cpu->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows,
                          cols, 1e-5f);
  }
  const auto dout = RoundT<T>(Rand(rows * cols, 153));
  const auto dres =
      with_residual ? RoundT<T>(Rand(rows * cols, 154)) : std::vector<float>(rows * cols, 0.0f);
  const auto dw0 = Rand(cols, 155), db0 = Rand(cols, 156);
  auto dx = dres, dw = dw0, db = db0;
  if (rms) {
    cpu->RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), rows,
                         cols);
  } else {
    cpu->LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), rows, cols);
  }
  auto dbranch = dx;
  cpu->Dropout(dbranch.data(), rows, cols, drop);

  auto d_x = DevT<T>(x);
  auto d_dout = DevT<T>(dout);
  auto d_dres = DevT<T>(dres);
  Dev<T> d_dx_own(rows * cols), d_dbranch(rows * cols);
  T* d_dx = in_place ? d_dres->get() : d_dx_own.get();
  Dev<float> d_w(w), d_mean(mean), d_rstd(rstd), d_dw(dw0), d_db(db0);
  const size_t bytes =
      rms ? RmsNormBackwardScratchBytes(rows, cols) : LayerNormBackwardScratchBytes(rows, cols);
  DevScratch scratch(bytes);
  if (rms) {
    RmsNormBackward<T>(d_dx, with_branch ? d_dbranch.get() : nullptr, d_dw.get(), d_dout->get(),
                       with_residual ? d_dres->get() : nullptr, d_x->get(), d_w.get(), d_rstd.get(),
                       rows, cols, drop, scratch.get(), MainStream());
  } else {
    LayerNormBackward<T>(d_dx, with_branch ? d_dbranch.get() : nullptr, d_dw.get(), d_db.get(),
                         d_dout->get(), with_residual ? d_dres->get() : nullptr, d_x->get(),
                         d_w.get(), d_mean.get(), d_rstd.get(), rows, cols, drop, scratch.get(),
                         MainStream());
  }
  EXPECT_TRUE(Close(FromT<T>(in_place ? d_dres->Download() : d_dx_own.Download()), dx, Tol<T>()))
      << "dx";
  if (with_branch) {
    EXPECT_TRUE(Close(DownF(d_dbranch), dbranch, Tol<T>())) << "dbranch";
  }
  EXPECT_TRUE(Close(d_dw.Download(), dw, 1e-4)) << "dw";
  if (!rms) {
    EXPECT_TRUE(Close(d_db.Download(), db, 1e-4)) << "db";
  }
}

TYPED_TEST(KernelTest, LayerNormBackward) {
  using T = TypeParam;
  for (auto [rows, cols] : kFusedShapes) {
    CheckNormBackward<T>(this->cpu_.get(), false, rows, cols, false, false, false, 0.0f);
    CheckNormBackward<T>(this->cpu_.get(), false, rows, cols, true, true, false, 0.1f);
    CheckNormBackward<T>(this->cpu_.get(), false, rows, cols, true, true, true, 0.1f);
  }
  CheckNormBackward<T>(this->cpu_.get(), false, 3000, 64, true, true, false, 0.0f);
}

TYPED_TEST(KernelTest, RmsNormBackward) {
  using T = TypeParam;
  for (auto [rows, cols] : kFusedShapes) {
    CheckNormBackward<T>(this->cpu_.get(), true, rows, cols, false, false, false, 0.0f);
    CheckNormBackward<T>(this->cpu_.get(), true, rows, cols, true, true, true, 0.1f);
  }
}

TYPED_TEST(KernelTest, Gelu) {
  using T = TypeParam;
  for (size_t n : {size_t{13}, size_t{100005}}) {
    for (bool tanh_approx : {false, true}) {
      const auto in = RoundT<T>(Rand(n, 160, 3.0f)), dout = RoundT<T>(Rand(n, 161));
      std::vector<float> out(n), din(n);
      this->cpu_->GeluForward(out.data(), in.data(), n, tanh_approx);
      this->cpu_->GeluBackward(din.data(), dout.data(), in.data(), n, tanh_approx);
      auto d_in = DevT<T>(in);
      auto d_dout = DevT<T>(dout);
      Dev<T> d_out(n);
      GeluForward<T>(d_out.get(), d_in->get(), n, tanh_approx, MainStream());
      EXPECT_TRUE(Close(DownF(d_out), out, Tol<T>())) << "forward tanh " << tanh_approx;
      GeluBackward<T>(d_dout->get(), d_dout->get(), d_in->get(), n, tanh_approx, MainStream());
      EXPECT_TRUE(Close(DownF(*d_dout), din, Tol<T>())) << "backward (in place) " << tanh_approx;
    }
  }
}

TYPED_TEST(KernelTest, Swiglu) {
  using T = TypeParam;
  for (auto [rows, width] : {std::pair<int64_t, int64_t>{37, 129}, {64, 1280}}) {
    const auto in = RoundT<T>(Rand(rows * 2 * width, 165, 2.0f));
    const auto dout = RoundT<T>(Rand(rows * width, 166));
    std::vector<float> out(rows * width), din(rows * 2 * width);
    this->cpu_->SwigluForward(out.data(), in.data(), rows, width);
    this->cpu_->SwigluBackward(din.data(), dout.data(), in.data(), rows, width);
    auto d_in = DevT<T>(in);
    auto d_dout = DevT<T>(dout);
    Dev<T> d_out(out.size()), d_din(din.size());
    SwigluForward<T>(d_out.get(), d_in->get(), rows, width, MainStream());
    SwigluBackward<T>(d_din.get(), d_dout->get(), d_in->get(), rows, width, MainStream());
    EXPECT_TRUE(Close(DownF(d_out), out, Tol<T>())) << "forward " << width;
    EXPECT_TRUE(Close(DownF(d_din), din, Tol<T>())) << "backward " << width;
  }
}

TYPED_TEST(KernelTest, Dropout) {
  using T = TypeParam;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 129}, {64, 1280}}) {
    const auto x = RoundT<T>(Rand(rows * cols, 170));
    auto want = x;
    this->cpu_->Dropout(want.data(), rows, cols, TestDropout(0.3f));
    auto d = DevT<T>(x);
    Dropout<T>(d->get(), rows, cols, TestDropout(0.3f), MainStream());
    // One multiplication, then one rounding: bitwise what CpuOps gives, rounded to T.
    EXPECT_TRUE(BitwiseEqual(d->Download(), ToT<T>(want))) << rows << "x" << cols;
  }
}

TYPED_TEST(KernelTest, ColumnSumAccumulate) {
  using T = TypeParam;
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 129}, {1000, 1280}, {1000, 1283}, {32768, 72}, {3, 5}}) {
    const auto dout = RoundT<T>(Rand(rows * cols, 180));
    auto dbias = Rand(cols, 181);
    Dev<float> d_dbias(dbias);
    auto d_dout = DevT<T>(dout);
    DevScratch scratch(ColumnSumScratchBytes(rows, cols));
    ColumnSumAccumulate<T>(d_dbias.get(), d_dout->get(), rows, cols, scratch.get(), MainStream());
    this->cpu_->BiasBackward(dbias.data(), dout.data(), rows, cols);
    EXPECT_TRUE(Close(d_dbias.Download(), dbias, 1e-5)) << rows << "x" << cols;
  }
}

TYPED_TEST(KernelTest, EmbeddingAndPosition) {
  using T = TypeParam;
  for (int64_t cols : {129, 1280}) {
    SCOPED_TRACE(testing::Message() << "cols " << cols);
    const int64_t rows = 2000, vocab = 300, vb = 100, ve = 250;
    auto ids = RandInts(rows, 190, 0, vocab);
    for (int64_t r = 0; r < rows; r += 7) ids[r] = 123;  // a heavily repeated id
    const auto table = Rand((ve - vb) * cols, 191);
    std::vector<float> out(rows * cols);
    this->cpu_->EmbeddingForward(out.data(), ids.data(), table.data(), rows, cols, vb, ve);
    Dev<int32_t> d_ids(ids);
    Dev<float> d_table(table);
    Dev<T> d_out(rows * cols);
    EmbeddingForward<T>(d_out.get(), d_ids.get(), d_table.get(), rows, cols, vb, ve, MainStream());
    EXPECT_TRUE(BitwiseEqual(d_out.Download(), ToT<T>(out))) << "embedding forward";

    const auto dout = RoundT<T>(Rand(rows * cols, 192));
    auto dtable = Rand(table.size(), 193);
    Dev<float> d_dtable(dtable);
    auto d_dout = DevT<T>(dout);
    DevScratch scratch(EmbeddingBackwardScratchBytes(rows, cols));
    EmbeddingBackward<T>(d_dtable.get(), d_dout->get(), d_ids.get(), rows, cols, vb, ve,
                         scratch.get(), MainStream());
    this->cpu_->EmbeddingBackward(dtable.data(), dout.data(), ids.data(), rows, cols, vb, ve);
    EXPECT_TRUE(Close(d_dtable.Download(), dtable, 1e-5)) << "embedding backward";

    const int64_t seq = 64;
    std::vector<int32_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>((r * 7) % seq);
    const auto ptable = Rand(seq * cols, 194);
    const auto pout0 = RoundT<T>(Rand(rows * cols, 195));
    auto pout = pout0;
    this->cpu_->PositionForward(pout.data(), pos.data(), ptable.data(), rows, cols);
    Dev<int32_t> d_pos(pos);
    Dev<float> d_ptable(ptable);
    auto d_pout = DevT<T>(pout0);
    PositionForward<T>(d_pout->get(), d_pos.get(), d_ptable.get(), rows, cols, MainStream());
    EXPECT_TRUE(Close(DownF(*d_pout), pout, Tol<T>())) << "position forward";

    auto dptable = Rand(ptable.size(), 196);
    Dev<float> d_dptable(dptable);
    PositionBackward<T>(d_dptable.get(), d_dout->get(), d_pos.get(), rows, cols, scratch.get(),
                        MainStream());
    this->cpu_->PositionBackward(dptable.data(), dout.data(), pos.data(), rows, cols);
    EXPECT_TRUE(Close(d_dptable.Download(), dptable, 1e-5)) << "position backward";
  }
}

TYPED_TEST(KernelTest, CrossEntropyForwardBackward) {
  using T = TypeParam;
  for (int64_t vocab : {1280, 1283, 50304}) {
    for (float grad_scale : {0.0f, 0.25f}) {
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << " grad_scale " << grad_scale);
      const int64_t rows = vocab > 10000 ? 9 : 37;
      const auto logits = RoundT<T>(Rand(rows * vocab, 200, 3.0f));
      auto targets = RandInts(rows, 201, 0, static_cast<int32_t>(vocab));
      targets[0] = -1;
      targets[rows - 1] = -1;
      targets[1] = 0;
      targets[2] = static_cast<int32_t>(vocab - 1);
      std::vector<float> losses(rows), stats(2 * rows), dlogits(logits.size());
      this->cpu_->CrossEntropyForward(losses.data(), stats.data(), logits.data(), targets.data(),
                                      rows, vocab, 0, nullptr, nullptr);
      const std::vector<float> dlosses(rows, grad_scale);
      this->cpu_->CrossEntropyBackward(dlogits.data(), dlosses.data(), stats.data(), logits.data(),
                                       targets.data(), rows, vocab, 0);
      auto d_logits = DevT<T>(logits);
      Dev<int32_t> d_targets(targets);
      Dev<float> d_losses(rows);
      CrossEntropyForwardBackward<T>(d_losses.get(), d_logits->get(), d_targets.get(), rows, vocab,
                                     grad_scale, MainStream());
      EXPECT_TRUE(Close(d_losses.Download(), losses, 1e-5)) << "losses";
      if (grad_scale == 0.0f) {
        EXPECT_TRUE(BitwiseEqual(d_logits->Download(), ToT<T>(logits))) << "logits untouched";
      } else {
        // dlogits are small; compare each against its own magnitude plus a small floor.
        EXPECT_TRUE(Close(DownF(*d_logits), dlogits, Tol<T>(), 1e-7)) << "dlogits";
      }
    }
  }
}

// ================================================================ float-only kernels, determinism

TEST_F(GpuTest, AdamWKernel) {
  const size_t n = 4099;
  auto p = Rand(n, 210), g = Rand(n, 211, 0.1f), m = Rand(n, 212, 0.01f), v = Rand(n, 213, 1e-3f);
  for (float& x : v) x = std::abs(x);
  Dev<float> dp(p), dg(g), dm(m), dv(v);
  Dev<bf16> low(n + 1);  // poisoned: NaN
  // Into a bf16 copy at an odd offset (no vector stores), gradient scaled by 0.3.
  AdamW(dp.get(), dg.get(), dm.get(), dv.get(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 7, 0.3f,
        low.get() + 1, MainStream());
  cpu_->AdamWStep(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 7,
                  0.3f, nullptr);
  const std::vector<float> got = dp.Download();
  EXPECT_TRUE(Close(got, p, 1e-5));
  EXPECT_TRUE(Close(dm.Download(), m, 1e-5));
  EXPECT_TRUE(Close(dv.Download(), v, 1e-5));
  const std::vector<bf16> rounded = low.Download();
  EXPECT_TRUE(std::isnan(static_cast<float>(rounded[0])));  // untouched before the range
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(static_cast<float>(rounded[i + 1]), static_cast<float>(__float2bfloat16(got[i])))
        << i;
}

TEST_F(GpuTest, SumSquaresKernelMatchesFloat64) {
  for (size_t n : {size_t{5}, size_t{3000017}}) {
    const auto x = Rand(n, 220, 3.0f);
    long double want = 0;
    for (float v : x) want += static_cast<long double>(v) * v;
    Dev<float> d(x);
    DevScratch scratch(SumSquaresScratchBytes(n));
    const double got = SumSquares(d.get(), n, scratch.get(), MainStream());
    EXPECT_NEAR(got, static_cast<double>(want), 1e-12 * static_cast<double>(want)) << n;
  }
}

TEST_F(GpuTest, ReductionsAreDeterministic) {
  // Each runs twice from the same state; the results must match bit for bit.
  {
    const int64_t rows = 4096, cols = 1280, vocab = 64;
    auto ids = RandInts(rows, 230, 0, vocab);
    const auto dout = ToT<bf16>(Rand(rows * cols, 231));
    Dev<int32_t> d_ids(ids);
    Dev<bf16> d_dout(dout);
    DevScratch scratch(EmbeddingBackwardScratchBytes(rows, cols));
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      Dev<float> dtable(std::vector<float>(vocab * cols, 0.5f));
      EmbeddingBackward<bf16>(dtable.get(), d_dout.get(), d_ids.get(), rows, cols, 0, vocab,
                              scratch.get(), MainStream());
      if (run == 0) {
        first = dtable.Download();
      } else {
        EXPECT_TRUE(BitwiseEqual(dtable.Download(), first)) << "EmbeddingBackward";
      }
    }
  }
  {
    const int64_t rows = 8192, cols = 1283;
    Dev<float> d_dout(Rand(rows * cols, 232));
    DevScratch scratch(ColumnSumScratchBytes(rows, cols));
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      Dev<float> dbias(std::vector<float>(cols, 0.0f));
      ColumnSumAccumulate<float>(dbias.get(), d_dout.get(), rows, cols, scratch.get(),
                                 MainStream());
      if (run == 0) {
        first = dbias.Download();
      } else {
        EXPECT_TRUE(BitwiseEqual(dbias.Download(), first)) << "ColumnSumAccumulate";
      }
    }
  }
  for (int64_t cols : {1280, 1283}) {  // cached and loop paths
    const int64_t rows = 3000;
    const auto x = Rand(rows * cols, 233);
    std::vector<float> mean(rows), rstd(rows), out(rows * cols);
    const auto w = Rand(cols, 234);
    cpu_->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), rows,
                           cols, 1e-5f);
    Dev<bf16> d_x(ToT<bf16>(x)), d_dout(ToT<bf16>(Rand(rows * cols, 235)));
    Dev<float> d_w(w), d_mean(mean), d_rstd(rstd);
    DevScratch scratch(LayerNormBackwardScratchBytes(rows, cols));
    std::vector<float> first_dw, first_db;
    std::vector<bf16> first_dx;
    for (int run = 0; run < 2; ++run) {
      Dev<bf16> dx(rows * cols);
      Dev<float> dw(std::vector<float>(cols, 0.0f)), db(std::vector<float>(cols, 0.0f));
      LayerNormBackward<bf16>(dx.get(), nullptr, dw.get(), db.get(), d_dout.get(), nullptr,
                              d_x.get(), d_w.get(), d_mean.get(), d_rstd.get(), rows, cols,
                              HiddenDropout{}, scratch.get(), MainStream());
      if (run == 0) {
        first_dw = dw.Download();
        first_db = db.Download();
        first_dx = dx.Download();
      } else {
        EXPECT_TRUE(BitwiseEqual(dw.Download(), first_dw)) << "LayerNormBackward dw " << cols;
        EXPECT_TRUE(BitwiseEqual(db.Download(), first_db)) << "LayerNormBackward db " << cols;
        EXPECT_TRUE(BitwiseEqual(dx.Download(), first_dx)) << "LayerNormBackward dx " << cols;
      }
    }
  }
  {
    const size_t n = 5000011;
    Dev<float> d(Rand(n, 236));
    DevScratch scratch(SumSquaresScratchBytes(n));
    const double a = SumSquares(d.get(), n, scratch.get(), MainStream());
    const double b = SumSquares(d.get(), n, scratch.get(), MainStream());
    EXPECT_EQ(std::memcmp(&a, &b, sizeof(double)), 0) << a << " vs " << b;
  }
}

}  // namespace
}  // namespace leantron::trainer::cuda
