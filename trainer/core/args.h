// The `train` command line: Megatron's pretrain_gpt.py flag names (../shared/specs/trainer.md),
// parsed with CLI11 and checked as a whole before any work starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libckpt/layout.h"
#include "libckpt/model_config.h"

namespace CLI {
class App;
}

namespace leantron::trainer {

struct TrainArgs {
  // Model.
  int64_t num_layers = 0, hidden_size = 0, num_attention_heads = 0, ffn_hidden_size = 0;
  int64_t seq_length = 0, max_position_embeddings = 0, kv_channels = 0;
  bool openai_gelu = false;
  // Llama-style choices (Megatron's flags): RMSNorm, SwiGLU, RoPE, grouped-query attention,
  // untied output layer, no linear biases.
  std::string normalization = "LayerNorm", position_embedding_type = "learned_absolute";
  bool swiglu = false, group_query_attention = false, untie_embeddings = false;
  bool disable_bias_linear = false, add_qkv_bias = false;
  int64_t num_query_groups = 0;
  double rotary_base = 10000.0;
  // Megatron's --use-rope-scaling / --rope-scaling-factor: Llama 3.1's scaling of the rotary
  // frequencies (low_freq_factor 1, high_freq_factor 4, original context 8192).
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  double init_method_std = 0.02, hidden_dropout = 0.1, attention_dropout = 0.1;
  int64_t make_vocab_size_divisible_by = 128;
  double norm_epsilon = 1e-5;
  std::string tokenizer_type = "GPT2BPETokenizer";
  int64_t vocab_size = 0;  // NullTokenizer's and TikTokenizer's --vocab-size
  std::string vocab_file, merge_file;
  // HuggingFaceTokenizer, TikTokenizer, SentencePiece types: the tokenizer is loaded by
  // ValidateTrainArgs for its vocabulary size and EOD (libdata/tokenizer.h).
  std::string tokenizer_model, tiktoken_pattern;
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> tokenizer_special_tokens;
  int64_t tokenizer_vocab_size = 0;  // derived: the loaded tokenizer's vocabulary (0: not loaded)
  int64_t eod_id = -1;               // derived: the tokenizer's EOD (-1: none)
  // Parallelism.
  int tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1;
  int context_parallel_size = 1;
  std::string cp_comm_type = "p2p";                   // p2p, all_gather or a2a (context_parallel.h)
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0: no interleaving
  // Megatron-Core's uneven split: layers of the first / last pipeline stage (unset: even split).
  std::optional<int64_t> decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers;
  bool sequence_parallel = false, use_distributed_optimizer = false;
  // As Megatron-FSDP spells it: what the data-parallel ranks shard. no_shard (plain DP), optim
  // (--use-distributed-optimizer: the fp32 weights and Adam moments), optim_grads (ZeRO-2: the
  // gradients too), optim_grads_params (ZeRO-3: and the weights the model computes with);
  // empty: optim with --use-distributed-optimizer, else no_shard.
  std::string data_parallel_sharding_strategy;
  // Megatron's --optimizer-cpu-offload: the fp32 weights, the Adam moments and the step on the
  // host, for --optimizer-offload-fraction of the parameters (the last tensors; the GPU steps
  // the others).
  bool optimizer_cpu_offload = false;
  double optimizer_offload_fraction = 1.0;
  int nproc_per_node = 0;
  // Communication timeouts: an operation making no progress, the rendezvous, a silent peer.
  double distributed_timeout_minutes = 10.0;
  int rendezvous_timeout_seconds = 300, heartbeat_timeout_seconds = 20;
  std::string recompute_granularity, recompute_method;  // empty: none
  int64_t recompute_num_layers = 0;
  // What selective recomputation redoes (Megatron's names): core_attn, layernorm.
  std::vector<std::string> recompute_modules = {"core_attn"};
  bool overlap_grad_reduce = false, overlap_param_gather = false, grad_reduce_in_bf16 = false;
  // Two GPUs of one node move overlapped tensor-parallel blocks and data-parallel gradients by
  // copy engine unless these say NCCL (as across nodes or with more ranks).
  bool no_tp_copy_engine = false, no_dp_copy_engine = false;
  // Megatron's --tp-comm-overlap: always on here, accepted so Megatron scripts run.
  bool tp_comm_overlap = false;
  // Megatron's --deterministic-mode: also no timing-based choice of cuBLASLt algorithms.
  bool deterministic_mode = false;
  // Training.
  int64_t micro_batch_size = 1, global_batch_size = 0, train_iters = 0;
  double lr = 0.0, min_lr = 0.0, lr_warmup_init = 0.0;
  std::string lr_decay_style = "linear", lr_wsd_decay_style = "exponential";
  int64_t lr_warmup_iters = 0, lr_decay_iters = 0, lr_wsd_decay_iters = 0;
  double weight_decay = 0.01, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double clip_grad = 1.0;
  uint32_t seed = 1234;
  int64_t ddp_bucket_size = 40000000;
  // Data and checkpoints.
  std::vector<std::string> data_path;
  std::string split = "969, 30, 1";
  bool mock_data = false;
  // The long-context companions, as Megatron's get_ltor_masks_and_position_ids defines them:
  // positions restart and attention stops after each EOD token; no loss where the input is EOD.
  bool reset_position_ids = false, reset_attention_mask = false, eod_mask_loss = false;
  std::string data_cache_path;
  std::string save, load;
  int64_t save_interval = 0;
  int64_t exit_interval = 0;
  bool no_load_optim = false, no_load_rng = false, finetune = false;
  bool no_verify_checkpoint = false;  // --load: structure only (libckpt CheckpointReadOptions)
  // Logging and evaluation.
  int64_t log_interval = 100, eval_interval = 1000, eval_iters = 100;
  bool log_throughput = false;
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  // "cpu" or "cuda"; empty = cuda with --bf16, else cpu.
  std::string backend;
  bool bf16 = false;            // bf16 compute, fp32 main weights (cuda backend)
  bool recompute_gelu = false;  // bf16 model: rebuild GELU's output in the backward
  int timing_log_level = 0;     // 2: the bf16 model times every op and prints the table
  // FP8 linear layers of the bf16 model (Megatron's names and defaults; empty format: off).
  std::string fp8_format, fp8_recipe = "delayed", fp8_amax_compute_algo = "most_recent";
  int fp8_amax_history_len = 1, fp8_margin = 0;
  bool first_last_layers_bf16 = false;
  int num_layers_at_start_in_bf16 = 1, num_layers_at_end_in_bf16 = 1;
  bool fp8_output_layer = false;  // the output layer's products in FP8 too
  // Megatron flags this trainer knows but does not implement yet: parsed so the user gets a
  // sentence saying so instead of "unknown option".
  struct Unsupported {
    bool fp16 = false;
  } unsupported;

  int world_size = 1;  // from the launcher; DP = world / (TP·CP·PP)
  int data_parallel_size() const {
    return world_size /
           (tensor_model_parallel_size * context_parallel_size * pipeline_model_parallel_size);
  }
  int virtual_pipeline_size() const {
    return num_layers_per_virtual_pipeline_stage == 0
               ? 1
               : static_cast<int>(num_layers / (pipeline_model_parallel_size *
                                                num_layers_per_virtual_pipeline_stage));
  }
  int64_t num_micro_batches() const {
    return global_batch_size / (micro_batch_size * data_parallel_size());
  }
  // The tokenizer's vocabulary (before padding).
  int64_t true_vocab_size() const;
};

// Registers every flag on `app`.
void AddTrainFlags(CLI::App& app, TrainArgs* args);
// Fills derived defaults and refuses inconsistent settings with one line naming the numbers.
absl::Status ValidateTrainArgs(TrainArgs* args);
// The model config libckpt names and shards.
ckpt::ModelConfig ModelConfigFromArgs(const TrainArgs& args);
// Its parallel layout: TP, PP, VPP and the uneven first/last stage (0 when unset).
ckpt::ParallelConfig ParallelConfigFromArgs(const TrainArgs& args);
// The arguments that decide the numbers of a run, as one JSON object for checkpoint metadata.
std::string TrainArgsToJson(const TrainArgs& args);

}  // namespace leantron::trainer
