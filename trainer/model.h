// The GPT-2-style model on one pipeline stage of one tensor-parallel rank, written once against
// `Ops` (compute) and `Communicator` (tensor-parallel collectives):
//   column-parallel linear_qkv / linear_fc1 (rows split), row-parallel linear_proj / linear_fc2
//   (columns split, all-reduce or reduce-scatter after), vocab-parallel embedding and
//   cross-entropy, and with sequence parallelism the norms, dropouts and residuals on a 1/TP row
//   shard (all-gather before column-parallel linears, reduce-scatter after row-parallel ones).
// Activations live in numbered slots so a pipeline schedule can keep several micro-batches in
// flight; gradients accumulate into the ParamStore's flat gradient buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "libckpt/layout.h"
#include "trainer/comm.h"
#include "trainer/ops.h"
#include "trainer/params.h"
#include "trainer/stage_model.h"

namespace leantron::trainer {

struct ModelOptions {
  int64_t micro_batch = 1;
  int64_t seq_length = 0;
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  bool sequence_parallel = false;
  uint64_t seed = 1234;
  // Activation recomputation: the first `recompute_layers` layers of this chunk keep only their
  // input and run their forward again in the backward (Megatron's full granularity); with
  // `recompute_attention` the other layers drop the softmax matrix and recompute it (selective).
  // Dropout masks are functions of the sample, so recomputed activations are bitwise the same.
  int recompute_layers = 0;
  bool recompute_attention = false;
};

class GptModel : public StageModel {
 public:
  // `virtual_chunk`: which of this stage's model chunks (interleaved schedule; 0 otherwise).
  GptModel(Ops* ops, const ckpt::ModelLayout& layout, Communicator* tp, ParamStore* params,
           int pp_rank, int virtual_chunk, const ModelOptions& options);
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  bool first_stage() const override { return first_stage_; }
  bool last_stage() const override { return last_stage_; }
  int first_layer() const override { return layers_.empty() ? -1 : layers_.front().global_index; }
  int last_layer() const override { return layers_.empty() ? -1 : layers_.back().global_index + 1; }
  int64_t hidden_rows() const override { return rows_local_; }
  int64_t hidden_size() const override { return h_; }
  float Forward(int slot, const MicroBatch& mb, const float* input) override;
  const float* Output(int slot) const override;
  void Backward(int slot, const float* doutput, float loss_scale) override;
  const float* InputGrad() const override { return dhidden_; }
  float* input_buffer() override { return recv_input_; }
  float* grad_buffer() override { return recv_grad_; }
  // With recomputation on: how many layer forwards and attention softmaxes the backward redid.
  std::string TimeReport() const override;

 private:
  struct LayerWeights {
    int global_index = 0;
    const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    const float *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    float *d_ln1_w, *d_ln1_b, *d_qkv_w, *d_qkv_b, *d_proj_w, *d_proj_b;
    float *d_ln2_w, *d_ln2_b, *d_fc1_w, *d_fc1_b, *d_fc2_w, *d_fc2_b;
  };
  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *ln1_full, *qkv, *probs, *attn, *mid;
    float *ln2, *ln2_mean, *ln2_rstd, *ln2_full, *fc1, *gelu;
  };
  struct Slot {
    MicroBatch mb;               // host copy (loss counting)
    int32_t *tokens, *labels;    // backend copies
    std::vector<float*> hidden;  // [layers + 1] residual stream, [rows_local, h]
    std::vector<LayerActs> layers;
    float *lnf, *lnf_mean, *lnf_rstd, *lnf_full, *logits, *ce_stats, *losses;
    int64_t loss_tokens = 0;
  };

  Slot& GetSlot(int slot);
  LayerActs MakeLayerActs();
  float* A(size_t n);  // slot allocation, freed with the model
  int32_t* AInt(size_t n);
  HiddenDropout HiddenDrop(const MicroBatch& mb, int layer, int site) const;
  AttentionDropout AttnDrop(const MicroBatch& mb, int layer) const;
  // Column-parallel input: under SP all-gather the row shard, else the same buffer.
  const float* GatherRows(const float* shard, float* full);
  // Row-parallel output partial sums [rows_full, h] → this rank's reduced [rows_local, h].
  void ReduceRows(float* full, float* shard);
  // Gradient of a gathered input [rows_full, h] → this rank's rows, summed over TP.
  void ReduceGradRows(float* full, float* shard) { ReduceRows(full, shard); }

  // LayerNorm or RMSNorm; GELU or SwiGLU (fc1 [rows, 2·ffn] = [gate | up] on this rank).
  void NormForward(float* out, float* mean, float* rstd, const float* in, const float* w,
                   const float* b, int64_t rows, int64_t cols, float eps);
  void NormBackward(float* din, float* dw, float* db, const float* dout, const float* in,
                    const float* w, const float* mean, const float* rstd, int64_t rows,
                    int64_t cols);
  void ActivationForward(float* out, const float* in);
  void ActivationBackward(float* din, const float* dout, const float* in);

  void EmbeddingForward(Slot& s);
  void EmbeddingBackward(Slot& s);
  void LayerForward(Slot& s, int l);
  void LayerBackward(Slot& s, int l);
  float HeadForward(Slot& s);
  void HeadBackward(Slot& s, float loss_scale);

  Ops* ops_;
  const ckpt::ModelLayout& layout_;
  Communicator* tp_;
  ParamStore* params_;
  ModelOptions opt_;
  bool first_stage_ = false, last_stage_ = false;
  int tp_rank_ = 0, tp_size_ = 1;
  int64_t h_ = 0, heads_local_ = 0, head_dim_ = 0, ffn_local_ = 0, vocab_local_ = 0;
  int64_t total_heads_ = 0, rows_full_ = 0, rows_local_ = 0;
  float eps_ = 1e-5f;
  bool tanh_gelu_ = false, swiglu_ = false, rms_norm_ = false, rope_ = false;
  int64_t groups_local_ = 0, qkv_width_ = 0, fc1_width_ = 0;
  double rope_base_ = 10000.0;
  std::vector<LayerWeights> layers_;
  StageTensors<float> stage_;
  std::vector<std::unique_ptr<Slot>> slots_;
  // Shared by every slot: the activations of recomputed layers, and the softmax matrix under
  // selective recomputation (nullptr until first needed).
  std::unique_ptr<LayerActs> recomputed_acts_;
  int64_t recomputed_layers_ = 0, recomputed_softmaxes_ = 0;  // over the run, for the report
  float* shared_probs_ = nullptr;
  std::vector<float*> allocations_;
  // Scratch shared by all slots (one backward at a time).
  float *dhidden_, *dtmp_, *dfull_, *dfull2_, *dqkv_, *dattn_, *dfc1_, *dgelu_, *dlogits_,
      *dlosses_, *tmp_full_;
  int32_t* positions_ = nullptr;  // backend memory
  std::vector<void*> byte_allocations_;
  std::vector<float> host_rows_;  // per-row losses / loss gradients on the host
  float *recv_input_, *recv_grad_;
};

}  // namespace leantron::trainer
