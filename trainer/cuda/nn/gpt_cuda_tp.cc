// The bf16 model's tensor/sequence-parallel communication: collectives on their own stream,
// the ring all-gather that feeds each block's product as it arrives, the partial-sum exchange of
// the row-parallel products and the input-gradient reduction beside the weight gradient (by copy
// engine between GPUs of one node, PeerExchange; by NCCL otherwise).
#include <functional>

#include "trainer/cuda/nn/gpt_cuda_model.h"

namespace leantron::trainer::cuda::detail {

void BF16GptModel::TpFollowMain() {
  WaitTp();  // one TP collective at a time
  LT_CUDA_CHECK(cudaEventRecord(tp_main_ready_, MainStream()));
  LT_CUDA_CHECK(cudaStreamWaitEvent(tp_stream_, tp_main_ready_, 0));
  tp_pending_ = true;
}

void BF16GptModel::WaitTp() {
  if (!tp_pending_) return;
  tp_pending_ = false;
  prof_.Begin("tensor-parallel communication");
  LT_CUDA_CHECK(cudaEventRecord(tp_done_, tp_stream_));
  LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), tp_done_, 0));
}

void BF16GptModel::GatherRows(bf16* full) { GatherRowsFrom(LocalRows(full), full); }

void BF16GptModel::GatherRowsFrom(const bf16* local, bf16* full) {
  if (!sp_) return;
  TpFollowMain();
  tp_->AllGather(local, full, rows_l_ * h_, CommType::kBF16, tp_stream_);
  WaitTp();
}

void BF16GptModel::ReduceRows(bf16* full, bf16* local, bool wait) {
  if (tp_ == nullptr) {
    if (local != full)
      LT_CUDA_CHECK(cudaMemcpyAsync(local, full, rows_l_ * h_ * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, MainStream()));
    return;
  }
  TpFollowMain();
  if (sp_) {
    tp_->ReduceScatter(full, local, rows_l_ * h_, CommType::kBF16, tp_stream_);
  } else {
    tp_->AllReduce(full, n_ * h_, CommType::kBF16, tp_stream_);
    if (local != full)
      LT_CUDA_CHECK(cudaMemcpyAsync(local, full, n_ * h_ * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                    tp_stream_));
  }
  if (wait || !tp_overlap_) WaitTp();
}

const bf16* BF16GptModel::RowParallelForward(const char* op,
                                             const std::function<void(int64_t, int64_t)>& gemm) {
  prof_.Begin(op);
  if (branch_peer_ == nullptr || !tp_overlap_) {
    gemm(0, n_);
    ReduceRows(branch_, branch_l_);
    return nullptr;
  }
  const int peer = 1 - tp_rank_;
  const size_t count = static_cast<size_t>(rows_l_ * h_);
  gemm(peer * rows_l_, rows_l_);
  bf16* send = branch_ + peer * count;
  if (exchange_ != nullptr) {
    exchange_->Send(send, count * sizeof(bf16), MainStream());
    prof_.Begin(op);
    gemm(tp_rank_ * rows_l_, rows_l_);
    prof_.Begin("tensor-parallel communication");
    exchange_->Receive(branch_peer_, count * sizeof(bf16), MainStream());
    exchange_->WaitSent(MainStream());  // branch_ is written again by the next product
    return branch_peer_;
  }
  TpFollowMain();
  TpSendRecv("partial-sum exchange", send, peer, branch_peer_, peer, count);
  prof_.Begin(op);
  {
    OverlapSms sms(mm_, overlap_sms_);
    gemm(tp_rank_ * rows_l_, rows_l_);
  }
  WaitTp();
  return branch_peer_;
}

void BF16GptModel::TpSendRecv(const char* op, const bf16* send, int to, bf16* recv, int from,
                              size_t count) {
  tp_->Enqueue(op, tp_stream_, [&](ncclComm_t comm) {
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) r = ncclSend(send, count, ncclBfloat16, to, comm, tp_stream_);
    if (r == ncclSuccess) r = ncclRecv(recv, count, ncclBfloat16, from, comm, tp_stream_);
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

void BF16GptModel::TpAllReduce(float* data, int64_t n, ReduceOp op) {
  TpFollowMain();
  tp_->AllReduce(data, n, CommType::kF32, tp_stream_, op);
  WaitTp();
}

// Ring all-gather: at step i this rank holds block (rank − i) mod N, multiplies it, and meanwhile
// sends it to rank + 1 and receives block (rank − i − 1) mod N from rank − 1.
void BF16GptModel::GatherRun(bf16* full, const char* op,
                             const std::function<void(int64_t, int64_t)>& gemm) {
  if (!sp_ || !tp_overlap_) {
    GatherRows(full);
    prof_.Begin(op);
    gemm(0, n_);
    return;
  }
  const int size = tp_size_, rank = tp_rank_;
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const size_t count = static_cast<size_t>(rows_l_ * h_);
  if (exchange_ != nullptr) {  // the copy engines carry each block while the SMs multiply
    WaitTp();
    for (int i = 0; i < size; ++i) {
      const int have = (rank - i + size) % size;
      if (i + 1 < size) exchange_->Send(full + have * count, count * sizeof(bf16), MainStream());
      prof_.Begin(op);
      gemm(have * rows_l_, rows_l_);
      if (i + 1 < size) {
        prof_.Begin("tensor-parallel communication");
        exchange_->Receive(full + ((rank - i - 1 + size) % size) * count, count * sizeof(bf16),
                           MainStream());
      }
    }
    exchange_->WaitSent(MainStream());
    return;
  }
  TpFollowMain();
  for (int i = 0; i < size; ++i) {
    const int have = (rank - i + size) % size;
    if (i + 1 < size) {
      bf16* send = full + have * count;
      bf16* recv = full + ((rank - i - 1 + size) % size) * count;
      TpSendRecv("ring all-gather", send, next, recv, prev, count);
      LT_CUDA_CHECK(cudaEventRecord(ring_events_[i], tp_stream_));
    }
    if (i > 0) {
      prof_.Begin("tensor-parallel communication");
      LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), ring_events_[i - 1], 0));
    }
    prof_.Begin(op);
    OverlapSms sms(mm_, i + 1 < size ? overlap_sms_ : 0);
    gemm(have * rows_l_, rows_l_);
  }
  tp_pending_ = false;  // the last block's wait covered the whole ring
}

// Under SP on two ranks of one node: the rows the peer keeps first, sent while the weight
// gradient is computed, then this rank's rows accumulated onto the peer's partial sums of them.
// Otherwise the whole product, then its TP reduction beside the weight gradient.
void BF16GptModel::ColumnParallelBackward(const char* op, const bf16* dout, const bf16* weight,
                                          int64_t n, const std::function<void()>& weight_grad) {
  prof_.Begin(op);
  if (exchange_ != nullptr && tp_size_ == 2) {
    const int peer = 1 - tp_rank_;
    const size_t count = static_cast<size_t>(rows_l_ * h_);
    mm_.BackwardData(dln_ + peer * count, dout + peer * rows_l_ * n, weight, rows_l_, h_, n);
    exchange_->Send(dln_ + peer * count, count * sizeof(bf16), MainStream());
    weight_grad();
    prof_.Begin("tensor-parallel communication");
    exchange_->Receive(LocalRows(dln_), count * sizeof(bf16), MainStream());
    prof_.Begin(op);
    mm_.BackwardData(LocalRows(dln_), dout + tp_rank_ * rows_l_ * n, weight, rows_l_, h_, n,
                     /*accumulate=*/true);
    exchange_->WaitSent(MainStream());
    return;
  }
  mm_.BackwardData(dln_, dout, weight, n_, h_, n);
  ReduceRows(dln_, LocalRows(dln_), /*wait=*/false);
  prof_.Begin(op);
  {
    OverlapSms sms(mm_, tp_pending_ ? overlap_sms_ : 0);
    weight_grad();
  }
  WaitTp();
}

}  // namespace leantron::trainer::cuda::detail
