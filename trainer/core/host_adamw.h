// --optimizer-cpu-offload: AdamW on the host. The fp32 weights (ParamStore with host_master) and
// the Adam moments stay in host memory; each step the gradients come down from the backend in
// pieces, the host threads step a piece while the next one comes down and the previous one's
// bf16 weights (and fp32 mirror, for the tensors the model reads in fp32) go up, both directions
// on their own copy streams beside the computation. The update is core/adamw.h's, so the weights
// are bit for bit those of the backend's AdamW.
//
// A step runs on a host thread of its own (Start), so the caller can go on issuing the next
// forward meanwhile: the pieces go in flat order (the order the forward reads the weights in),
// and WaitUploaded makes backend work wait for the weights up to a point only.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
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
  // Moments for `state_elements`; `threads` host threads step (the step's own thread among
  // them); the gradients come down `piece` elements at a time.
  HostAdamW(ParamStore* params, size_t state_elements, int threads, size_t piece = kPiece);
  ~HostAdamW();  // finishes an active step first
  HostAdamW(const HostAdamW&) = delete;
  HostAdamW& operator=(const HostAdamW&) = delete;

  float* exp_avg() { return exp_avg_.data(); }
  float* exp_avg_sq() { return exp_avg_sq_.data(); }
  // Starts one step over `ranges` (in flat order, covering [begin, size) of the buffers with no
  // gap: the host's part, ParamStore::host_begin(); their moments from 0)
  // with the decaying and non-decaying constants, after the backend work issued so far (the
  // gradients' computation, the last reads of the bf16 copy), and returns at once. The previous
  // step must be finished.
  void Start(const std::vector<AdamRange>& ranges, const AdamWConstants& decay,
             const AdamWConstants& no_decay);
  // Makes backend work issued later wait for the new weights in [0, end) of the buffers (those
  // before the host's part are not its to wait for): blocks the calling thread until the step has
  // queued their uploads. Nothing to do when no step is active (started and not finished).
  void WaitUploaded(size_t end);
  // Blocks until the step started last has stepped everything and queued every upload, and
  // makes backend work issued later wait for them; false when every step was finished already.
  bool Finish();
  // Start and Finish.
  void Step(const std::vector<AdamRange>& ranges, const AdamWConstants& decay,
            const AdamWConstants& no_decay);
  // A step was started and not finished.
  bool active() const;
  int threads() const { return workers_.threads(); }
  // Means over the steps so far: a step's wall time (from its start to its last upload queued),
  // the stepping inside it, and how long callers blocked for it (WaitUploaded and Finish).
  double step_ms() const { return steps_ > 0 ? step_ms_ / steps_ : 0.0; }
  double compute_ms() const { return steps_ > 0 ? compute_ms_ / steps_ : 0.0; }
  double waited_ms() const { return steps_ > 0 ? waited_ms_ / steps_ : 0.0; }

  // Elements moved per piece by default (64 MiB of fp32 gradient).
  static constexpr size_t kPiece = size_t{16} << 20;

 private:
  void Conduct();  // the step's thread
  void Run();      // one step

  ParamStore* params_;
  Ops* ops_;
  std::vector<float> exp_avg_, exp_avg_sq_;
  HostWorkers workers_;
  size_t piece_;
  float* grad_stage_ = nullptr;     // pinned, 2 × piece_
  uint16_t* bf16_stage_ = nullptr;  // pinned, 2 × piece_
  uint64_t last_up_ = 0;            // the latest upload's ticket (the step's thread)

  // The step handed to the thread, and how far it has got.
  mutable std::mutex mu_;
  std::condition_variable wake_, progress_;
  std::vector<AdamRange> ranges_;
  AdamWConstants decay_{}, no_decay_{};
  bool pending_ = false;  // handed over, not picked up yet
  bool running_ = false;  // the step's thread is on it
  bool active_ = false;   // started and not finished (Finish)
  bool stop_ = false;
  size_t uploaded_to_ = 0;      // [0, uploaded_to_) of the buffers has its uploads queued
  uint64_t upload_ticket_ = 0;  // the last of them
  std::thread conductor_;

  int64_t steps_ = 0;
  double step_ms_ = 0.0, compute_ms_ = 0.0, waited_ms_ = 0.0;
};

}  // namespace leantron::trainer
