#include "trainer/cuda/grad_reduce.h"

#include <algorithm>

namespace leantron::trainer::cuda {

GradReducer::GradReducer(NcclCommunicator* dp, float* grad, std::vector<Bucket> buckets)
    : dp_(dp), grad_(grad), buckets_(std::move(buckets)) {
  int priority_low = 0, priority_high = 0;
  LT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&priority_low, &priority_high));
  LT_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, priority_high));
  for (cudaEvent_t* e : {&comm_start_, &compute_done_, &comm_done_})
    LT_CUDA_CHECK(cudaEventCreate(e));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
}

GradReducer::~GradReducer() {
  cudaStreamSynchronize(comm_);
  for (cudaEvent_t e : {ready_, comm_start_, compute_done_, comm_done_}) cudaEventDestroy(e);
  cudaStreamDestroy(comm_);
}

std::vector<GradReducer::Bucket> GradReducer::Plan(
    const std::vector<std::pair<size_t, size_t>>& layer_ranges,
    const std::vector<std::pair<size_t, size_t>>& end_ranges, size_t bucket_elements) {
  std::vector<Bucket> out;
  // From the last layer down (the backward's order), merging neighbours up to the bucket size.
  Bucket cur;
  for (int l = static_cast<int>(layer_ranges.size()) - 1; l >= 0; --l) {
    const auto [first, last] = layer_ranges[l];
    if (first >= last) continue;
    if (cur.numel > 0 && cur.offset != last) {  // not adjacent: close the open bucket
      out.push_back(cur);
      cur = Bucket{};
    }
    cur.numel = cur.numel == 0 ? last - first : cur.numel + (cur.offset - first);
    cur.offset = first;
    cur.ready_after_layer = l;
    if (cur.numel >= bucket_elements) {
      out.push_back(cur);
      cur = Bucket{};
    }
  }
  if (cur.numel > 0) out.push_back(cur);
  std::vector<std::pair<size_t, size_t>> rest(end_ranges);
  std::sort(rest.begin(), rest.end());
  for (const auto& [first, last] : rest) {
    if (!out.empty() && out.back().ready_after_layer < 0 &&
        out.back().offset + out.back().numel == first) {
      out.back().numel += last - first;
    } else {
      out.push_back({first, last - first, -1});
    }
  }
  return out;
}

void GradReducer::Launch(const Bucket& b) {
  LT_CUDA_CHECK(cudaEventRecord(ready_, MainStream()));
  LT_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));
  if (!started_) {
    LT_CUDA_CHECK(cudaEventRecord(comm_start_, comm_));
    started_ = true;
  }
  dp_->AllReduce(grad_ + b.offset, b.numel, CommType::kF32, comm_);
}

void GradReducer::LayerDone(int layer) {
  if (!active_) return;
  for (const Bucket& b : buckets_)
    if (b.ready_after_layer == layer) Launch(b);
}

void GradReducer::BackwardDone() {
  if (!active_) return;
  for (const Bucket& b : buckets_)
    if (b.ready_after_layer < 0) Launch(b);
  LT_CUDA_CHECK(cudaEventRecord(compute_done_, MainStream()));
  LT_CUDA_CHECK(cudaEventRecord(comm_done_, comm_));
  LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), comm_done_, 0));
  active_ = false;
  started_ = false;
  measured_ = true;
}

void GradReducer::LastStep(double* comm_ms, double* exposed_ms) {
  *comm_ms = *exposed_ms = 0.0;
  if (!measured_) return;
  float total = 0.0f, exposed = 0.0f;
  LT_CUDA_CHECK(cudaEventSynchronize(comm_done_));
  LT_CUDA_CHECK(cudaEventElapsedTime(&total, comm_start_, comm_done_));
  LT_CUDA_CHECK(cudaEventElapsedTime(&exposed, compute_done_, comm_done_));
  *comm_ms = total;
  *exposed_ms = std::max(0.0f, exposed);
}

}  // namespace leantron::trainer::cuda
