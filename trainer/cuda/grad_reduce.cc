#include "trainer/cuda/grad_reduce.h"

#include <algorithm>
#include <cstdlib>

#include "trainer/cuda/kernels.h"

namespace leantron::trainer::cuda {

GradReducer::GradReducer(NcclCommunicator* dp, float* grad, std::vector<Bucket> buckets)
    : dp_(dp), grad_(grad), buckets_(std::move(buckets)) {
  int priority_low = 0, priority_high = 0;
  LT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&priority_low, &priority_high));
  LT_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, priority_high));
  for (cudaEvent_t* e : {&comm_start_, &compute_done_, &comm_done_})
    LT_CUDA_CHECK(cudaEventCreate(e));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  const char* ce = std::getenv("LEANTRON_DP_COPY_ENGINE");
  if (dp_->size() == 2 && (ce == nullptr || ce[0] != '0')) {
    exchange_ = PeerExchange::Create(dp_, (kPieceElements / 2 + 1) * sizeof(float));
  }
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
  if (exchange_ != nullptr) {
    CopyEngineAllReduce(grad_ + b.offset, b.numel);
  } else {
    dp_->AllReduce(grad_ + b.offset, b.numel, CommType::kF32, comm_);
  }
}

// Piece by piece: rank 0 owns the first half, rank 1 the second. Each sends the half it does not
// own, adds the peer's copy of its own half into it, sends the sum back and takes the peer's sum
// of the other half: every element is added once, so both ranks hold the same bits.
void GradReducer::CopyEngineAllReduce(float* data, size_t n) {
  const int rank = dp_->rank(), peer = 1 - rank;
  for (size_t begin = 0; begin < n; begin += kPieceElements) {
    const size_t count = std::min(kPieceElements, n - begin);
    const size_t half = count / 2;
    float* part[2] = {data + begin, data + begin + half};
    const size_t len[2] = {half, count - half};
    exchange_->Send(part[peer], len[peer] * sizeof(float), comm_);
    exchange_->Receive(
        [&](const void* inbox) {
          AddInPlace(part[rank], static_cast<const float*>(inbox), len[rank], comm_);
        },
        comm_);
    exchange_->Send(part[rank], len[rank] * sizeof(float), comm_);
    exchange_->WaitSent(comm_);  // the first send has left part[peer]
    exchange_->Receive(part[peer], len[peer] * sizeof(float), comm_);
  }
  exchange_->WaitSent(comm_);
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
