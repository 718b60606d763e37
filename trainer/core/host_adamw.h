// --optimizer-cpu-offload: AdamW on the host. The fp32 weights (ParamStore with host_master) and
// the Adam moments stay in host memory; each step the gradients come down from the backend in
// pieces, the host threads step a piece while the next one comes down and the previous one's
// bf16 weights (and fp32 mirror, for the tensors the model reads in fp32) go up, both directions
// on their own copy streams beside the computation. The update is core/adamw.h's, so the weights
// are bit for bit those of the backend's AdamW.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainer/core/adamw.h"
#include "trainer/core/host_workers.h"
#include "trainer/core/params.h"

namespace leantron::trainer {

// A flat range the optimizer steps: [begin, end) of the buffers, its moments from `state`.
struct AdamRange {
  size_t begin, end, state;
  bool decay;
};

class HostAdamW {
 public:
  // Moments for `state_elements`; `threads` host threads step (the caller's among them); the
  // gradients come down `piece` elements at a time.
  HostAdamW(ParamStore* params, size_t state_elements, int threads, size_t piece = kPiece);
  ~HostAdamW();
  HostAdamW(const HostAdamW&) = delete;
  HostAdamW& operator=(const HostAdamW&) = delete;

  float* exp_avg() { return exp_avg_.data(); }
  float* exp_avg_sq() { return exp_avg_sq_.data(); }
  // One step over `ranges` (in flat order) with the decaying and non-decaying constants; returns
  // when the host weights are stepped, with the uploads queued before any later backend work.
  void Step(const std::vector<AdamRange>& ranges, const AdamWConstants& decay,
            const AdamWConstants& no_decay);
  int threads() const { return workers_.threads(); }
  // Means over the steps so far (host clock): Step's wall time, and the stepping inside it.
  double step_ms() const { return steps_ > 0 ? step_ms_ / steps_ : 0.0; }
  double compute_ms() const { return steps_ > 0 ? compute_ms_ / steps_ : 0.0; }

  // Elements moved per piece by default (64 MiB of fp32 gradient).
  static constexpr size_t kPiece = size_t{16} << 20;

 private:
  ParamStore* params_;
  Ops* ops_;
  std::vector<float> exp_avg_, exp_avg_sq_;
  HostWorkers workers_;
  size_t piece_;
  float* grad_stage_ = nullptr;     // pinned, 2 × kPiece
  uint16_t* bf16_stage_ = nullptr;  // pinned, 2 × kPiece
  uint64_t last_up_ = 0;            // the latest upload's ticket
  int64_t steps_ = 0;
  double step_ms_ = 0.0, compute_ms_ = 0.0;
};

}  // namespace leantron::trainer
