#include "trainer/core/pipeline.h"

#include <algorithm>
#include <cstdint>

namespace leantron::trainer {
namespace {
constexpr uint32_t kActivationTag = 0;
constexpr uint32_t kGradientTag = 1;
}  // namespace

double RunSchedule(const std::vector<StageModel*>& chunks, Communicator& pp,
                   const std::vector<MicroBatch>& mbs, bool forward_only) {
  const int64_t m = static_cast<int64_t>(mbs.size());
  const float loss_scale = 1.0f / static_cast<float>(m);
  for (StageModel* c : chunks) c->BeginStep();
  const int64_t stages = pp.size(), rank = pp.rank();
  const int64_t vpp = static_cast<int64_t>(chunks.size());
  double loss_sum = 0.0;
  if (stages == 1) {
    for (int64_t i = 0; i < m; ++i) {
      loss_sum += chunks[0]->Forward(0, mbs[i], nullptr);
      if (!forward_only) chunks[0]->Backward(0, nullptr, loss_scale);
    }
    return loss_sum + chunks[0]->TakeDeferredLoss();
  }
  const int next = static_cast<int>((rank + 1) % stages);
  const int prev = static_cast<int>((rank + stages - 1) % stages);
  const size_t n = static_cast<size_t>(chunks[0]->hidden_rows() * chunks[0]->hidden_size());
  float* input = chunks[0]->input_buffer();
  float* grad = chunks[0]->grad_buffer();
  const int64_t total = m * vpp, group = stages * vpp;
  int64_t warmup;
  if (forward_only) {
    warmup = total;
  } else if (vpp == 1) {
    warmup = std::min(stages - rank - 1, m);
  } else if (m == stages) {
    warmup = total;  // Megatron: all warm-up when there is one round of micro-batches
  } else {
    warmup = std::min((stages - rank - 1) * 2 + (vpp - 1) * stages, total);
  }
  // Micro-batches in flight on one chunk are consecutive and at most warmup + 1.
  const int64_t slots = std::min(m, warmup + 1);
  auto chunk_of = [&](int64_t k, bool forward) {
    const int64_t c = (k % group) / stages;
    return forward ? c : vpp - 1 - c;
  };
  auto micro_of = [&](int64_t k) { return (k / group) * stages + k % stages; };

  auto forward = [&](int64_t k) {
    StageModel& model = *chunks[chunk_of(k, true)];
    const int64_t mb = micro_of(k);
    if (!model.first_stage()) pp.Recv(input, n, prev, kActivationTag);
    loss_sum += model.Forward(static_cast<int>(mb % slots), mbs[mb], input);
    if (!model.last_stage()) {
      pp.SendAsync(model.Output(static_cast<int>(mb % slots)), n, next, kActivationTag);
    }
  };
  auto backward = [&](int64_t k) {
    StageModel& model = *chunks[chunk_of(k, false)];
    const int64_t mb = micro_of(k);
    if (!model.last_stage()) pp.Recv(grad, n, next, kGradientTag);
    model.Backward(static_cast<int>(mb % slots), grad, loss_scale);
    if (!model.first_stage()) pp.SendAsync(model.InputGrad(), n, prev, kGradientTag);
  };
  for (int64_t k = 0; k < warmup; ++k) forward(k);
  for (int64_t k = 0; k < total - warmup; ++k) {
    forward(warmup + k);
    backward(k);
  }
  if (!forward_only) {
    for (int64_t k = total - warmup; k < total; ++k) backward(k);
  }
  pp.WaitSends();
  for (StageModel* c : chunks) loss_sum += c->TakeDeferredLoss();
  return loss_sum;
}

}  // namespace leantron::trainer
