// Tensor-parallel blocks moved by the GPUs' copy engines instead of NCCL kernels, between the
// ranks of one node: each rank pushes a block into the next rank's inbox (memory shared through
// CUDA IPC) with cudaMemcpyAsync on a copy stream, then raises a sequence number in that rank's
// memory (cuStreamWriteValue32); the receiver's stream waits for the number (cuStreamWaitValue32),
// copies the block out of its inbox and raises the sender's "consumed" number, which the sender
// waits for before it reuses that inbox slot (two slots). The transfer occupies no SM, so the
// matrix product it overlaps keeps the whole GPU (NCCL's kernels take SMs from it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "trainer/cuda/cuda_util.h"
#include "trainer/dist/nccl_comm.h"

namespace leantron::trainer::cuda {

class PeerExchange {
 public:
  // Collective over `group`. Null (on every rank alike) when the group's ranks are not all on
  // this host, or CUDA IPC or stream memory operations are unavailable.
  static std::unique_ptr<PeerExchange> Create(NcclCommunicator* group, size_t max_bytes);
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  // Sends `bytes` from `src` to the next rank of the ring once the work already on `s` is done.
  // `src` must not change until WaitSent.
  void Send(const void* src, size_t bytes, cudaStream_t s);
  // Work enqueued on `s` afterwards sees the previous rank's matching Send copied into `dst`.
  void Receive(void* dst, size_t bytes, cudaStream_t s);
  // The same, with `consume(inbox)` enqueuing on `s` whatever reads the block where it arrived
  // (the inbox is handed back once that work is done).
  void Receive(const std::function<void(const void* inbox)>& consume, cudaStream_t s);
  size_t max_bytes() const { return slot_bytes_; }
  // Work enqueued on `s` afterwards runs once every Send so far has left its source.
  void WaitSent(cudaStream_t s);

 private:
  PeerExchange() = default;
  struct Api;

  size_t slot_bytes_ = 0;
  char* local_ = nullptr;  // [2 inbox slots][flags]
  char* next_ = nullptr;   // the next rank's allocation (IPC)
  char* prev_ = nullptr;   // the previous rank's (IPC; equal to next_ with two ranks)
  cudaStream_t copy_ = nullptr;
  cudaEvent_t ready_ = nullptr, sent_event_ = nullptr;
  uint32_t sent_ = 0, received_ = 0;
  const Api* api_ = nullptr;
};

}  // namespace leantron::trainer::cuda
