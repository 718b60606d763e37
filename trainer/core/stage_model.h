// What a pipeline schedule and the training loop need from the model on one pipeline stage (or
// one virtual chunk of it). Two implementations, both built from the same ModelSpec
// (layer_spec.h): ReferenceModel (trainer/reference/: float32 over `Ops`, every backend) and
// cuda::Bf16Model (trainer/cuda/nn/: the fused bf16 path for NVIDIA GPUs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/core/context_parallel.h"
#include "trainer/core/model_events.h"
#include "trainer/core/step_copies.h"

namespace leantron::trainer {

// With context parallelism a micro-batch holds this CP rank's chunks of its samples
// (context_parallel.h): tokens, labels and positions [micro_batch · seq_length / CP].
struct MicroBatch {
  std::vector<int32_t> tokens;  // [micro_batch · local sequence]
  std::vector<int32_t> labels;  // same shape; −1 = no loss (padding, --eod-mask-loss)
  // Same shape, with --reset-position-ids: each token's position in its document (learned
  // positions, RoPE). Empty: its position in the sample.
  std::vector<int32_t> positions;
  // [micro_batch · seq_length], with --reset-attention-mask: the document of every token of the
  // whole samples (attention stays inside a document). Empty: each sample is one document.
  std::vector<int32_t> documents;
  int64_t first_sample = 0;  // global index of its first sample (dropout masks)
  bool training = true;      // dropout only when training
};

struct ModelOptions {
  int64_t micro_batch = 1;
  int64_t seq_length = 0;  // tokens of a whole sample (each CP rank holds 1/CP of them)
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  bool sequence_parallel = false;
  uint64_t seed = 1234;
  // Activation recomputation: the first `recompute_layers` layers of this chunk keep only their
  // input and run their forward again in the backward (Megatron's full granularity); with
  // `recompute_attention` the other layers drop the softmax matrix and recompute it (selective).
  // With `recompute_norms` (selective, layernorm; the bf16 model) layers keep no norm outputs:
  // the backward normalises their stored inputs again, into one buffer all layers share. With
  // `recompute_mlp` (selective, mlp; the bf16 model) layers keep no fc1 or activation outputs:
  // the backward runs fc1 and the activation again from the pre-MLP norm's output.
  // Dropout masks are functions of the sample, so recomputed activations are bitwise the same.
  int recompute_layers = 0;
  bool recompute_attention = false;
  bool recompute_norms = false;
  bool recompute_mlp = false;
  // How attention meets the other CP ranks' tokens (with a cp group of more than one rank).
  CpCommType cp_comm_type = CpCommType::kP2P;
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
  // mean loss over its unmasked tokens, all of its samples' tokens on every CP rank (the same on
  // every TP and CP rank); 0 elsewhere.
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
  // Weight copies of this model's that the optimizer's step writes (step_copies.h); null: none.
  virtual StepCopies* step_copies() { return nullptr; }
  // Components that follow this model's progress (ModelEvents), called in the order added.
  void AddListener(ModelEvents* listener) { listeners_.push_back(listener); }
  // Activation recomputation so far, for the report: layer forwards run again during backwards
  // (full), and attention softmaxes rebuilt (selective).
  virtual int64_t recomputed_layers() const { return 0; }
  virtual int64_t recomputed_softmaxes() const { return 0; }
  // Peak device memory for the activations this model holds (bytes), for the log.
  virtual int64_t activation_bytes() const { return 0; }
  // Per-step averages measured on the device, leaving out the first step: GPU time of this
  // chunk's forward and backward outside communication, and tensor-parallel communication on the
  // critical path. False when the model does not measure them.
  virtual bool StepTimes(double* compute_ms, double* tp_comm_ms) const { return false; }
  // With FP8 products (--fp8-format): per-step GPU time of the FP8 products, the FP8 casts and
  // the products left in bf16, measured as StepTimes is.
  virtual bool ProductTimes(double* fp8_ms, double* fp8_cast_ms, double* bf16_ms) const {
    return false;
  }
  // The FP8 scaling state a checkpoint keeps (amax histories and scales; empty without FP8
  // layers), and setting it from one (the same size).
  virtual std::vector<float> Fp8State() const { return {}; }
  // Collective over the data-parallel group, before a save: makes every rank's FP8 state what the
  // writer saves (the recorded amaxes max-reduced, as the next step would reduce them).
  virtual void SyncFp8State() {}
  virtual void SetFp8State(const std::vector<float>& state) {}

 protected:
  template <typename F>
  void Notify(F&& f) {
    for (ModelEvents* l : listeners_) f(*l);
  }

 private:
  std::vector<ModelEvents*> listeners_;
};

}  // namespace leantron::trainer
