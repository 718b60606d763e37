#include "trainer/cuda/parallel/weight_gather.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "trainer/cuda/parallel/grad_reduce.h"

namespace leantron::trainer::cuda {

WeightGatherer::WeightGatherer(NcclCommunicator* dp, const ParamStore* params,
                               const std::vector<DpBucket>& buckets)
    : dp_(dp), params_(params), weights_(params->weights()) {
  if (weights_ == nullptr || weights_->element_bytes() != sizeof(bf16)) {
    std::fprintf(stderr, "WeightGatherer: the bf16 copy is not kept as WeightBuffers\n");
    std::abort();
  }
  for (const SlotLayout::Place* k : weights_->layout().PlacesOf(buckets, "WeightGatherer"))
    if (k->slot >= 0) buckets_.push_back(k);
  stream_ = DataParallelStream(dp_);
  comm_ = *stream_;
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  gathered_.resize(buckets_.size());
  for (cudaEvent_t& e : gathered_)
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (cudaEvent_t& e : free_) LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

WeightGatherer::~WeightGatherer() {
  cudaStreamSynchronize(comm_);
  cudaEventDestroy(ready_);
  for (cudaEvent_t e : gathered_) cudaEventDestroy(e);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

int WeightGatherer::BucketOf(int layer) const {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const DpBucket& b = buckets_[i]->bucket;
    if (b.first_layer <= layer && layer <= b.last_layer) return static_cast<int>(i);
  }
  std::fprintf(stderr, "WeightGatherer: no layer bucket holds chunk layer %d\n", layer);
  std::abort();
}

int WeightGatherer::Next(int i) const {
  const int n = static_cast<int>(buckets_.size());
  if (i < 0) return n == 0 ? -1 : forward_ ? n - 1 : 0;  // the pass's first
  const int next = forward_ ? i - 1 : i + 1;
  return next >= 0 && next < n ? next : -1;
}

void WeightGatherer::StepBegins() {
  if (params_->weights_version() == weights_seen_) return;
  weights_seen_ = params_->weights_version();
  for (int& h : held_) h = -1;
  // The gathers read the parts the step (or a rewrite) wrote on the compute stream.
  LT_CUDA_CHECK(cudaEventRecord(ready_, MainStream()));
  LT_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));
}

void WeightGatherer::Gather(int i) {
  const SlotLayout::Place& k = *buckets_[i];
  const DpBucket& b = k.bucket;
  const int slot = k.slot;
  // The slot's previous bucket has been used for the last time (nothing before the first use).
  LT_CUDA_CHECK(cudaStreamWaitEvent(comm_, free_[slot], 0));
  bf16* at = weights_->At<bf16>(b.offset);
  if (size() == 1) {
    if (k.part_end > k.part_begin)
      LT_CUDA_CHECK(cudaMemcpyAsync(at, weights_->Owned<bf16>(k.part_begin),
                                    (k.part_end - k.part_begin) * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, comm_));
  } else {
    const int rank = dp_->rank(), ranks = dp_->size();
    dp_->Enqueue("Broadcast", comm_, [&](ncclComm_t c) {
      ncclResult_t r = ncclGroupStart();
      for (int q = 0; q < ranks && r == ncclSuccess; ++q) {
        const auto [first, last] = b.Part(q, ranks);
        if (first >= last) continue;
        const bf16* send = q == rank ? weights_->Owned<bf16>(first) : at + (first - b.offset);
        r = ncclBroadcast(send, at + (first - b.offset), last - first, ncclBfloat16, q, c, comm_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
  LT_CUDA_CHECK(cudaEventRecord(gathered_[i], comm_));
  held_[slot] = i;
  ++gathers_;
}

// Bucket `i` gets its slot's turn unless the pass is using the slot (its bucket is still taken).
void WeightGatherer::Prefetch(int i) {
  if (i < 0) return;
  const int slot = buckets_[i]->slot;
  if (held_[slot] == i || taken_[slot]) return;
  Gather(i);
}

void WeightGatherer::Take(int i) {
  if (i == current_) return;
  const int slot = buckets_[i]->slot;
  if (held_[slot] != i) {
    if (taken_[slot]) {
      std::fprintf(stderr, "WeightGatherer: bucket %d needs a slot still in use\n", i);
      std::abort();
    }
    Gather(i);
  }
  LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), gathered_[i], 0));
  taken_[slot] = true;
  current_ = i;
  Prefetch(Next(i));
}

void WeightGatherer::Leave(int i) {
  const int slot = buckets_[i]->slot;
  if (held_[slot] != i) return;
  LT_CUDA_CHECK(cudaEventRecord(free_[slot], MainStream()));
  taken_[slot] = false;
  Prefetch(Next(current_));
}

void WeightGatherer::WeightsNeeded(int layer) {
  if (buckets_.empty()) return;
  if (layer < 0) {  // a forward begins: its first bucket goes beside the embeddings
    ++passes_;
    forward_ = true;
    current_ = -1;
    for (bool& t : taken_) t = false;
    Prefetch(Next(-1));
    return;
  }
  Take(BucketOf(layer));
}

void WeightGatherer::LayerForwardDone(int layer) {
  const int i = BucketOf(layer);
  if (layer == buckets_[i]->bucket.last_layer) Leave(i);
}

void WeightGatherer::BackwardBegins() {
  if (buckets_.empty()) return;
  ++passes_;
  forward_ = false;
  current_ = -1;
  for (bool& t : taken_) t = false;
  Prefetch(Next(-1));  // beside the head's backward
}

void WeightGatherer::LayerBackwardBegins(int layer) { Take(BucketOf(layer)); }

void WeightGatherer::LayerBackwardDone(int layer) {
  const int i = BucketOf(layer);
  if (layer == buckets_[i]->bucket.first_layer) Leave(i);
}

std::string WeightGatherer::Report() const {
  if (passes_ == 0) return {};
  return absl::StrFormat(
      "sharded weights (optim_grads_params): %zu layer buckets' bf16 weights gathered into %d "
      "slot%s before use, %.1f gathers per pass (forward or backward)%s",
      buckets_.size(), std::min<int>(SlotLayout::kSlots, static_cast<int>(buckets_.size())),
      buckets_.size() > 1 ? "s" : "", static_cast<double>(gathers_) / static_cast<double>(passes_),
      size() == 1 ? " (one data-parallel rank: copied from its parts)" : "");
}

}  // namespace leantron::trainer::cuda
