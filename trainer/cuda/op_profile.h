// GPU time of the bf16 model by category, from CUDA events (header-only; one user).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "trainer/cuda/cuda_util.h"

namespace leantron::trainer::cuda {

// GPU time by category, from CUDA events, summed when the next step begins (the optimizer step
// has synchronised by then). Always on at the coarse level (compute vs tensor-parallel
// communication, events only where the category changes), which feeds the per-rank report;
// `detailed` (--timing-log-level 2) times every op and prints the table when it goes. With
// `by_precision` (FP8 runs) the coarse level also keeps FP8 casts ("fp8 cast"), FP8 products (the
// other "fp8 ..." ops) and bf16 products ("matmul ...", "recompute") apart.
class OpProfile {
 public:
  explicit OpProfile(bool detailed, bool by_precision = false)
      : detailed_(detailed), by_precision_(by_precision) {}
  ~OpProfile() {
    Step();  // the last step's marks
    if (detailed_) {
      double total = 0;
      for (const auto& [name, ms] : totals_) total += ms;
      std::fprintf(stderr, "GPU time by op over %ld steps (%.1f ms per step):\n",
                   static_cast<long>(steps_), steps_ ? total / steps_ : 0.0);
      std::vector<std::pair<double, std::string>> rows;
      for (const auto& [name, ms] : totals_) rows.push_back({ms, name});
      std::sort(rows.rbegin(), rows.rend());
      for (const auto& [ms, name] : rows) {
        std::fprintf(stderr, "  %-34s %9.2f ms/step %6.1f%%\n", name.c_str(),
                     steps_ ? ms / steps_ : 0.0, total > 0 ? 100.0 * ms / total : 0.0);
      }
      double fp8 = 0, casts = 0, bf16 = 0;
      if (PrecisionAverages(&fp8, &casts, &bf16)) {
        std::fprintf(stderr,
                     "  products: FP8 %.2f ms/step, FP8 casts %.2f ms/step, bf16 %.2f ms/step\n",
                     fp8, casts, bf16);
      }
    }
    for (auto& e : pool_) cudaEventDestroy(e);
  }
  // Starts timing `name`; the next Begin or End closes it.
  void Begin(const char* name) {
    const bool comm = std::strstr(name, "communication") != nullptr;
    if (!detailed_) name = comm ? kComm : by_precision_ ? Precision(name) : kCompute;
    if (open_ != nullptr && std::strcmp(open_, name) == 0 && !detailed_) return;  // same span
    if (open_ != nullptr) End();
    open_ = name;
    marks_.push_back({name, Event(), nullptr});
    LT_CUDA_CHECK(cudaEventRecord(marks_.back().start, MainStream()));
  }
  void End() {
    if (open_ == nullptr) return;
    marks_.back().end = Event();
    LT_CUDA_CHECK(cudaEventRecord(marks_.back().end, MainStream()));
    open_ = nullptr;
  }
  void Step() {
    Collect(/*keep=*/steps_ >= 0);
    ++steps_;
  }
  // Per-step averages so far: tensor-parallel communication and everything else.
  bool Averages(double* compute_ms, double* comm_ms) const {
    if (steps_ <= 0) return false;
    double comm = 0, total = 0;
    for (const auto& [name, ms] : totals_) {
      total += ms;
      if (name.find("communication") != std::string::npos) comm += ms;
    }
    *compute_ms = (total - comm) / steps_;
    *comm_ms = comm / steps_;
    return true;
  }
  // Per-step averages of FP8 products, FP8 casts and bf16 products (by_precision or detailed).
  bool PrecisionAverages(double* fp8_products, double* fp8_casts, double* bf16_products) const {
    if (steps_ <= 0 || !(by_precision_ || detailed_)) return false;
    double sums[3] = {0, 0, 0};
    for (const auto& [name, ms] : totals_) {
      const char* p = Precision(name.c_str());
      if (p == kFp8Products) sums[0] += ms;
      if (p == kFp8Casts) sums[1] += ms;
      if (p == kBf16Products) sums[2] += ms;
    }
    *fp8_products = sums[0] / steps_;
    *fp8_casts = sums[1] / steps_;
    *bf16_products = sums[2] / steps_;
    return true;
  }

 private:
  static constexpr const char* kCompute = "compute";
  static constexpr const char* kComm = "tensor-parallel communication";
  static constexpr const char* kFp8Products = "fp8 products";
  static constexpr const char* kFp8Casts = "fp8 casts";
  static constexpr const char* kBf16Products = "bf16 products";
  static const char* Precision(const char* name) {
    auto starts = [name](const char* p) { return std::strncmp(name, p, std::strlen(p)) == 0; };
    if (starts("fp8 cast")) return kFp8Casts;
    if (starts("fp8 ")) return kFp8Products;
    if (starts("matmul") || starts("recompute") || starts(kBf16Products)) return kBf16Products;
    return kCompute;
  }
  struct Mark {
    const char* name;
    cudaEvent_t start, end;
  };
  cudaEvent_t Event() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      LT_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    return pool_[used_++];
  }
  void Collect(bool keep) {
    End();
    if (marks_.empty()) return;
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    for (const Mark& m : marks_) {
      if (!keep) break;
      float ms = 0;
      LT_CUDA_CHECK(cudaEventElapsedTime(&ms, m.start, m.end));
      totals_[m.name] += ms;
    }
    marks_.clear();
    used_ = 0;
  }
  bool detailed_, by_precision_;
  const char* open_ = nullptr;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<Mark> marks_;
  std::map<std::string, double> totals_;
  // The first step (kernel loading, matmul tuning) is left out: steps_ counts from -2.
  int64_t steps_ = -2;
};

}  // namespace leantron::trainer::cuda
