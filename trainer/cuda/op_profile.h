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
// `detailed` (--timing-log-level 2) times every op and prints the table when it goes.
class OpProfile {
 public:
  explicit OpProfile(bool detailed) : detailed_(detailed) {}
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
        std::fprintf(stderr, "  %-30s %9.2f ms/step %6.1f%%\n", name.c_str(),
                     steps_ ? ms / steps_ : 0.0, total > 0 ? 100.0 * ms / total : 0.0);
      }
    }
    for (auto& e : pool_) cudaEventDestroy(e);
  }
  // Starts timing `name`; the next Begin or End closes it.
  void Begin(const char* name) {
    const bool comm = std::strstr(name, "communication") != nullptr;
    if (!detailed_) name = comm ? kComm : kCompute;
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

 private:
  static constexpr const char* kCompute = "compute";
  static constexpr const char* kComm = "tensor-parallel communication";
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
  bool detailed_;
  const char* open_ = nullptr;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<Mark> marks_;
  std::map<std::string, double> totals_;
  // The first step (kernel loading, matmul tuning) is left out: steps_ counts from -2.
  int64_t steps_ = -2;
};

}  // namespace leantron::trainer::cuda
