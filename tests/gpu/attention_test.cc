// FlashAttention (cuDNN SDPA, bf16) against the float32 cpu backend's attention on the same
// bf16-rounded inputs: forward output, softmax statistics (log-sum-exp), the qkv gradient, and
// bitwise repeatability of the backward. Outputs are poisoned with NaN bit patterns before every
// run, so an element the GPU does not write fails the comparison.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "trainer/cuda/nn/flash_attention.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer::cuda {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Host bf16 (round to nearest even; NaN stays NaN), independent of cuda_bf16's host paths.
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Random bf16 values N(0, 1)·scale: the bits for the GPU and the same values as float for the
// reference.
void RandomBf16(size_t n, float scale, std::mt19937_64& rng, std::vector<uint16_t>* bits,
                std::vector<float>* values) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  bits->resize(n);
  values->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*bits)[i] = ToBf16(normal(rng) * scale);
    (*values)[i] = FromBf16((*bits)[i]);
  }
}

std::vector<float> ToFloat(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = FromBf16(bits[i]);
  return out;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) LT_CUDA_CHECK(cudaMalloc(&ptr_, bytes_));
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  // Copies and fills are ordered on MainStream(), the stream the op runs on, and waited for.
  void Upload(const void* host) {
    LT_CUDA_CHECK(cudaMemcpyAsync(ptr_, host, bytes_, cudaMemcpyHostToDevice, MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  }
  void Poison() {  // 0xFF bytes: NaN as bf16 and as float
    LT_CUDA_CHECK(cudaMemsetAsync(ptr_, 0xFF, bytes_, MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  }
  void Download(void* host) const {
    LT_CUDA_CHECK(cudaMemcpyAsync(host, ptr_, bytes_, cudaMemcpyDeviceToHost, MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// |got − want| ≤ frac_of_max·max|want| + rel·|want| over the elements `in_set` selects (a NaN
// fails). Prints the worst element (largest error / tolerance) either way, so a passing run still
// shows the margin.
::testing::AssertionResult Close(const std::string& what, const std::vector<float>& got,
                                 const std::vector<float>& want,
                                 const std::function<bool(size_t)>& in_set,
                                 const std::function<std::string(size_t)>& where,
                                 double frac_of_max, double rel) {
  double max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (in_set(i)) max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  int64_t bad = 0, count = 0;
  size_t worst = 0;
  double worst_ratio = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!in_set(i)) continue;
    ++count;
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = frac_of_max * max_ref + rel * std::fabs(static_cast<double>(want[i]));
    const double ratio = std::isnan(err) ? INFINITY : (tol > 0 ? err / tol : (err > 0 ? 1e30 : 0));
    if (!(err <= tol)) ++bad;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  const std::string report =
      count == 0
          ? what + ": no elements"
          : what + ": " + std::to_string(bad) + " of " + std::to_string(count) +
                " out of tolerance; max|ref| " + std::to_string(max_ref) + "; worst err/tol " +
                std::to_string(worst_ratio) + " at " + where(worst) + ": got " +
                std::to_string(got[worst]) + ", want " + std::to_string(want[worst]);
  std::printf("  %s\n", report.c_str());
  if (count > 0 && bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << report;
}

struct Case {
  int64_t batch, seq, heads, head_dim;
  float scale;  // of the random qkv
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "B" + std::to_string(c.batch) + "_T" + std::to_string(c.seq) + "_H" +
         std::to_string(c.heads) + "_D" + std::to_string(c.head_dim);
}

class FlashAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttentionTest, MatchesCpuReferenceAndIsDeterministic) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  const int64_t B = c.batch, T = c.seq, H = c.heads, D = c.head_dim;
  const int64_t qkv_n = B * T * 3 * H * D, out_n = B * T * H * D, stats_n = B * H * T;

  std::mt19937_64 rng(0x5eed0000u + static_cast<uint64_t>(T * 131 + H * 7 + D));
  std::vector<uint16_t> qkv_bits, dout_bits;
  std::vector<float> qkv, dout;
  RandomBf16(qkv_n, c.scale, rng, &qkv_bits, &qkv);
  RandomBf16(out_n, 1.0f, rng, &dout_bits, &dout);

  // GPU.
  auto attn = FlashAttention::Create(B, T, H, H, D);
  ASSERT_TRUE(attn.ok()) << attn.status();
  FlashAttention& fa = **attn;
  std::printf("  workspace %zu bytes\n", fa.workspace_bytes());
  DeviceBuffer d_qkv(qkv_n * 2), d_dout(out_n * 2), d_out(out_n * 2), d_stats(stats_n * 4),
      d_dqkv(qkv_n * 2), d_ws(fa.workspace_bytes());
  void* ws = fa.workspace_bytes() > 0 ? d_ws.as<void>() : nullptr;
  d_qkv.Upload(qkv_bits.data());
  d_dout.Upload(dout_bits.data());

  d_out.Poison();
  d_stats.Poison();
  fa.Forward(d_out.as<bf16>(), d_stats.as<float>(), d_qkv.as<bf16>(), ws);
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  std::vector<uint16_t> out_bits(out_n);
  std::vector<float> stats(stats_n);
  d_out.Download(out_bits.data());
  d_stats.Download(stats.data());

  std::vector<uint16_t> dqkv_bits(qkv_n), dqkv_again(qkv_n);
  d_dqkv.Poison();
  fa.Backward(d_dqkv.as<bf16>(), d_dout.as<bf16>(), d_qkv.as<bf16>(), d_out.as<bf16>(),
              d_stats.as<float>(), ws);
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  d_dqkv.Download(dqkv_bits.data());
  d_dqkv.Poison();
  fa.Backward(d_dqkv.as<bf16>(), d_dout.as<bf16>(), d_qkv.as<bf16>(), d_out.as<bf16>(),
              d_stats.as<float>(), ws);
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  d_dqkv.Download(dqkv_again.data());

  // Reference: the cpu backend in float32 on the same (bf16-valued) inputs.
  auto cpu = CreateOps("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::vector<float> out_ref(out_n), probs(B * H * T * T), dqkv_ref(qkv_n);
  (*cpu)->AttentionForward(out_ref.data(), probs.data(), qkv.data(), B, T, H, H, D,
                           AttentionDropout{});
  (*cpu)->AttentionBackward(dqkv_ref.data(), dout.data(), qkv.data(), probs.data(), B, T, H, H, D,
                            AttentionDropout{});

  // Stats: natural-log log-sum-exp of the scaled scores s_ij = q_i·k_j/sqrt(D), j ≤ i. From the
  // reference softmax, lse_i = s_ij − ln p_ij for any j; the row's largest p keeps that exact.
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<float> lse_ref(stats_n);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const float* p = probs.data() + ((b * H + h) * T + i) * T;
        const int64_t j = std::max_element(p, p + i + 1) - p;
        const float* q = qkv.data() + (b * T + i) * 3 * H * D + h * 3 * D;
        const float* k = qkv.data() + (b * T + j) * 3 * H * D + h * 3 * D + D;
        double dot = 0;
        for (int64_t e = 0; e < D; ++e) dot += static_cast<double>(q[e]) * k[e];
        lse_ref[(b * H + h) * T + i] = static_cast<float>(dot * scale - std::log(p[j]));
      }

  auto all = [](size_t) { return true; };
  auto out_where = [&](size_t i) {
    const int64_t row = static_cast<int64_t>(i) / (H * D), col = static_cast<int64_t>(i) % (H * D);
    return "b=" + std::to_string(row / T) + " t=" + std::to_string(row % T) +
           " h=" + std::to_string(col / D) + " d=" + std::to_string(col % D);
  };
  auto stats_where = [&](size_t i) {
    const int64_t bh = static_cast<int64_t>(i) / T;
    return "b=" + std::to_string(bh / H) + " h=" + std::to_string(bh % H) +
           " t=" + std::to_string(static_cast<int64_t>(i) % T);
  };
  auto qkv_where = [&](size_t i) {
    static const char* kPart[] = {"q", "k", "v"};
    const int64_t row = static_cast<int64_t>(i) / (3 * H * D);
    const int64_t col = static_cast<int64_t>(i) % (3 * H * D);
    return std::string(kPart[(col % (3 * D)) / D]) + " b=" + std::to_string(row / T) +
           " t=" + std::to_string(row % T) + " h=" + std::to_string(col / (3 * D)) +
           " d=" + std::to_string(col % D);
  };

  EXPECT_TRUE(Close("out", ToFloat(out_bits), out_ref, all, out_where, 2e-2, 2e-2));
  EXPECT_TRUE(Close("stats", stats, lse_ref, all, stats_where, 1e-3, 1e-3));
  const std::vector<float> dqkv = ToFloat(dqkv_bits);
  for (int part = 0; part < 3; ++part) {
    auto in_part = [&](size_t i) { return (static_cast<int64_t>(i) % (3 * D)) / D == part; };
    EXPECT_TRUE(
        Close(std::string("d") + "qkv"[part], dqkv, dqkv_ref, in_part, qkv_where, 2e-2, 2e-2));
  }
  EXPECT_EQ(std::memcmp(dqkv_bits.data(), dqkv_again.data(), qkv_n * 2), 0)
      << "two backward runs on the same inputs differ";
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionTest,
                         ::testing::Values(Case{2, 129, 3, 64, 0.5f}, Case{1, 256, 2, 128, 0.75f},
                                           Case{4, 1024, 4, 64, 1.0f}),
                         CaseName);

TEST(FlashAttentionCreate, RejectsGroupedQueries) {
  // Checked before cuDNN is touched, so it needs no device.
  auto attn = FlashAttention::Create(1, 64, 4, 2, 64);
  ASSERT_FALSE(attn.ok());
  EXPECT_NE(attn.status().message().find("groups=2"), std::string::npos) << attn.status();
  EXPECT_FALSE(FlashAttentionSupported(64, 2, 4));
  EXPECT_TRUE(FlashAttentionSupported(64, 4, 4));
  EXPECT_FALSE(FlashAttentionSupported(36, 4, 4));
}

TEST(FlashAttentionCreate, ReportsUnsupportedHeadDim) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  // D = 36: not a multiple of 8 (and 3·D bf16 rows are not 16-byte aligned).
  auto attn = FlashAttention::Create(1, 64, 2, 2, 36);
  ASSERT_FALSE(attn.ok());
  EXPECT_NE(attn.status().message().find("head_dim=36"), std::string::npos) << attn.status();
  std::printf("  %s\n", std::string(attn.status().message()).c_str());
}

}  // namespace
}  // namespace leantron::trainer::cuda
