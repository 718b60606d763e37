#include "trainer/cuda/parallel/peer_exchange.h"

#include <cuda.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "trainer/cuda/kernels/kernels.h"

namespace leantron::trainer::cuda {
namespace {

constexpr size_t kFlagsBytes = 256;  // data sequence at +0, consumed sequence at +128
constexpr size_t kConsumedOffset = 128;

using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

void CheckDriver(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  char detail[64];
  std::snprintf(detail, sizeof(detail), "CUresult %d", static_cast<int>(r));
  Die(what, detail, __FILE__, __LINE__);
}

// What every rank publishes: its allocation's IPC handle, its host and whether it is usable.
struct Card {
  cudaIpcMemHandle_t handle;
  uint64_t host;
  uint32_t ok;
  uint32_t pad[13];  // a whole number of floats (NCCL gathers it as kF32)
};
static_assert(sizeof(Card) % sizeof(float) == 0);

}  // namespace

struct PeerExchange::Api {
  WaitValueFn wait = nullptr;
  WriteValueFn write = nullptr;
};

std::unique_ptr<PeerExchange> PeerExchange::Create(NcclCommunicator* group, size_t max_bytes) {
  static const Api api = [] {
    Api a;
    void* wait = nullptr;
    void* write = nullptr;
    cudaDriverEntryPointQueryResult q1 = cudaDriverEntryPointSymbolNotFound, q2 = q1;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &wait, 12000, cudaEnableDefault,
                                         &q1) != cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &write, 12000, cudaEnableDefault,
                                         &q2) != cudaSuccess ||
        q1 != cudaDriverEntryPointSuccess || q2 != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return a;
    }
    a.wait = reinterpret_cast<WaitValueFn>(wait);
    a.write = reinterpret_cast<WriteValueFn>(write);
    return a;
  }();
  const int size = group->size(), rank = group->rank();
  if (size < 2) return nullptr;
  std::unique_ptr<PeerExchange> x(new PeerExchange);
  x->api_ = &api;
  x->slot_bytes_ = RoundUp(max_bytes, 256);

  Card mine{};
  mine.ok = api.wait != nullptr && api.write != nullptr;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  mine.host = std::hash<std::string>{}(host);
  const size_t total = 2 * x->slot_bytes_ + kFlagsBytes;
  if (cudaMalloc(&x->local_, total) != cudaSuccess ||
      cudaIpcGetMemHandle(&mine.handle, x->local_) != cudaSuccess) {
    (void)cudaGetLastError();
    mine.ok = 0;
  } else {
    LT_CUDA_CHECK(cudaMemset(x->local_, 0, total));
  }

  // Everyone's card, then everyone's verdict on opening its neighbours' memory.
  const size_t floats = sizeof(Card) / sizeof(float);
  void* dev = nullptr;
  LT_CUDA_CHECK(cudaMalloc(&dev, sizeof(Card) * (size + 1)));
  LT_CUDA_CHECK(cudaMemcpy(static_cast<char*>(dev) + sizeof(Card) * size, &mine, sizeof(Card),
                           cudaMemcpyHostToDevice));
  group->AllGather(static_cast<char*>(dev) + sizeof(Card) * size, dev, floats, CommType::kF32,
                   MainStream());
  std::vector<Card> cards(size);
  LT_CUDA_CHECK(cudaMemcpyAsync(cards.data(), dev, sizeof(Card) * size, cudaMemcpyDeviceToHost,
                                MainStream()));
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  bool usable = true;
  for (const Card& c : cards) usable = usable && c.ok && c.host == mine.host;
  float failed = 0.0f;
  if (usable) {
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, cards[next].handle, cudaIpcMemLazyEnablePeerAccess) ==
        cudaSuccess) {
      x->next_ = static_cast<char*>(p);
      if (prev == next) {
        x->prev_ = x->next_;
      } else if (cudaIpcOpenMemHandle(&p, cards[prev].handle, cudaIpcMemLazyEnablePeerAccess) ==
                 cudaSuccess) {
        x->prev_ = static_cast<char*>(p);
      } else {
        failed = 1.0f;
      }
    } else {
      failed = 1.0f;
    }
    (void)cudaGetLastError();
    LT_CUDA_CHECK(cudaMemcpy(dev, &failed, sizeof(float), cudaMemcpyHostToDevice));
    group->AllReduce(dev, 1, CommType::kF32, MainStream(), ReduceOp::kMax);
    LT_CUDA_CHECK(
        cudaMemcpyAsync(&failed, dev, sizeof(float), cudaMemcpyDeviceToHost, MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  }
  LT_CUDA_CHECK(cudaFree(dev));
  if (!usable || failed != 0.0f) return nullptr;  // the destructor closes what was opened

  LoadPeerExchangeKernels();
  int least = 0, greatest = 0;
  LT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  LT_CUDA_CHECK(cudaStreamCreateWithPriority(&x->copy_, cudaStreamNonBlocking, greatest));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&x->ready_, cudaEventDisableTiming));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&x->sent_event_, cudaEventDisableTiming));
  return x;
}

PeerExchange::~PeerExchange() {
  if (copy_ != nullptr) {
    cudaStreamSynchronize(copy_);
    cudaStreamDestroy(copy_);
  }
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (sent_event_ != nullptr) cudaEventDestroy(sent_event_);
  if (prev_ != nullptr && prev_ != next_) cudaIpcCloseMemHandle(prev_);
  if (next_ != nullptr) cudaIpcCloseMemHandle(next_);
  if (local_ != nullptr) cudaFree(local_);
}

void PeerExchange::Send(const void* src, size_t bytes, cudaStream_t s) {
  if (bytes > slot_bytes_)
    Die("PeerExchange::Send", "block larger than the inbox", __FILE__, __LINE__);
  const uint32_t k = sent_++;
  const size_t flags = 2 * slot_bytes_;
  LT_CUDA_CHECK(cudaEventRecord(ready_, s));
  LT_CUDA_CHECK(cudaStreamWaitEvent(copy_, ready_, 0));
  // The slot was last filled in round k − 2: the next rank must have copied that out.
  if (k >= 2) {
    CheckDriver(api_->wait(reinterpret_cast<CUstream>(copy_),
                           reinterpret_cast<CUdeviceptr>(local_ + flags + kConsumedOffset), k - 1,
                           CU_STREAM_WAIT_VALUE_GEQ),
                "cuStreamWaitValue32");
  }
  LT_CUDA_CHECK(
      cudaMemcpyAsync(next_ + (k % 2) * slot_bytes_, src, bytes, cudaMemcpyDeviceToDevice, copy_));
  CheckDriver(
      api_->write(reinterpret_cast<CUstream>(copy_), reinterpret_cast<CUdeviceptr>(next_ + flags),
                  k + 1, CU_STREAM_WRITE_VALUE_DEFAULT),
      "cuStreamWriteValue32");
  LT_CUDA_CHECK(cudaEventRecord(sent_event_, copy_));
}

void PeerExchange::Receive(void* dst, size_t bytes, cudaStream_t s) {
  Receive(
      [&](const void* inbox) {
        LT_CUDA_CHECK(cudaMemcpyAsync(dst, inbox, bytes, cudaMemcpyDeviceToDevice, s));
      },
      s);
}

void PeerExchange::Receive(const std::function<void(const void* inbox)>& consume, cudaStream_t s) {
  const uint32_t k = received_++;
  const size_t flags = 2 * slot_bytes_;
  CheckDriver(
      api_->wait(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(local_ + flags),
                 k + 1, CU_STREAM_WAIT_VALUE_GEQ),
      "cuStreamWaitValue32");
  consume(local_ + (k % 2) * slot_bytes_);
  CheckDriver(api_->write(reinterpret_cast<CUstream>(s),
                          reinterpret_cast<CUdeviceptr>(prev_ + flags + kConsumedOffset), k + 1,
                          CU_STREAM_WRITE_VALUE_DEFAULT),
              "cuStreamWriteValue32");
}

void PeerExchange::WaitSent(cudaStream_t s) {
  LT_CUDA_CHECK(cudaStreamWaitEvent(s, sent_event_, 0));
}

}  // namespace leantron::trainer::cuda
