#include "trainer/core/host_adamw.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "libckpt/dtype.h"

namespace leantron::trainer {
namespace {
using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// One run of a piece: distinct arrays, so the compiler vectorises the update (sqrt and division
// included: rounded as the scalar operations are, so the bits do not change), at the widest
// vectors the host has (one clone per instruction set, picked when the program loads).
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void StepRun(
    const AdamWConstants c, const float* __restrict g, float* __restrict w, float* __restrict m,
    float* __restrict v, uint16_t* __restrict out, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    float p = w[j], mj = m[j], vj = v[j];
    AdamWElement(c, g[j], &p, &mj, &vj);
    w[j] = p;
    m[j] = mj;
    v[j] = vj;
    out[j] = ckpt::FloatToBFloat16(p);
  }
}

}  // namespace

HostAdamW::HostAdamW(ParamStore* params, size_t state_elements, int threads, size_t piece)
    : params_(params),
      ops_(params->ops()),
      exp_avg_(state_elements, 0.0f),
      exp_avg_sq_(state_elements, 0.0f),
      workers_(std::max(1, threads)),
      piece_(std::max<size_t>(1, piece)) {
  grad_stage_ = static_cast<float*>(ops_->AllocPinned(2 * piece_ * sizeof(float)));
  bf16_stage_ = static_cast<uint16_t*>(ops_->AllocPinned(2 * piece_ * sizeof(uint16_t)));
  conductor_ = std::thread([this] { Conduct(); });
}

HostAdamW::~HostAdamW() {
  Finish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  conductor_.join();
  ops_->FreePinned(grad_stage_);
  ops_->FreePinned(bf16_stage_);
}

void HostAdamW::Start(const std::vector<AdamRange>& ranges, const AdamWConstants& decay,
                      const AdamWConstants& no_decay) {
  // The step's copies start after the work issued so far, and not after the forward the caller
  // issues next (which waits for them).
  ops_->CopyFence();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (active_) {
      std::fprintf(stderr, "HostAdamW: a step started before the last one was finished\n");
      std::abort();
    }
    ranges_ = ranges;
    decay_ = decay;
    no_decay_ = no_decay;
    uploaded_to_ = ranges.empty() ? 0 : ranges.front().begin;  // the backend steps the rest
    upload_ticket_ = 0;
    pending_ = running_ = active_ = true;
  }
  wake_.notify_all();
}

void HostAdamW::WaitUploaded(size_t end) {
  uint64_t ticket = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!active_) return;
    if (running_ && uploaded_to_ < end) {
      const auto begin = Clock::now();
      progress_.wait(lock, [&] { return uploaded_to_ >= end || !running_; });
      waited_ms_ += Ms(begin, Clock::now());
    }
    ticket = upload_ticket_;
  }
  if (ticket != 0) ops_->ComputeAfterCopy(ticket);
}

bool HostAdamW::Finish() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!active_) return false;
    if (running_) {
      const auto begin = Clock::now();
      progress_.wait(lock, [&] { return !running_; });
      waited_ms_ += Ms(begin, Clock::now());
    }
    active_ = false;
  }
  ops_->ComputeAfterCopies();
  return true;
}

void HostAdamW::Step(const std::vector<AdamRange>& ranges, const AdamWConstants& decay,
                     const AdamWConstants& no_decay) {
  Start(ranges, decay, no_decay);
  Finish();
}

bool HostAdamW::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

void HostAdamW::Conduct() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || pending_; });
      if (stop_) return;
      pending_ = false;
    }
    Run();
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    progress_.notify_all();
  }
}

void HostAdamW::Run() {
  const std::vector<AdamRange>& ranges = ranges_;
  const AdamWConstants decay = decay_, no_decay = no_decay_;
  const auto start = Clock::now();
  double compute = 0.0;
  ops_->WaitCopy(last_up_);  // the last step's uploads read the host weights
  // Pieces of up to piece_ elements cut from runs of ranges that follow each other in the
  // buffers and in the moments (the decay groups alternate every few tensors; a piece steps each
  // group's part with its constants).
  struct Piece {
    size_t begin, end, state;
    size_t first;  // the first range it overlaps
  };
  std::vector<Piece> pieces;
  for (size_t r = 0; r < ranges.size();) {
    size_t q = r + 1;
    while (q < ranges.size() && ranges[q].begin == ranges[q - 1].end &&
           ranges[q].state == ranges[q - 1].state + (ranges[q - 1].end - ranges[q - 1].begin))
      ++q;
    size_t at = r;
    for (size_t b = ranges[r].begin; b < ranges[q - 1].end; b += piece_) {
      while (ranges[at].end <= b) ++at;
      pieces.push_back({b, std::min(ranges[q - 1].end, b + piece_),
                        ranges[at].state + (b - ranges[at].begin), at});
    }
    r = q;
  }
  const size_t grain = std::clamp<size_t>(piece_ / (4 * workers_.threads()), 1, size_t{1} << 16);
  const float* const grad = params_->grad();
  uint16_t* const low = params_->bf16_copy();
  uint64_t down[2] = {0, 0}, up[2] = {0, 0};
  bool up_pending[2] = {false, false};
  auto fetch = [&](size_t i) {
    const Piece& p = pieces[i];
    down[i % 2] = ops_->CopyToHostAsync(grad_stage_ + (i % 2) * piece_, grad + p.begin,
                                        (p.end - p.begin) * sizeof(float));
  };
  for (size_t i = 0; i < std::min<size_t>(2, pieces.size()); ++i) fetch(i);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const size_t slot = i % 2;
    ops_->WaitCopy(down[slot]);
    if (up_pending[slot]) ops_->WaitCopy(up[slot]);  // its bf16 stage is free again
    const float* g = grad_stage_ + slot * piece_;
    uint16_t* out = bf16_stage_ + slot * piece_;
    // A piece joins only ranges contiguous in the flat and the moments' order, which the
    // host's weights follow (one run, or this rank's parts packed): one run of them.
    float* w = params_->Master(p.begin);
    float* m = exp_avg_.data() + p.state;
    float* v = exp_avg_sq_.data() + p.state;
    const auto begin = Clock::now();
    workers_.ParallelFor(p.end - p.begin, grain, [&](size_t b, size_t e) {
      for (size_t r = p.first; r < ranges.size() && ranges[r].begin < p.begin + e; ++r) {
        const size_t lo = std::max(ranges[r].begin, p.begin + b);
        const size_t hi = std::min(ranges[r].end, p.begin + e);
        if (lo >= hi) continue;
        const size_t o = lo - p.begin;
        StepRun(ranges[r].decay ? decay : no_decay, g + o, w + o, m + o, v + o, out + o, hi - lo);
      }
    });
    compute += Ms(begin, Clock::now());
    if (low != nullptr) {
      up[slot] = ops_->CopyFromHostAsync(low + p.begin, out, (p.end - p.begin) * sizeof(uint16_t));
      up_pending[slot] = true;
      last_up_ = up[slot];
    }
    if (const uint64_t t = params_->RefreshMirror(p.begin, p.end); t != 0) last_up_ = t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      uploaded_to_ = p.end;
      upload_ticket_ = last_up_;
    }
    progress_.notify_all();
    if (i + 2 < pieces.size()) fetch(i + 2);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++steps_;
  step_ms_ += Ms(start, Clock::now());
  compute_ms_ += compute;
}

}  // namespace leantron::trainer
