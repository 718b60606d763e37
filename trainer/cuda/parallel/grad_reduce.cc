#include "trainer/cuda/parallel/grad_reduce.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/core/weight_buffers.h"
#include "trainer/cuda/kernels/kernels.h"

namespace leantron::trainer::cuda {

std::shared_ptr<cudaStream_t> DataParallelStream(NcclCommunicator* group) {
  static std::map<NcclCommunicator*, std::weak_ptr<cudaStream_t>> streams;
  if (std::shared_ptr<cudaStream_t> s = streams[group].lock()) return s;
  int priority_low = 0, priority_high = 0;
  LT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&priority_low, &priority_high));
  auto s = std::shared_ptr<cudaStream_t>(new cudaStream_t(nullptr), [](cudaStream_t* p) {
    cudaStreamSynchronize(*p);
    cudaStreamDestroy(*p);
    delete p;
  });
  LT_CUDA_CHECK(cudaStreamCreateWithPriority(s.get(), cudaStreamNonBlocking, priority_high));
  streams[group] = s;
  return s;
}

namespace {

// Rounds over a bucket's two parts (DpBucket::Part), runs of at most `run` elements: send(first,
// len) for a run of the part of rank `from`, then receive(first, len) for the same run of the
// other part (which the peer sends in that round).
template <typename Send, typename Receive>
void PartRounds(const DpBucket& b, int from, size_t run, Send&& send, Receive&& receive) {
  const auto [send_first, send_last] = b.Part(from, 2);
  const auto [recv_first, recv_last] = b.Part(1 - from, 2);
  const size_t sends = send_last - send_first, receives = recv_last - recv_first;
  for (size_t at = 0; at < std::max(sends, receives); at += run) {
    if (at < sends) send(send_first + at, std::min(run, sends - at));
    if (at < receives) receive(recv_first + at, std::min(run, receives - at));
  }
}

}  // namespace

GradReducer::GradReducer(NcclCommunicator* dp, float* grad, float* data, bf16* low,
                         std::vector<DpBucket> buckets, const Options& options)
    : dp_(dp), grad_(grad), data_(data), low_(low), buckets_(std::move(buckets)), opt_(options) {
  stream_ = DataParallelStream(dp_);
  comm_ = *stream_;
  for (cudaEvent_t* e : {&comm_start_, &compute_done_, &comm_done_})
    LT_CUDA_CHECK(cudaEventCreate(e));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  gathered_.resize(buckets_.size());
  for (cudaEvent_t& e : gathered_)
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  int layers = 0;
  for (const DpBucket& b : buckets_) layers = std::max(layers, b.last_layer + 1);
  layer_done_.resize(layers);
  bucket_begin_.resize(buckets_.size());
  bucket_end_.resize(buckets_.size());
  for (auto* v : {&layer_done_, &bucket_begin_, &bucket_end_})
    for (cudaEvent_t& e : *v) LT_CUDA_CHECK(cudaEventCreate(&e));
  launched_.assign(buckets_.size(), false);
  if (opt_.start_layer) start_layer_ = *opt_.start_layer;
  LT_CUDA_CHECK(cudaMalloc(&plan_buf_, sizeof(float)));
  gather_pending_.assign(buckets_.size(), false);
  if (opt_.reduce_in_bf16) {
    size_t largest = 0;
    for (const DpBucket& b : buckets_) largest = std::max(largest, b.numel);
    LT_CUDA_CHECK(cudaMalloc(&stage_, std::max<size_t>(largest, 1) * sizeof(bf16)));
  }
  if (opt_.sharded_grads != nullptr) {
    for (const DpBucket& b : buckets_) {
      const GradBuffers::Bucket* k = opt_.sharded_grads->Find(b.offset);
      if (k == nullptr || !opt_.distributed) {
        std::fprintf(stderr,
                     "GradReducer: sharded gradients need the distributed optimizer's parts of "
                     "these buckets\n");
        std::abort();
      }
      place_.push_back(k);
    }
    for (cudaEvent_t& e : slot_free_)
      LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  if (size() == 2 && opt_.copy_engine) {
    exchange_ = PeerExchange::Create(dp_, (kPieceElements / 2 + 1) * sizeof(float));
  }
}

GradReducer::~GradReducer() {
  cudaStreamSynchronize(comm_);
  for (cudaEvent_t e : {ready_, comm_start_, compute_done_, comm_done_}) cudaEventDestroy(e);
  for (auto* v : {&gathered_, &layer_done_, &bucket_begin_, &bucket_end_})
    for (cudaEvent_t e : *v) cudaEventDestroy(e);
  for (cudaEvent_t e : slot_free_)
    if (e != nullptr) cudaEventDestroy(e);
  if (stage_ != nullptr) cudaFree(stage_);
  cudaFree(plan_buf_);
}

void GradReducer::Launch(size_t bucket) {
  const DpBucket& b = buckets_[bucket];
  LT_CUDA_CHECK(cudaEventRecord(ready_, MainStream()));
  LT_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));
  if (!started_ && active_) {  // the step's last backward is measured
    LT_CUDA_CHECK(cudaEventRecord(comm_start_, comm_));
    started_ = true;
  }
  LT_CUDA_CHECK(cudaEventRecord(bucket_begin_[bucket], comm_));
  if (size() == 1) {  // sharded gradients on one rank: nothing to sum with
  } else if (exchange_ == nullptr) {
    NcclReduce(b);
  } else if (opt_.distributed) {
    CopyEngineReduceScatter(b);
  } else {
    CopyEngineAllReduce(b);
  }
  // A layer bucket in a slot: its part joins the step's sum, and the slot is free.
  if (const GradBuffers::Bucket* k = InSlot(bucket)) {
    if (k->part_end > k->part_begin)
      AddInPlace(k->sum, Grad(b, k->part_begin), k->part_end - k->part_begin, comm_);
    LT_CUDA_CHECK(cudaEventRecord(slot_free_[k->slot], comm_));
  }
  LT_CUDA_CHECK(cudaEventRecord(bucket_end_[bucket], comm_));
  launched_[bucket] = true;
}

// Before the backward writes into a layer bucket's slot (the one whose highest layer is `layer`,
// if any): the compute stream waits until the slot's last bucket has been summed, then zeroes it.
void GradReducer::PrepareSlot(int layer) {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const GradBuffers::Bucket* k = InSlot(i);
    if (k == nullptr || k->bucket.last_layer != layer) continue;
    LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), slot_free_[k->slot], 0));
    LT_CUDA_CHECK(cudaMemsetAsync(k->at, 0, k->bucket.numel * sizeof(float), MainStream()));
  }
}

void GradReducer::BackwardBegins() {
  active_ = ++backwards_ == opt_.num_micro_batches;
  // The chunk's highest layer bucket comes first in the backward's order.
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (InSlot(i) == nullptr) continue;
    PrepareSlot(buckets_[i].last_layer);
    break;
  }
}

// All-reduce, or reduce-scatter into parts of unequal length: one reduce per part, rooted at its
// owner. In bf16 through the staging copy, converted back where the sum is kept.
void GradReducer::NcclReduce(const DpBucket& b) {
  const int rank = dp_->rank(), size = dp_->size();
  const bool low = opt_.reduce_in_bf16;
  float* const g = Grad(b, b.offset);
  if (low) ConvertFromFloat<bf16>(stage_, g, b.numel, comm_);
  if (!opt_.distributed) {
    if (low) {
      dp_->AllReduce(stage_, b.numel, CommType::kBF16, comm_);
      ConvertToFloat(g, stage_, b.numel, comm_);
    } else {
      dp_->AllReduce(g, b.numel, CommType::kF32, comm_);
    }
    return;
  }
  dp_->Enqueue("ReduceScatter", comm_, [&](ncclComm_t c) {
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < size && r == ncclSuccess; ++q) {
      const auto [first, last] = b.Part(q, size);
      if (first >= last) continue;
      r = low ? ncclReduce(Stage(first, b), Stage(first, b), last - first, ncclBfloat16, ncclSum, q,
                           c, comm_)
              : ncclReduce(Grad(b, first), Grad(b, first), last - first, ncclFloat32, ncclSum, q, c,
                           comm_);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
  const auto [first, last] = b.Part(rank, size);
  if (low && first < last) ConvertToFloat(Grad(b, first), Stage(first, b), last - first, comm_);
}

// Sends grad[first, first + len) to the peer's inbox: as it is, or rounded to bf16 through the
// staging copy when reducing in bf16.
void GradReducer::SendGrad(const DpBucket& b, size_t first, size_t len) {
  if (!opt_.reduce_in_bf16) return exchange_->Send(Grad(b, first), len * sizeof(float), comm_);
  ConvertFromFloat<bf16>(Stage(first, b), Grad(b, first), len, comm_);
  exchange_->Send(Stage(first, b), len * sizeof(bf16), comm_);
}

// Adds the peer's copy of grad[first, first + len), when it arrives, into this rank's; in bf16
// the rounded sum also goes to the staging copy when `stage_sum` (to be sent back).
void GradReducer::AddArrived(const DpBucket& b, size_t first, size_t len, bool stage_sum) {
  exchange_->Receive(
      [&](const void* inbox) {
        if (opt_.reduce_in_bf16) {
          AddRoundedBf16(Grad(b, first), static_cast<const bf16*>(inbox),
                         stage_sum ? Stage(first, b) : nullptr, len, comm_);
        } else {
          AddInPlace(Grad(b, first), static_cast<const float*>(inbox), len, comm_);
        }
      },
      comm_);
}

// Piece by piece: rank 0 owns the first half, rank 1 the second. Each sends the half it does not
// own, adds the peer's copy of its own half into it, sends the sum back and takes the peer's sum
// of the other half: every element is added once, so both ranks hold the same bits. In bf16 the
// halves cross as their staged bf16 copies.
void GradReducer::CopyEngineAllReduce(const DpBucket& b) {
  const int rank = dp_->rank(), peer = 1 - rank;
  const bool low = opt_.reduce_in_bf16;
  for (size_t begin = b.offset; begin < b.offset + b.numel; begin += kPieceElements) {
    const size_t count = std::min(kPieceElements, b.offset + b.numel - begin);
    const size_t first[2] = {begin, begin + count / 2};
    const size_t len[2] = {count / 2, count - count / 2};
    SendGrad(b, first[peer], len[peer]);
    AddArrived(b, first[rank], len[rank], /*stage_sum=*/true);
    if (low) {
      exchange_->Send(Stage(first[rank], b), len[rank] * sizeof(bf16), comm_);
    } else {
      exchange_->Send(Grad(b, first[rank]), len[rank] * sizeof(float), comm_);
    }
    exchange_->WaitSent(comm_);  // the first send has left its source
    float* other = Grad(b, first[peer]);
    if (low) {
      exchange_->Receive(
          [&](const void* inbox) {
            ConvertToFloat(other, static_cast<const bf16*>(inbox), len[peer], comm_);
          },
          comm_);
    } else {
      exchange_->Receive(other, len[peer] * sizeof(float), comm_);
    }
  }
  exchange_->WaitSent(comm_);
}

// The bucket's two parts (DpBucket::Part) in rounds of half a piece: send a run of the peer's
// part, add the peer's run of this rank's part into it. Nothing is sent back.
void GradReducer::CopyEngineReduceScatter(const DpBucket& b) {
  PartRounds(
      b, 1 - dp_->rank(), kPieceElements / 2,
      [&](size_t first, size_t len) { SendGrad(b, first, len); },
      [&](size_t first, size_t len) { AddArrived(b, first, len, /*stage_sum=*/false); });
  exchange_->WaitSent(comm_);
}

// The backward has finished `layer` and those above it: their buckets start unless held back
// until the start layer, in the buckets' (the backward's) order.
void GradReducer::LayerBackwardDone(int layer) {
  if (!place_.empty()) {
    // Sharded gradients: every micro-batch's layer buckets go at once (their slots are needed
    // again two buckets later), and the next bucket's slot is made ready.
    for (size_t i = 0; i < buckets_.size(); ++i)
      if (InSlot(i) != nullptr && !launched_[i] && buckets_[i].first_layer == layer) Launch(i);
    PrepareSlot(layer - 1);
    return;
  }
  if (!active_ || !opt_.overlap_grad_reduce) return;
  if (layer >= 0 && layer < static_cast<int>(layer_done_.size())) {
    LT_CUDA_CHECK(cudaEventRecord(layer_done_[layer], MainStream()));
    ++layers_recorded_;
  }
  if (start_layer_ >= 0 && layer > start_layer_) return;
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (!launched_[i] && buckets_[i].first_layer >= 0 && buckets_[i].first_layer >= layer)
      Launch(i);
}

void GradReducer::BackwardDone() {
  if (!active_) {
    if (!place_.empty()) launched_.assign(buckets_.size(), false);  // the slots' buckets went
    return;
  }
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (!launched_[i]) Launch(i);
  LT_CUDA_CHECK(cudaEventRecord(compute_done_, MainStream()));
  LT_CUDA_CHECK(cudaEventRecord(comm_done_, comm_));
  LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), comm_done_, 0));
  launched_.assign(buckets_.size(), false);
  active_ = false;
  started_ = false;
  measured_ = true;
}

void GradReducer::StepBegins() {
  if (measured_) {
    double comm = 0, exposed = 0;
    LastStep(&comm, &exposed);
    if (comm > 0) {
      comm_ms_ += comm;
      exposed_ms_ += exposed;
      ++measured_steps_;
    }
  }
  backwards_ = 0;
  if (params_ != nullptr && params_->weights_version() != weights_seen_) {
    // Stepped (not rewritten) since: every rank holds only its parts.
    if (params_->weights_rewritten() <= weights_seen_) GatherParams();
    weights_seen_ = params_->weights_version();
  }
}

std::string GradReducer::Report() const {
  if (measured_steps_ == 0) return {};
  const std::string held =
      start_layer_ < 0
          ? ""
          : absl::StrFormat(", started once layer %d was done (%.0f ms of the backward left)",
                            opt_.first_layer + start_layer_, start_left_ms_);
  if (!place_.empty()) {
    return absl::StrFormat(
        "sharded gradients (%s): each micro-batch's layer buckets %s as its backward "
        "finishes them; the last micro-batch's %.1f ms from the first bucket to the last, %.1f ms "
        "of it exposed (the backward had finished)%s",
        params_ != nullptr && params_->weights() != nullptr ? "optim_grads_params" : "optim_grads",
        size() == 1           ? "added to the step's sums (one data-parallel rank)"
        : opt_.reduce_in_bf16 ? "reduce-scattered in bf16"
                              : "reduce-scattered",
        comm_ms_ / measured_steps_, exposed_ms_ / measured_steps_,
        size() == 1 ? "" : absl::StrCat("; by ", transport()));
  }
  return absl::StrFormat(
      "data-parallel gradient %s%s %s: %.1f ms per step from the first bucket to the last, %.1f "
      "ms of it exposed (the backward had finished)%s; by %s",
      opt_.distributed ? "reduce-scatter" : "all-reduce", opt_.reduce_in_bf16 ? " in bf16" : "",
      opt_.overlap_grad_reduce ? "overlapped with the backward" : "after the backward",
      comm_ms_ / measured_steps_, exposed_ms_ / measured_steps_, held, transport());
}

void GradReducer::LastStep(double* comm_ms, double* exposed_ms) {
  *comm_ms = *exposed_ms = 0.0;
  if (!measured_) return;
  measured_ = false;
  float total = 0.0f, exposed = 0.0f;
  LT_CUDA_CHECK(cudaEventSynchronize(comm_done_));
  LT_CUDA_CHECK(cudaEventElapsedTime(&total, comm_start_, comm_done_));
  LT_CUDA_CHECK(cudaEventElapsedTime(&exposed, compute_done_, comm_done_));
  *comm_ms = total;
  *exposed_ms = std::max(0.0f, exposed);
  Plan();
}

// The next step's start layer from the step just measured: the time left in the backward after
// each layer, and the layer buckets' time on the communication stream (collective over the
// data-parallel group).
void GradReducer::Plan() {
  const bool measured = layers_recorded_ == static_cast<int>(layer_done_.size());
  layers_recorded_ = 0;
  if (opt_.start_layer || !opt_.overlap_grad_reduce || !measured || !place_.empty() || size() == 1)
    return;
  double reduce = 0.0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i].first_layer < 0) continue;
    float ms = 0.0f;
    LT_CUDA_CHECK(cudaEventElapsedTime(&ms, bucket_begin_[i], bucket_end_[i]));
    reduce += ms;
  }
  // The least over the ranks: a rank that got to a bucket before its peer waited for the peer's
  // half inside that bucket's time, which is not the reduction's.
  float least = -static_cast<float>(reduce);
  LT_CUDA_CHECK(cudaMemcpyAsync(plan_buf_, &least, sizeof(float), cudaMemcpyHostToDevice, comm_));
  dp_->AllReduce(plan_buf_, 1, CommType::kF32, comm_, ReduceOp::kMax);
  LT_CUDA_CHECK(cudaMemcpyAsync(&least, plan_buf_, sizeof(float), cudaMemcpyDeviceToHost, comm_));
  LT_CUDA_CHECK(cudaStreamSynchronize(comm_));
  reduce = -least;
  std::vector<double> left(layer_done_.size());
  for (size_t l = 0; l < left.size(); ++l) {
    float ms = 0.0f;
    LT_CUDA_CHECK(cudaEventElapsedTime(&ms, layer_done_[l], compute_done_));
    left[l] = ms;
  }
  start_layer_ = DpReduceStartLayer(left, reduce);
  start_left_ms_ = start_layer_ >= 0 ? left[start_layer_] : 0.0;
}

// Each part goes from its owner to the others. With the fp32 weights whole on every rank, in
// fp32, and what arrives is rounded into the bf16 copy (which the owner's AdamW has already
// written for its own part). With them sharded (no `data`), the bf16 copy's part as it is, and in
// fp32 only where the model reads the weights in fp32 (the store's mirror: norms, embeddings).
void GradReducer::Gather(const DpBucket& b) {
  const int rank = dp_->rank(), size = this->size();
  if (data_ == nullptr) {
    if (params_ == nullptr || !params_->sharded()) {
      std::fprintf(stderr, "GradReducer: a gather without fp32 weights needs a sharded store\n");
      std::abort();
    }
    // With the weights sharded per layer (optim_grads_params) a layer bucket's bf16 parts are
    // gathered into its slot before each use (WeightGatherer), not here.
    const bool low = params_->weights() == nullptr || b.first_layer < 0;
    dp_->Enqueue("Broadcast", comm_, [&](ncclComm_t c) {
      ncclResult_t r = ncclGroupStart();
      for (int q = 0; q < size && r == ncclSuccess; ++q) {
        const auto [first, last] = b.Part(q, size);
        if (first >= last) continue;
        if (low) {
          uint16_t* at = params_->Bf16At(first);
          r = ncclBroadcast(at, at, last - first, ncclBfloat16, q, c, comm_);
        }
        for (const ParamView& v : params_->views()) {
          const size_t vb = std::max(first, v.offset), ve = std::min(last, v.offset + v.numel);
          if (r != ncclSuccess || vb >= ve || v.mirror == ParamView::kNoMirror) continue;
          float* m = params_->MirrorAt(vb);
          r = ncclBroadcast(m, m, ve - vb, ncclFloat32, q, c, comm_);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
    return;
  }
  if (exchange_ != nullptr) {
    PartRounds(
        b, rank, kPieceElements / 2,
        [&](size_t first, size_t len) {
          exchange_->Send(data_ + first, len * sizeof(float), comm_);
        },
        [&](size_t first, size_t len) {
          exchange_->Receive(data_ + first, len * sizeof(float), comm_);
          ConvertFromFloat<bf16>(low_ + first, data_ + first, len, comm_);
        });
    exchange_->WaitSent(comm_);
    return;
  }
  dp_->Enqueue("Broadcast", comm_, [&](ncclComm_t c) {
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < size && r == ncclSuccess; ++q) {
      const auto [first, last] = b.Part(q, size);
      if (first < last)
        r = ncclBroadcast(data_ + first, data_ + first, last - first, ncclFloat32, q, c, comm_);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
  for (int q = 0; q < size; ++q) {
    const auto [first, last] = b.Part(q, size);
    if (q != rank && first < last)
      ConvertFromFloat<bf16>(low_ + first, data_ + first, last - first, comm_);
  }
}

void GradReducer::GatherParams() {
  if (!opt_.distributed || size() == 1) return;
  LT_CUDA_CHECK(cudaEventRecord(ready_, MainStream()));
  LT_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_, 0));
  // The forward's order: the embeddings (and head) first, then the layers from the lowest up.
  std::vector<size_t> order(buckets_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = buckets_[a].first_layer, lb = buckets_[b].first_layer;
    return la < lb;  // -1 (embeddings, head) first
  });
  for (size_t i : order) {
    Gather(buckets_[i]);
    LT_CUDA_CHECK(cudaEventRecord(gathered_[i], comm_));
    gather_pending_[i] = true;
  }
  if (!opt_.overlap_param_gather) {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), gathered_[i], 0));
      gather_pending_[i] = false;
    }
  }
}

void GradReducer::WaitParams(int layer) {
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (!gather_pending_[i]) continue;
    const DpBucket& b = buckets_[i];
    const bool needed = layer < 0
                            ? b.first_layer < 0
                            : b.first_layer >= 0 && b.first_layer <= layer && layer <= b.last_layer;
    if (!needed) continue;
    LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), gathered_[i], 0));
    gather_pending_[i] = false;
  }
}

}  // namespace leantron::trainer::cuda
