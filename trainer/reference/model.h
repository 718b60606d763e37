// The float32 reference model on one pipeline stage (or virtual chunk) of one tensor-parallel
// rank: the layers of the ModelSpec this chunk owns, each a pre-norm transformer layer
//   mid = x + dropout(attention(norm1(x)));  y = mid + dropout(mlp(norm2(mid)))
// composed of the modules in modules.h, plus the embedding on the first stage and the final norm
// and output head on the last. Every backend of `Ops` runs it (cpu, cuda); every layout (DP, TP,
// SP, CP, PP, interleaved PP) through the Communicators it is given. With context parallelism
// its rows are this CP rank's chunks of each sample; core attention is the context-parallel one
// and the loss is averaged over every CP rank's tokens. Activations live in numbered slots
// so a pipeline schedule can keep several micro-batches in flight. It fires the ModelEvents every
// model fires; on the CPU the optimizer reduces over DP after the backward, so nobody listens.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "libckpt/layout.h"
#include "trainer/core/layer_spec.h"
#include "trainer/core/params.h"
#include "trainer/core/stage_model.h"
#include "trainer/dist/comm.h"
#include "trainer/reference/modules.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

class ReferenceModel : public StageModel {
 public:
  // `virtual_chunk`: which of this stage's model chunks (interleaved schedule; 0 otherwise).
  // `cp`: the context-parallel group (a group of one without CP).
  ReferenceModel(Ops* ops, const ckpt::ModelLayout& layout, Communicator* tp, Communicator* cp,
                 ParamStore* params, int pp_rank, int virtual_chunk, const ModelOptions& options);
  ~ReferenceModel();
  ReferenceModel(const ReferenceModel&) = delete;
  ReferenceModel& operator=(const ReferenceModel&) = delete;

  bool first_stage() const override { return first_stage_; }
  bool last_stage() const override { return last_stage_; }
  int first_layer() const override { return first_layer_; }
  int last_layer() const override { return first_layer_ + static_cast<int>(layers_.size()); }
  int64_t hidden_rows() const override { return ctx_.rows_local; }
  int64_t hidden_size() const override { return h_; }
  void BeginStep() override {
    Notify([](ModelEvents& e) { e.StepBegins(); });
  }
  float Forward(int slot, const MicroBatch& mb, const float* input) override;
  const float* Output(int slot) const override;
  void Backward(int slot, const float* doutput, float loss_scale) override;
  const float* InputGrad() const override { return dhidden_; }
  float* input_buffer() override { return recv_input_; }
  float* grad_buffer() override { return recv_grad_; }
  int64_t recomputed_layers() const override { return recomputed_layers_; }
  int64_t recomputed_softmaxes() const override { return recomputed_softmaxes_; }

 private:
  struct Layer {
    LayerTensors<float> w;
    bool recompute = false;
    reference::Norm input_norm, pre_mlp_norm;
    reference::AttentionBlock attention;
    reference::MlpBlock mlp;
  };
  // One layer's activations for one micro-batch (a shared set for recomputed layers).
  struct LayerActs {
    float *ln1 = nullptr, *mid = nullptr, *ln2 = nullptr;
    reference::Norm::Saved ln1_stats, ln2_stats;
    reference::AttentionBlock::Saved attention;
    reference::MlpBlock::Saved mlp;
  };
  struct Slot {
    MicroBatch mb;                 // host copy (loss counting)
    int32_t *tokens, *labels;      // backend copies
    int32_t* positions = nullptr;  // backend copy of mb.positions (allocated when first given)
    int32_t* documents = nullptr;  // backend copy of mb.documents (likewise)
    std::vector<float*> hidden;    // [layers + 1] residual stream, this rank's rows
    std::vector<LayerActs> layers;
    float* lnf = nullptr;
    reference::Norm::Saved lnf_stats;
    reference::OutputHead::Saved head;
    int64_t loss_tokens = 0;
  };

  Slot& GetSlot(int slot);
  LayerActs MakeLayerActs();
  float* A(size_t n);  // backend allocation, freed with the model
  HiddenDropout HiddenDrop(const MicroBatch& mb, int layer, int site) const;
  AttentionDropout AttnDrop(const MicroBatch& mb, int layer) const;
  reference::AttentionInputs AttnInputs(const Slot& s, int layer) const;
  const int32_t* Positions(const Slot& s) const;
  int32_t* AllocIds(size_t n);  // backend int32 memory, freed with the model
  void LayerForward(Slot& s, int l);
  void LayerBackward(Slot& s, int l);
  float HeadForward(Slot& s);
  void HeadBackward(Slot& s, float loss_scale);

  Ops* ops_;
  ModelOptions opt_;
  ModelSpec spec_;
  reference::Context ctx_;
  reference::Workspace ws_;
  bool first_stage_ = false, last_stage_ = false;
  int first_layer_ = 0;
  int64_t h_ = 0, vocab_local_ = 0;
  std::vector<std::unique_ptr<reference::CoreAttention>> core_attention_;  // per layer
  std::vector<Layer> layers_;
  StageTensors<float> stage_;
  std::unique_ptr<reference::Embedding> embedding_;  // first stage
  std::unique_ptr<reference::Norm> final_norm_;      // last stage
  std::unique_ptr<reference::OutputHead> head_;      // last stage
  std::vector<std::unique_ptr<Slot>> slots_;
  // Shared by every slot: the activations of recomputed layers, and what core attention keeps
  // (the softmax matrix, or its log-sum-exp) under selective recomputation (nullptr until first
  // needed).
  std::unique_ptr<LayerActs> recomputed_acts_;
  float* shared_core_ = nullptr;
  // Positions of every CP rank's tokens ([CP, local sequence]) and of this rank's rows
  // ([rows_full]: its tokens' positions, sample after sample): backend memory.
  int32_t *chunk_positions_ = nullptr, *row_positions_ = nullptr;
  std::vector<float*> allocations_;
  std::vector<void*> byte_allocations_;
  float *dhidden_, *dtmp_;        // residual-stream gradient and a branch's, this rank's rows
  std::vector<float> host_rows_;  // per-row losses / loss gradients on the host
  float *recv_input_, *recv_grad_;
  int64_t recomputed_layers_ = 0, recomputed_softmaxes_ = 0;  // in backwards so far
};

}  // namespace leantron::trainer
