// What a pipeline schedule and the training loop need from the model on one pipeline stage (or
// one virtual chunk of it). Two implementations: GptModel, written once against `Ops` (float32,
// every layout, every backend), and cuda::BF16GptModel, the fused bf16 path for NVIDIA GPUs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace leantron::trainer {

struct MicroBatch {
  std::vector<int32_t> tokens;  // [micro_batch · seq_length]
  std::vector<int32_t> labels;  // same shape; −1 = no loss (padding)
  int64_t first_sample = 0;     // global index of its first sample (dropout masks)
  bool training = true;         // dropout only when training
};

class StageModel {
 public:
  virtual ~StageModel() = default;

  virtual bool first_stage() const = 0;
  virtual bool last_stage() const = 0;
  virtual int first_layer() const = 0;
  virtual int last_layer() const = 0;  // one past
  // Rows of the hidden tensor between stages on this rank ([rows, hidden]).
  virtual int64_t hidden_rows() const = 0;
  virtual int64_t hidden_size() const = 0;

  // Called once per optimizer step before any Forward of that step (the bf16 model refreshes its
  // low-precision weight copy from the fp32 main weights here).
  virtual void BeginStep() {}
  // Runs this stage's forward for `mb` into activation slot `slot`. `input` is the previous
  // stage's output (ignored on the first stage). On the last stage returns the micro-batch's
  // mean loss over its unmasked tokens (the same on every TP rank); 0 elsewhere.
  // A model may instead keep the losses on the device (no synchronisation per micro-batch):
  // Forward then returns 0 and TakeDeferredLoss gives their sum at the end of the schedule.
  virtual float Forward(int slot, const MicroBatch& mb, const float* input) = 0;
  // The sum of the micro-batch losses kept on the device since BeginStep (waits for them); 0 for
  // a model that returns them from Forward.
  virtual double TakeDeferredLoss() { return 0.0; }
  virtual const float* Output(int slot) const = 0;  // this stage's output (not on the last stage)
  // Backward of slot `slot`; `doutput` is the next stage's input gradient (ignored on the last
  // stage, where the loss gradient is `loss_scale` / unmasked tokens per token). Gradients
  // accumulate into the ParamStore.
  virtual void Backward(int slot, const float* doutput, float loss_scale) = 0;
  virtual const float* InputGrad() const = 0;  // after Backward, not on the first stage
  // Backend buffers a schedule receives the previous stage's output and the next stage's input
  // gradient into.
  virtual float* input_buffer() = 0;
  virtual float* grad_buffer() = 0;
  // Whether the model itself sums the gradients over data parallelism (and, with the distributed
  // optimizer, gathers the stepped weights), so that the optimizer must not.
  virtual bool reduces_data_parallel() const { return false; }
  // Peak device memory for the activations this model holds (bytes), for the log.
  virtual int64_t activation_bytes() const { return 0; }
  // What the model measured over the run, for the per-rank report: where a step's time went on
  // the device (communication, exposed waits), how much it recomputed; empty when nothing.
  virtual std::string TimeReport() const { return {}; }
  // Per-step averages measured on the device, leaving out the first step: GPU time of this
  // chunk's forward and backward outside communication, tensor-parallel communication on the
  // critical path, and data-parallel communication the backward had to wait for. False when the
  // model does not measure them.
  virtual bool StepTimes(double* compute_ms, double* tp_comm_ms, double* dp_exposed_ms) const {
    return false;
  }
};

}  // namespace leantron::trainer
