// Tensor- and sequence-parallel communication of the bf16 model, over [rows, h] blocks of tokens:
// collectives on their own stream beside the compute stream, the ring all-gather that feeds each
// block of rows to a product as it arrives, and the pairwise exchange of partial sums. Between the
// two GPUs of one node the overlapped blocks travel by copy engine (PeerExchange: no SM leaves the
// products); otherwise by NCCL. The tensor-parallel linear layers (tp_linear.h) are built on it.
//
// Every collective runs on the TP stream, ordered after the compute stream's work so far; the
// compute stream waits for it at Wait() (where exposed communication is timed), so TP collectives
// never run concurrently with each other.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/op_profile.h"
#include "trainer/cuda/parallel/peer_exchange.h"
#include "trainer/dist/nccl_comm.h"

namespace leantron::trainer::cuda {

// Where this rank's rows sit in a micro-batch of `rows` tokens.
struct RowGeometry {
  int64_t rows = 0;        // all rows of the micro-batch (batch · sequence)
  int64_t local_rows = 0;  // this rank's: a 1/TP block under SP, all rows otherwise
  int64_t row_offset = 0;  // the first of them
  int64_t hidden = 0;
};

class TensorParallel {
 public:
  // `tp`: the group (null or of size one: no tensor parallelism). `copy_engine`: move overlapped
  // blocks by copy engine where the ranks allow it (one node, CUDA IPC), else by NCCL.
  TensorParallel(NcclCommunicator* tp, bool sequence_parallel, const RowGeometry& rows,
                 bool copy_engine, OpProfile* prof);
  ~TensorParallel();
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  bool enabled() const { return comm_ != nullptr; }
  bool sequence_parallel() const { return sp_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  const RowGeometry& rows() const { return geo_; }
  // This rank's rows inside an all-rows buffer [rows, h].
  bf16* LocalRows(bf16* full) const { return full + geo_.row_offset * geo_.hidden; }
  const bf16* LocalRows(const bf16* full) const { return full + geo_.row_offset * geo_.hidden; }
  // The copy-engine exchange with the peer (two ranks of one node under SP), or null.
  PeerExchange* exchange() const { return exchange_.get(); }
  // Whether a collective is in flight on the TP stream that the compute stream has not waited for.
  bool pending() const { return pending_; }

  // Under SP: this rank's rows (already in place inside `full`) → all rows.
  void GatherRows(bf16* full);
  // Under SP: this rank's rows `local` → all rows in `full`; without SP `full` is `local`.
  void GatherRowsFrom(const bf16* local, bf16* full);
  // Partial sums over all rows → this rank's rows summed (into `local`, which may be `full`
  // without SP). With wait = false the caller overlaps it with work that touches neither buffer
  // and calls Wait() before reading the result.
  void ReduceRows(bf16* full, bf16* local, bool wait = true);
  // Under SP, all-gathers `full` (this rank's rows in place) around the TP ring and runs
  // gemm(first_row, rows) on each block of rows as soon as it is present, so the transfer of the
  // next block overlaps the product on this one; otherwise gemm(0, all rows).
  void GatherRun(bf16* full, const char* op, const std::function<void(int64_t, int64_t)>& gemm);
  // gemm(first_row, rows) on the blocks of rows GatherRun runs, with no communication: `full`
  // already holds all rows. The same product shapes, so a recomputation is bitwise the same.
  void RunBlocks(const char* op, const std::function<void(int64_t, int64_t)>& gemm);
  // In one NCCL group on the TP stream: `count` bf16 from `send` to TP rank `to`, into `recv` from
  // rank `from`.
  void SendRecv(const char* op, const bf16* send, int to, bf16* recv, int from, size_t count);
  // fp32 all-reduce over TP, waited for (softmax statistics of the vocabulary-parallel loss).
  void AllReduce(float* data, int64_t n, ReduceOp op);
  void FollowMain();  // the TP stream waits for the compute stream's work so far
  void Wait();        // the compute stream waits for the TP stream

 private:
  NcclCommunicator* comm_ = nullptr;  // null without tensor parallelism
  bool sp_ = false;
  int size_ = 1, rank_ = 0;
  RowGeometry geo_;
  OpProfile* prof_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t main_ready_ = nullptr, done_ = nullptr;
  std::vector<cudaEvent_t> ring_events_;  // one per ring step
  bool pending_ = false;
  std::unique_ptr<PeerExchange> exchange_;
};

}  // namespace leantron::trainer::cuda
