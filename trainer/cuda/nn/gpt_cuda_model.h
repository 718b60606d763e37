// The bf16 GPT model's class (gpt_cuda.cc: the model; gpt_cuda_tp.cc: its tensor-parallel
// communication). Internal to trainer/cuda; the public entry points are in gpt_cuda.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/cuda/nn/flash_attention.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/nn/gpt_cuda.h"
#include "trainer/cuda/parallel/grad_reduce.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/matmul.h"
#include "trainer/cuda/op_profile.h"
#include "trainer/cuda/parallel/peer_exchange.h"

namespace leantron::trainer::cuda::detail {

class BF16GptModel : public StageModel {
 public:
  BF16GptModel(const ckpt::ModelLayout& layout, ParamStore* params, const BF16Options& options,
               std::unique_ptr<FlashAttention> attention);
  ~BF16GptModel() override;

  bool first_stage() const override { return first_stage_; }
  bool last_stage() const override { return last_stage_; }
  int first_layer() const override { return first_layer_; }
  int last_layer() const override { return first_layer_ + static_cast<int>(layers_.size()); }
  bool reduces_data_parallel() const override { return reducer_ != nullptr; }
  int64_t hidden_rows() const override { return rows_l_; }
  // Stage messages are bf16 [rows, h]: counted in floats, as the schedule sends them.
  int64_t hidden_size() const override { return h_ / 2; }
  void BeginStep() override;
  // Returns 0: the loss stays on the device (TakeDeferredLoss), so the last stage never waits
  // for its GPU between micro-batches.
  float Forward(int slot, const MicroBatch& mb, const float* input) override;
  double TakeDeferredLoss() override;
  const float* Output(int slot) const override {
    return reinterpret_cast<const float*>(slots_[slot]->x.back());
  }
  void Backward(int slot, const float* doutput, float loss_scale) override;
  const float* InputGrad() const override { return reinterpret_cast<const float*>(dx_); }
  float* input_buffer() override { return reinterpret_cast<float*>(recv_input_); }
  float* grad_buffer() override { return reinterpret_cast<float*>(recv_grad_); }
  int64_t activation_bytes() const override { return activation_bytes_; }
  std::string TimeReport() const override;
  bool StepTimes(double* compute_ms, double* tp_comm_ms, double* dp_exposed_ms) const override {
    if (!prof_.Averages(compute_ms, tp_comm_ms)) return false;
    *dp_exposed_ms = measured_steps_ > 0 ? exposed_ms_ / measured_steps_ : 0.0;
    return true;
  }

 private:
  struct Weights {
    // bf16 weights (views into w16_), fp32 gradients (views into the ParamStore's gradient).
    int global_index = 0;
    const bf16 *qkv_w, *qkv_b, *proj_w, *proj_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    float *d_qkv_w, *d_qkv_b, *d_proj_w, *d_proj_b, *d_fc1_w, *d_fc1_b, *d_fc2_w, *d_fc2_b;
    float *d_ln1_w, *d_ln1_b, *d_ln2_w, *d_ln2_b;
    bool recompute = false;
  };
  // One layer's saved activations (the shared set when the layer is recomputed). ln1 and ln2
  // hold all rows (gathered under sequence parallelism); mid holds this rank's rows.
  struct Acts {
    bf16 *ln1, *qkv, *att, *mid, *ln2, *pre, *gelu;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *stats;
  };
  // One micro-batch in flight.
  struct Slot {
    MicroBatch mb;
    bool has_grad = false;
    float grad_scale = 0.0f;
    int32_t *tokens = nullptr, *labels = nullptr;  // all rows
    // Pinned staging of tokens and labels, reused once the previous copy from it has run.
    int32_t* host_ids = nullptr;
    cudaEvent_t ids_copied = nullptr;
    std::vector<bf16*> x;  // [layers + 1] residual stream, this rank's rows
    std::vector<Acts> acts;
    bf16 *lnf = nullptr, *dlnf = nullptr;  // last stage
    float *lnf_mean = nullptr, *lnf_rstd = nullptr, *losses = nullptr;
  };

  template <typename T>
  T* Alloc(size_t n) {
    void* p = nullptr;
    LT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    LT_CUDA_CHECK(cudaMemsetAsync(p, 0, std::max<size_t>(n, 1) * sizeof(T), MainStream()));
    allocations_.push_back(p);
    activation_bytes_ += static_cast<int64_t>(n * sizeof(T));
    return static_cast<T*>(p);
  }
  Acts MakeActs();
  Slot& GetSlot(int index);
  HiddenDropout Drop(const Slot& s, int global_layer, int site) const;
  // Tensor/sequence parallel collectives (bf16). Every one runs on tp_stream_, ordered after the
  // compute stream's work so far; the compute stream waits for it at WaitTp (where exposed
  // communication is timed), so TP collectives never run concurrently with each other.
  //   GatherRows: this rank's rows [rows_l, h] (already in place inside `full`) → all rows.
  //   GatherRowsFrom: SP: this rank's rows `local` → all rows in `full`; without SP `full` is
  //     `local`.
  //   ReduceRows: partial sums over all rows → this rank's rows summed (into `local`, which may be
  //     `full` without SP); with wait = false the caller overlaps it with work that does not
  //     touch either buffer and calls WaitTp before reading the result.
  //   GatherRun: under SP, all-gathers `full` (this rank's rows in place) around the TP ring and
  //     runs gemm(first_row, rows) on each block of rows as soon as it is present, so the
  //     transfer of the next block overlaps the product on this one; otherwise gemm(0, n).
  void GatherRows(bf16* full);
  void GatherRowsFrom(const bf16* local, bf16* full);
  void ReduceRows(bf16* full, bf16* local, bool wait = true);
  void GatherRun(bf16* full, const char* op, const std::function<void(int64_t, int64_t)>& gemm);
  // A row-parallel product's output summed over TP: gemm(first_row, rows) writes partial sums of
  // those rows into branch_. The sum of this rank's rows is then branch_l_ plus the returned
  // addend (null when branch_l_ holds it alone). Under SP on two ranks the rows the peer keeps
  // are computed first and sent while this rank's are computed (the addend is the peer's partial
  // sums of this rank's rows); otherwise a reduce-scatter or all-reduce follows the product.
  const bf16* RowParallelForward(const char* op, const std::function<void(int64_t, int64_t)>& gemm);
  // A column-parallel linear's input gradient dln_ = dout·W (dout [rows, n], partial sums over
  // TP) reduced to this rank's rows (all rows without SP), with weight_grad() computed meanwhile.
  void ColumnParallelBackward(const char* op, const bf16* dout, const bf16* weight, int64_t n,
                              const std::function<void()>& weight_grad);
  void TpAllReduce(float* data, int64_t n, ReduceOp op);
  // On tp_stream_, one NCCL group: `count` bf16 from `send` to TP rank `to`, into `recv` from
  // rank `from`.
  void TpSendRecv(const char* op, const bf16* send, int to, bf16* recv, int from, size_t count);
  void TpFollowMain();  // tp_stream_ waits for the compute stream's work so far
  void WaitTp();        // the compute stream waits for tp_stream_
  bf16* LocalRows(bf16* full) const { return full + row_offset_ * h_; }
  void LayerForward(Slot& s, int l);
  void LayerBackward(Slot& s, int l);
  // LayerNorm backward at a residual site: dx_ = dresidual + the norm's input gradient, and the
  // branch's output gradient (dx_ through the site's dropout) in dbranch_. With no dropout there
  // and no SP the two are equal: only dx_ is written and branch_grad_ points the branch at it.
  void NormBackward(float* dw, float* db, const bf16* dout, const bf16* dresidual, const bf16* x,
                    const float* w, const float* mean, const float* rstd,
                    const HiddenDropout& drop);
  // Closes layer l: x[l+1] = mid + dropout(mlp output), then LayerNorm into `out` (all rows).
  void ResidualNorm(Slot& s, int l, bf16* out, float* mean, float* rstd, const float* w,
                    const float* b, bool gather);
  // LayerNorm of this rank's rows of x into `out_full`'s slot for them, then gathered when
  // `gather` (the layers' own norms leave it to the GatherRun of the product that reads them).
  void NormGather(bf16* out_full, float* mean, float* rstd, const bf16* residual,
                  const bf16* branch, bf16* x_out, const float* w, const float* b,
                  const HiddenDropout& d, bool gather, const bf16* branch2 = nullptr);
  void HeadForward(Slot& s);
  // dW += doutᵀ·in and db += Σ_rows dout (db may be null): the bias gradient from cuBLASLt's
  // epilogue when it has one for this shape, else a column-sum kernel.
  void WeightGrad(float* dw, float* db, const bf16* dout, const bf16* in, int64_t k, int64_t n);
  // Bias of a row-parallel linear: added once (TP rank 0) before the partial sums are reduced.
  const bf16* RowParallelBias(const bf16* b) const { return tp_rank_ == 0 ? b : nullptr; }
  Scratch scratch() const { return {scratch_, scratch_bytes_}; }

  const ckpt::ModelLayout& layout_;
  ParamStore* params_;
  BF16Options opt_;
  std::unique_ptr<FlashAttention> attention_;
  Matmul mm_;
  OpProfile prof_;
  NcclCommunicator* tp_ = nullptr;  // null without tensor parallelism
  cudaStream_t tp_stream_ = nullptr;
  cudaEvent_t tp_main_ready_ = nullptr, tp_done_ = nullptr;
  std::vector<cudaEvent_t> ring_events_;  // one per ring step
  bool tp_pending_ = false;
  // LEANTRON_TP_OVERLAP=0: every TP collective waited for where it is issued (for comparison).
  bool tp_overlap_ = true;
  // Under SP on one node: blocks moved by the copy engines (LEANTRON_TP_COPY_ENGINE=0: by NCCL).
  std::unique_ptr<PeerExchange> exchange_;
  // SMs planned for the products that run beside a TP transfer (LEANTRON_TP_SM_MARGIN: SMs left
  // to NCCL; 0: the whole device).
  int overlap_sms_ = 0;
  // Plans the products issued while it lives for overlap_sms_.
  struct OverlapSms {
    OverlapSms(Matmul& mm, int sms) : mm_(mm), saved_(mm.sm_target()) { mm_.set_sm_target(sms); }
    ~OverlapSms() { mm_.set_sm_target(saved_); }
    Matmul& mm_;
    int saved_;
  };
  int tp_size_ = 1, tp_rank_ = 0;
  bool sp_ = false, first_stage_ = true, last_stage_ = true;
  int first_layer_ = 0;
  int64_t b_, t_, n_, rows_l_, row_offset_, h_, heads_l_, head_dim_, ffn_l_, vocab_l_, vocab_begin_;
  float eps_;
  bool tanh_gelu_;
  std::vector<Weights> layers_;
  std::vector<void*> allocations_;
  int64_t activation_bytes_ = 0;

  // bf16 copy of the whole flat parameter buffer, shared by the chunks of a stage (the first one
  // allocates it; the optimizer keeps it in step); converted anew after the fp32 weights were
  // rewritten, gathered from the other DP ranks after a distributed-optimizer step.
  bf16* w16_ = nullptr;
  bool owns_w16_ = false;
  uint64_t w16_version_ = 0;  // ParamStore::weights_version() it reflects
  StageTensors<bf16> stage_;  // embeddings, final norm, output layer (bf16 copy)

  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<Acts> shared_acts_;  // recomputed layers
  bf16* shared_gelu_ = nullptr;        // --recompute-gelu
  int32_t* positions_ = nullptr;       // this rank's rows
  bf16 *branch_, *branch_l_, *branch_peer_ = nullptr, *junk_, *lnf_full_, *dlnf_full_, *logits_;
  const bf16* mlp_addend_ = nullptr;  // RowParallelForward's addend for the MLP output
  float *ce_part_, *ce_max_, *ce_sums_;
  double* loss_sum_ = nullptr;       // Σ micro-batch losses this step (last stage), on the device
  double* host_loss_sum_ = nullptr;  // pinned
  bool loss_pending_ = false;
  // Backward scratch (one backward at a time).
  bf16 *dx_, *dbranch_, *dbranch_full_, *dln_, *dqkv_, *datt_, *dfc_;
  const bf16* branch_grad_ = nullptr;  // all rows of the branch's output gradient: see NormBackward
  bf16 *recv_input_, *recv_grad_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* attn_workspace_ = nullptr;
  float* bias_grad_ = nullptr;  // [max width], the epilogue's bias gradient before it is added
  int64_t chunk_rows_;
  std::unique_ptr<GradReducer> reducer_;
  int backwards_this_step_ = 0;
  int64_t measured_steps_ = 0;
  double comm_ms_ = 0.0, exposed_ms_ = 0.0;
};

}  // namespace leantron::trainer::cuda::detail
