// Data-parallel gradient reduction overlapped with the backward (--overlap-grad-reduce): the flat
// fp32 gradient is cut into buckets of consecutive layers; on the step's last micro-batch each
// bucket's all-reduce starts on a communication stream as soon as the backward has finished the
// lowest layer in it, while the backward goes on with the layers below. The compute stream waits
// for the last bucket only when the backward is done. The time it waits is the exposed part of the
// communication, measured with events and reported per step. Two data-parallel ranks of one node
// reduce by copy engine (PeerExchange: each rank sums one half and copies the other half back;
// LEANTRON_DP_COPY_ENGINE=0 uses NCCL), so the backward keeps every SM.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/peer_exchange.h"
#include "trainer/dist/nccl_comm.h"

namespace leantron::trainer::cuda {

class GradReducer {
 public:
  struct Bucket {
    size_t offset = 0, numel = 0;  // a contiguous range of the flat gradient
    int ready_after_layer = -1;    // launched after this layer's backward; -1: at the end
  };
  GradReducer(NcclCommunicator* dp, float* grad, std::vector<Bucket> buckets);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Buckets over `layer_ranges` (layer l's parameters are flat [first, second)), cut at about
  // `bucket_elements`, plus `end_ranges` (embeddings, final norm, output layer) reduced when the
  // backward is done.
  static std::vector<Bucket> Plan(const std::vector<std::pair<size_t, size_t>>& layer_ranges,
                                  const std::vector<std::pair<size_t, size_t>>& end_ranges,
                                  size_t bucket_elements);

  void BeginBackward(bool last_micro_batch) { active_ = last_micro_batch; }
  void LayerDone(int layer);
  void BackwardDone();
  // Milliseconds of the last step: all-reduce time on the communication stream, and how long the
  // compute stream had to wait for it after the backward (call after the step has finished).
  void LastStep(double* comm_ms, double* exposed_ms);

 private:
  void Launch(const Bucket& b);
  void CopyEngineAllReduce(float* data, size_t n);
  NcclCommunicator* dp_;
  float* grad_;
  std::vector<Bucket> buckets_;
  bool active_ = false;
  bool measured_ = false;
  cudaStream_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr, comm_start_ = nullptr, compute_done_ = nullptr,
              comm_done_ = nullptr;
  bool started_ = false;
  std::unique_ptr<PeerExchange> exchange_;
  // Elements reduced per copy-engine round (the inbox holds half of it twice: 64 MiB each).
  static constexpr size_t kPieceElements = size_t{32} << 20;
};

}  // namespace leantron::trainer::cuda
