#include "trainer/cuda/parallel/tensor_parallel.h"

namespace leantron::trainer::cuda {

TensorParallel::TensorParallel(NcclCommunicator* tp, bool sequence_parallel,
                               const RowGeometry& rows, bool copy_engine, OpProfile* prof)
    : geo_(rows), prof_(prof) {
  if (tp == nullptr || tp->size() <= 1) return;
  comm_ = tp;
  size_ = tp->size();
  rank_ = tp->rank();
  sp_ = sequence_parallel;
  int least = 0, greatest = 0;
  LT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  LT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&main_ready_, cudaEventDisableTiming));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  ring_events_.resize(size_);
  for (cudaEvent_t& e : ring_events_)
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  if (sp_ && copy_engine) {
    exchange_ = PeerExchange::Create(
        comm_, static_cast<size_t>(geo_.local_rows * geo_.hidden) * sizeof(bf16));
  }
}

TensorParallel::~TensorParallel() {
  for (cudaEvent_t e : ring_events_) cudaEventDestroy(e);
  if (stream_ != nullptr) {
    cudaEventDestroy(main_ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }
}

void TensorParallel::FollowMain() {
  Wait();  // one TP collective at a time
  LT_CUDA_CHECK(cudaEventRecord(main_ready_, MainStream()));
  LT_CUDA_CHECK(cudaStreamWaitEvent(stream_, main_ready_, 0));
  pending_ = true;
}

void TensorParallel::Wait() {
  if (!pending_) return;
  pending_ = false;
  prof_->Begin("tensor-parallel communication");
  LT_CUDA_CHECK(cudaEventRecord(done_, stream_));
  LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), done_, 0));
}

void TensorParallel::GatherRows(bf16* full) { GatherRowsFrom(LocalRows(full), full); }

void TensorParallel::GatherRowsFrom(const bf16* local, bf16* full) {
  if (!sp_) return;
  FollowMain();
  comm_->AllGather(local, full, geo_.local_rows * geo_.hidden, CommType::kBF16, stream_);
  Wait();
}

void TensorParallel::ReduceRows(bf16* full, bf16* local, bool wait) {
  const int64_t h = geo_.hidden;
  if (comm_ == nullptr) {
    if (local != full)
      LT_CUDA_CHECK(cudaMemcpyAsync(local, full, geo_.local_rows * h * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, MainStream()));
    return;
  }
  FollowMain();
  if (sp_) {
    comm_->ReduceScatter(full, local, geo_.local_rows * h, CommType::kBF16, stream_);
  } else {
    comm_->AllReduce(full, geo_.rows * h, CommType::kBF16, stream_);
    if (local != full)
      LT_CUDA_CHECK(cudaMemcpyAsync(local, full, geo_.rows * h * sizeof(bf16),
                                    cudaMemcpyDeviceToDevice, stream_));
  }
  if (wait) Wait();
}

void TensorParallel::SendRecv(const char* op, const bf16* send, int to, bf16* recv, int from,
                              size_t count) {
  comm_->Enqueue(op, stream_, [&](ncclComm_t comm) {
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) r = ncclSend(send, count, ncclBfloat16, to, comm, stream_);
    if (r == ncclSuccess) r = ncclRecv(recv, count, ncclBfloat16, from, comm, stream_);
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

void TensorParallel::AllReduce(float* data, int64_t n, ReduceOp op) {
  FollowMain();
  comm_->AllReduce(data, n, CommType::kF32, stream_, op);
  Wait();
}

void TensorParallel::RunBlocks(const char* op, const std::function<void(int64_t, int64_t)>& gemm) {
  prof_->Begin(op);
  if (!sp_) {
    gemm(0, geo_.rows);
    return;
  }
  for (int i = 0; i < size_; ++i) gemm(i * geo_.local_rows, geo_.local_rows);
}

// Ring all-gather: at step i this rank holds block (rank − i) mod N, multiplies it, and meanwhile
// sends it to rank + 1 and receives block (rank − i − 1) mod N from rank − 1.
void TensorParallel::GatherRun(bf16* full, const char* op,
                               const std::function<void(int64_t, int64_t)>& gemm) {
  if (!sp_) {
    prof_->Begin(op);
    gemm(0, geo_.rows);
    return;
  }
  const int size = size_, rank = rank_;
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const int64_t rows = geo_.local_rows;
  const size_t count = static_cast<size_t>(rows * geo_.hidden);
  if (exchange_ != nullptr) {  // the copy engines carry each block while the SMs multiply
    Wait();
    for (int i = 0; i < size; ++i) {
      const int have = (rank - i + size) % size;
      if (i + 1 < size) exchange_->Send(full + have * count, count * sizeof(bf16), MainStream());
      prof_->Begin(op);
      gemm(have * rows, rows);
      if (i + 1 < size) {
        prof_->Begin("tensor-parallel communication");
        exchange_->Receive(full + ((rank - i - 1 + size) % size) * count, count * sizeof(bf16),
                           MainStream());
      }
    }
    exchange_->WaitSent(MainStream());
    return;
  }
  FollowMain();
  for (int i = 0; i < size; ++i) {
    const int have = (rank - i + size) % size;
    if (i + 1 < size) {
      bf16* send = full + have * count;
      bf16* recv = full + ((rank - i - 1 + size) % size) * count;
      SendRecv("ring all-gather", send, next, recv, prev, count);
      LT_CUDA_CHECK(cudaEventRecord(ring_events_[i], stream_));
    }
    if (i > 0) {
      prof_->Begin("tensor-parallel communication");
      LT_CUDA_CHECK(cudaStreamWaitEvent(MainStream(), ring_events_[i - 1], 0));
    }
    prof_->Begin(op);
    gemm(have * rows, rows);
  }
  pending_ = false;  // the last block's wait covered the whole ring
}

}  // namespace leantron::trainer::cuda
