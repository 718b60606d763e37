#include "trainer/pipeline.h"

#include <algorithm>

namespace leantron::trainer {

double RunSchedule(GptModel& model, Communicator& pp, const std::vector<MicroBatch>& mbs,
                   bool forward_only) {
  const int64_t m = static_cast<int64_t>(mbs.size());
  const float loss_scale = 1.0f / static_cast<float>(m);
  const bool first = model.first_stage(), last = model.last_stage();
  const int prev = pp.rank() - 1, next = pp.rank() + 1;
  const size_t n = static_cast<size_t>(model.hidden_rows() * model.hidden_size());
  std::vector<float> input(first ? 0 : n), grad_out(last ? 0 : n);
  double loss_sum = 0.0;

  if (pp.size() == 1) {
    for (int64_t i = 0; i < m; ++i) {
      loss_sum += model.Forward(0, mbs[i], nullptr);
      if (!forward_only) model.Backward(0, nullptr, loss_scale);
    }
    return loss_sum;
  }
  if (forward_only) {
    for (int64_t i = 0; i < m; ++i) {
      if (!first) pp.Recv(input.data(), n, prev);
      loss_sum += model.Forward(0, mbs[i], input.data());
      if (!last) pp.Send(model.Output(0), n, next);
    }
    return loss_sum;
  }
  const int64_t warmup = std::min<int64_t>(pp.size() - pp.rank() - 1, m);
  const int64_t remaining = m - warmup;
  const int slots = static_cast<int>(warmup + 1);
  auto forward = [&](int64_t i) {
    loss_sum += model.Forward(static_cast<int>(i % slots), mbs[i], input.data());
  };
  auto backward = [&](int64_t i) {
    model.Backward(static_cast<int>(i % slots), grad_out.data(), loss_scale);
  };
  for (int64_t i = 0; i < warmup; ++i) {
    if (!first) pp.Recv(input.data(), n, prev);
    forward(i);
    if (!last) pp.Send(model.Output(static_cast<int>(i % slots)), n, next);
  }
  if (remaining > 0 && !first) pp.Recv(input.data(), n, prev);
  for (int64_t i = 0; i < remaining; ++i) {
    const int64_t f = warmup + i;
    forward(f);
    if (!last) {
      pp.SendRecv(model.Output(static_cast<int>(f % slots)), n, next, grad_out.data(), n, next);
    }
    backward(i);
    if (!first) {
      if (i == remaining - 1) {
        pp.Send(model.InputGrad(), n, prev);
      } else {
        pp.SendRecv(model.InputGrad(), n, prev, input.data(), n, prev);
      }
    }
  }
  for (int64_t i = 0; i < warmup; ++i) {
    if (!last) pp.Recv(grad_out.data(), n, next);
    backward(remaining + i);
    if (!first) pp.Send(model.InputGrad(), n, prev);
  }
  return loss_sum;
}

}  // namespace leantron::trainer
