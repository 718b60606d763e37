#include "trainer/core/args.h"

#include <cmath>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libdata/tokenizer.h"
#include "trainer/core/context_parallel.h"
#include "trainer/core/scheduler.h"

namespace leantron::trainer {

int64_t TrainArgs::true_vocab_size() const {
  if (tokenizer_type == "NullTokenizer") return vocab_size + 1;  // Megatron adds the EOD id
  if (tokenizer_vocab_size > 0) return tokenizer_vocab_size;
  return 50257;
}

void AddTrainFlags(CLI::App& app, TrainArgs* a) {
  // As with Megatron's argparse, a repeated flag takes its last value.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // Model.
  app.add_option("--num-layers", a->num_layers, "Transformer layers");
  app.add_option("--hidden-size", a->hidden_size, "Hidden size");
  app.add_option("--num-attention-heads", a->num_attention_heads, "Attention heads");
  app.add_option("--ffn-hidden-size", a->ffn_hidden_size, "MLP hidden size (default 4·hidden)");
  app.add_option("--kv-channels", a->kv_channels, "Head dimension (default hidden/heads)");
  app.add_option("--seq-length", a->seq_length, "Sequence length");
  app.add_option("--max-position-embeddings", a->max_position_embeddings,
                 "Position table size (default --seq-length)");
  app.add_flag("--openai-gelu", a->openai_gelu, "tanh GELU (GPT-2's gelu_new) instead of erf");
  app.add_option("--init-method-std", a->init_method_std, "Init std (default 0.02)");
  app.add_option("--hidden-dropout", a->hidden_dropout, "Hidden dropout (default 0.1)");
  app.add_option("--attention-dropout", a->attention_dropout, "Attention dropout (default 0.1)");
  app.add_option("--make-vocab-size-divisible-by", a->make_vocab_size_divisible_by,
                 "Vocabulary padding unit (default 128)");
  app.add_option("--norm-epsilon,--layernorm-epsilon", a->norm_epsilon, "LayerNorm epsilon");
  app.add_option("--tokenizer-type", a->tokenizer_type,
                 "GPT2BPETokenizer (vocab 50257), NullTokenizer (--vocab-size ids + EOD), or "
                 "HuggingFaceTokenizer, TikTokenizer, SentencePieceTokenizer, Llama2Tokenizer, "
                 "GPTSentencePieceTokenizer (--tokenizer-model; vocabulary size and EOD read "
                 "from it)");
  app.add_option("--vocab-size", a->vocab_size,
                 "NullTokenizer vocabulary size; TikTokenizer (v1/v2) vocabulary size");
  app.add_option("--vocab-file", a->vocab_file, "GPT-2 vocab.json (only the size is used)");
  app.add_option("--merge-file", a->merge_file, "GPT-2 merges.txt (only the size is used)");
  app.add_option("--tokenizer-model", a->tokenizer_model,
                 "tokenizer.json (or its folder), tiktoken ranks, or SentencePiece model");
  app.add_option("--tiktoken-pattern", a->tiktoken_pattern, "TikTokenizer pattern");
  app.add_option("--tiktoken-num-special-tokens", a->tiktoken_num_special_tokens,
                 "TikTokenizer (v1/v2) special tokens");
  app.add_option("--tokenizer-special-tokens", a->tokenizer_special_tokens,
                 "TikTokenizer (v1/v2) special tokens");
  // Parallelism.
  app.add_option("--tensor-model-parallel-size", a->tensor_model_parallel_size, "TP size");
  app.add_option("--pipeline-model-parallel-size", a->pipeline_model_parallel_size, "PP size");
  app.add_option("--num-layers-per-virtual-pipeline-stage",
                 a->num_layers_per_virtual_pipeline_stage,
                 "Layers per model chunk: the interleaved 1F1B schedule");
  app.add_option("--decoder-first-pipeline-num-layers", a->decoder_first_pipeline_num_layers,
                 "Layers on the first pipeline stage; the others split the rest evenly");
  app.add_option("--decoder-last-pipeline-num-layers", a->decoder_last_pipeline_num_layers,
                 "Layers on the last pipeline stage (which also holds the output layer and loss); "
                 "the others split the rest evenly");
  app.add_flag("--sequence-parallel", a->sequence_parallel, "Sequence parallelism (needs TP > 1)");
  app.add_option("--context-parallel-size", a->context_parallel_size,
                 "Split each sequence over this many ranks (context parallelism; default 1)");
  app.add_option("--cp-comm-type", a->cp_comm_type,
                 "How context-parallel attention exchanges keys and values: p2p (ring, default), "
                 "all_gather or a2a (heads split over CP)");
  app.add_flag("--use-distributed-optimizer", a->use_distributed_optimizer,
               "Shard optimizer state over data-parallel ranks (ZeRO-1)");
  app.add_option("--data-parallel-sharding-strategy", a->data_parallel_sharding_strategy,
                 "What data-parallel ranks shard: no_shard, optim (the distributed optimizer's "
                 "default: fp32 weights and Adam moments), optim_grads (the gradients too, ZeRO-2) "
                 "or optim_grads_params (and the weights the model computes with, gathered per "
                 "layer before use, ZeRO-3); needs --use-distributed-optimizer beyond no_shard");
  app.add_flag("--optimizer-cpu-offload", a->optimizer_cpu_offload,
               "bf16 model: keep the fp32 weights and Adam moments in host memory and step them "
               "there (the GPU holds the bf16 weights and the gradients)");
  app.add_option("--optimizer-offload-fraction", a->optimizer_offload_fraction,
                 "With --optimizer-cpu-offload: the share of the parameters (the last tensors, "
                 "rounded up to whole ones) whose optimizer runs on the host; the GPU steps the "
                 "others, at the same time");
  app.add_option("--nproc-per-node", a->nproc_per_node,
                 "Start this many local ranks (one process each) and wait for them");
  app.add_option("--distributed-timeout-minutes", a->distributed_timeout_minutes,
                 "A communication that makes no progress for this long stops the run with one line "
                 "naming it (default 10)");
  app.add_option(
      "--rendezvous-timeout-seconds", a->rendezvous_timeout_seconds,
      "How long the ranks may take to meet and create their communicators (default 300)");
  app.add_option(
      "--heartbeat-timeout-seconds", a->heartbeat_timeout_seconds,
      "GPU runs: a rank silent this long counts as dead and stops the others (default 20)");
  app.add_option("--recompute-granularity", a->recompute_granularity,
                 "full (whole layers) or selective (--recompute-modules)");
  app.add_option("--recompute-modules", a->recompute_modules,
                 "With --recompute-granularity selective, what to recompute in the backward: "
                 "core_attn (the float32 model's attention softmax; flash attention keeps none), "
                 "layernorm (the bf16 model's norm outputs), mlp (the bf16 model's fc1 and "
                 "activation outputs). Default core_attn")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--recompute-method", a->recompute_method,
                 "uniform (every layer) or block (the first --recompute-num-layers per stage)");
  app.add_option("--recompute-num-layers", a->recompute_num_layers,
                 "Layers per recomputed block (uniform) or recomputed per stage (block)");
  app.add_flag("--overlap-grad-reduce", a->overlap_grad_reduce,
               "bf16 model: all-reduce gradient buckets during the backward");
  app.add_flag("--overlap-param-gather", a->overlap_param_gather,
               "bf16 model with the distributed optimizer: each layer's forward waits only for "
               "its own gathered weights, the rest arriving meanwhile");
  app.add_option("--ddp-bucket-size", a->ddp_bucket_size, "Gradient all-reduce bucket (elements)");
  app.add_flag("--no-tp-copy-engine", a->no_tp_copy_engine,
               "bf16 model: overlapped tensor-parallel blocks between two GPUs of one node go "
               "through NCCL instead of the copy engines (as they do across nodes)");
  app.add_flag("--no-dp-copy-engine", a->no_dp_copy_engine,
               "bf16 model: data-parallel gradients between two GPUs of one node go through NCCL "
               "instead of the copy engines (as they do across nodes or with more ranks)");
  app.add_flag("--tp-comm-overlap", a->tp_comm_overlap,
               "Accepted: the bf16 model always overlaps tensor-parallel communication with the "
               "products beside it");
  app.add_flag("--deterministic-mode", a->deterministic_mode,
               "Bitwise repeatable runs: the bf16 model takes cuBLASLt's heuristic algorithm for "
               "each product instead of timing candidates at start-up, and cuDNN's deterministic "
               "attention backward (slower, with a [B, H, T, T] buffer)");
  app.add_option("--timing-log-level", a->timing_log_level,
                 "2: the bf16 model times every op on the GPU and prints the table at the end");
  app.add_flag("--grad-reduce-in-bf16", a->grad_reduce_in_bf16,
               "bf16 model: data-parallel gradients cross rounded to bf16 (half the bytes)");
  // Training.
  app.add_option("--micro-batch-size", a->micro_batch_size, "Micro-batch size");
  app.add_option("--global-batch-size", a->global_batch_size, "Global batch size");
  app.add_option("--train-iters", a->train_iters, "Training iterations");
  app.add_option("--lr", a->lr, "Peak learning rate");
  app.add_option("--min-lr", a->min_lr, "Final learning rate");
  app.add_option("--lr-warmup-init", a->lr_warmup_init, "Learning rate at warm-up start");
  app.add_option("--lr-decay-style", a->lr_decay_style, "constant, linear, cosine or WSD");
  app.add_option("--lr-warmup-iters", a->lr_warmup_iters, "Warm-up iterations");
  app.add_option("--lr-decay-iters", a->lr_decay_iters, "Decay iterations (default --train-iters)");
  app.add_option("--lr-wsd-decay-style", a->lr_wsd_decay_style,
                 "WSD anneal: linear, cosine, exponential, minus_sqrt");
  app.add_option("--lr-wsd-decay-iters", a->lr_wsd_decay_iters, "WSD anneal iterations");
  app.add_option("--weight-decay", a->weight_decay, "Weight decay (default 0.01)");
  app.add_option("--adam-beta1", a->adam_beta1, "Adam beta1 (default 0.9)");
  app.add_option("--adam-beta2", a->adam_beta2, "Adam beta2 (default 0.999)");
  app.add_option("--adam-eps", a->adam_eps, "Adam epsilon (default 1e-8)");
  app.add_option("--clip-grad", a->clip_grad, "Gradient clipping norm (default 1.0, 0 = off)");
  app.add_option("--seed", a->seed, "Random seed (default 1234)");
  // Data and checkpoints.
  app.add_option("--data-path", a->data_path, "PREFIX or W1 PREFIX1 W2 PREFIX2 ...")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--split", a->split, "Train/valid/test proportions (default 969,30,1)");
  app.add_flag("--mock-data", a->mock_data, "Synthetic samples instead of --data-path");
  app.add_flag("--reset-position-ids", a->reset_position_ids,
               "Positions restart after each end-of-document token");
  app.add_flag("--reset-attention-mask", a->reset_attention_mask,
               "Attention stays inside the documents an end-of-document token ends");
  app.add_flag("--eod-mask-loss", a->eod_mask_loss,
               "No loss where the input token is the end-of-document token");
  app.add_option("--data-cache-path", a->data_cache_path, "Where the sample index cache lives");
  app.add_option("--save", a->save, "Checkpoint directory to save to");
  app.add_option("--load", a->load, "Checkpoint directory to load from");
  app.add_option("--save-interval", a->save_interval, "Save every N iterations");
  app.add_option("--exit-interval", a->exit_interval,
                 "Save (with --save) and exit when the iteration is a multiple of this");
  app.add_flag("--no-load-optim", a->no_load_optim, "Do not load optimizer state");
  app.add_flag("--no-load-rng", a->no_load_rng,
               "Accepted for compatibility: dropout masks are a function of the sample, so there "
               "is no RNG state to load");
  app.add_flag("--no-verify-checkpoint", a->no_verify_checkpoint,
               "Skip the content checks of --load (checksums, NaN, replicated copies)");
  app.add_flag("--finetune", a->finetune,
               "Load weights only; start at iteration 0 with fresh optimizer and data position");
  // Logging and evaluation.
  app.add_option("--log-interval", a->log_interval, "Log every N iterations (default 100)");
  app.add_option("--eval-interval", a->eval_interval, "Evaluate every N iterations (default 1000)");
  app.add_option("--eval-iters", a->eval_iters, "Batches per evaluation (default 100)");
  app.add_flag("--log-throughput", a->log_throughput, "Add TFLOP/s and tokens/s to the log line");
  app.add_option("--tensorboard-dir", a->tensorboard_dir,
                 "Write TensorBoard scalar events (loss, learning rate, grad norm, ...) here");
  app.add_option("--tensorboard-log-interval", a->tensorboard_log_interval,
                 "Write TensorBoard scalars every N iterations (default 1)");
  app.add_option("--ops-backend", a->backend,
                 "cpu (float32 reference) or cuda; default cuda with --bf16, else cpu");
  app.add_flag("--bf16", a->bf16,
               "bf16 compute with fp32 main weights and gradients (cuda backend)");
  app.add_flag("--recompute-gelu", a->recompute_gelu,
               "bf16 model: keep GELU's input only and recompute its output in the backward");
  app.add_option("--fp8-format", a->fp8_format,
                 "bf16 model: linear layers' products in FP8: e4m3 (everywhere) or hybrid (E4M3 "
                 "forward, E5M2 gradients)");
  app.add_option("--fp8-recipe", a->fp8_recipe,
                 "delayed (scales from the amax history, default) or tensorwise (each tensor's "
                 "own amax)");
  app.add_option("--fp8-amax-history-len", a->fp8_amax_history_len,
                 "Delayed scaling: steps of amax history (default 1)");
  app.add_option("--fp8-amax-compute-algo", a->fp8_amax_compute_algo,
                 "Delayed scaling: most_recent (default) or max over the history");
  app.add_option("--fp8-margin", a->fp8_margin, "Scales divided by 2^margin (default 0)");
  app.add_flag("--first-last-layers-bf16", a->first_last_layers_bf16,
               "Keep the first and last transformer layers in bf16 under --fp8-format");
  app.add_option("--num-layers-at-start-in-bf16", a->num_layers_at_start_in_bf16,
                 "With --first-last-layers-bf16: layers at the start kept in bf16 (default 1)");
  app.add_option("--num-layers-at-end-in-bf16", a->num_layers_at_end_in_bf16,
                 "With --first-last-layers-bf16: layers at the end kept in bf16 (default 1)");
  app.add_flag("--fp8-output-layer", a->fp8_output_layer,
               "Under --fp8-format: the output layer's products in FP8 too (default bf16)");
  app.add_option("--normalization", a->normalization, "LayerNorm or RMSNorm");
  app.add_option("--position-embedding-type", a->position_embedding_type,
                 "learned_absolute or rope");
  app.add_option("--rotary-base", a->rotary_base, "RoPE base (default 10000)");
  app.add_flag("--use-rope-scaling", a->use_rope_scaling,
               "Llama 3.1's rope scaling (HF rope_type llama3: low_freq_factor 1, high_freq_factor "
               "4, original context 8192)");
  app.add_option("--rope-scaling-factor", a->rope_scaling_factor,
                 "Its factor (default 8; Llama 3.2's is 32)");
  app.add_flag("--swiglu", a->swiglu, "SwiGLU MLP (silu(gate)·up)");
  app.add_flag("--group-query-attention", a->group_query_attention, "Grouped-query attention");
  app.add_option("--num-query-groups", a->num_query_groups, "Query groups (with GQA)");
  app.add_flag("--untie-embeddings-and-output-weights", a->untie_embeddings,
               "Separate output layer");
  app.add_flag("--disable-bias-linear", a->disable_bias_linear, "No biases on linear layers");
  app.add_flag("--add-qkv-bias", a->add_qkv_bias, "QKV bias even with --disable-bias-linear");
  // Known, not implemented.
  TrainArgs::Unsupported& u = a->unsupported;
  app.add_flag("--fp16", u.fp16, "(not implemented: use --bf16)");
}

namespace {

// --fp8-format and its companions.
absl::Status ValidateFp8(const TrainArgs& a) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (a.fp8_format.empty()) {
    if (a.fp8_output_layer) return bad("--fp8-output-layer needs --fp8-format");
    return absl::OkStatus();
  }
  if (a.fp8_format != "e4m3" && a.fp8_format != "hybrid")
    return bad("--fp8-format must be e4m3 or hybrid, not ", a.fp8_format);
  if (a.fp8_output_layer && a.fp8_format != "hybrid")
    return bad(
        "--fp8-output-layer needs --fp8-format hybrid: the logits' gradient, spread over the "
        "vocabulary by the softmax, needs E5M2's range");
  if (a.fp8_recipe == "mxfp8" || a.fp8_recipe == "blockwise")
    return bad("--fp8-recipe ", a.fp8_recipe,
               " is not implemented (block scales); use delayed or tensorwise");
  if (a.fp8_recipe != "delayed" && a.fp8_recipe != "tensorwise")
    return bad("--fp8-recipe must be delayed or tensorwise, not ", a.fp8_recipe);
  if (a.fp8_amax_compute_algo != "most_recent" && a.fp8_amax_compute_algo != "max")
    return bad("--fp8-amax-compute-algo must be most_recent or max, not ", a.fp8_amax_compute_algo);
  if (a.fp8_amax_history_len < 1 || a.fp8_amax_history_len > 1 << 16)
    return bad("--fp8-amax-history-len must be in [1, 65536], not ", a.fp8_amax_history_len);
  if (a.fp8_margin < 0 || a.fp8_margin > 64)
    return bad("--fp8-margin must be in [0, 64], not ", a.fp8_margin);
  if (!a.bf16 || (!a.backend.empty() && a.backend != "cuda"))
    return bad("--fp8-format needs the bf16 model on GPUs (--bf16, --ops-backend cuda)");
  if (a.first_last_layers_bf16 &&
      (a.num_layers_at_start_in_bf16 < 0 || a.num_layers_at_end_in_bf16 < 0 ||
       a.num_layers_at_start_in_bf16 + a.num_layers_at_end_in_bf16 > a.num_layers))
    return bad("--num-layers-at-start-in-bf16 ", a.num_layers_at_start_in_bf16,
               " and --num-layers-at-end-in-bf16 ", a.num_layers_at_end_in_bf16,
               " must be non-negative and sum to at most --num-layers ", a.num_layers);
  return absl::OkStatus();
}

// --context-parallel-size, --cp-comm-type and the long-context companions (which need an EOD).
absl::Status ValidateContextParallel(const TrainArgs& a) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  const int cp = a.context_parallel_size, tp = a.tensor_model_parallel_size;
  absl::StatusOr<CpCommType> type = ParseCpCommType(a.cp_comm_type);
  if (!type.ok()) return type.status();
  if (cp > 1 && a.seq_length % (2 * cp) != 0)
    return bad("--seq-length ", a.seq_length, " is not divisible by 2 x CP ", cp,
               " (each CP rank holds two of 2 x CP equal chunks of a sequence)");
  if (cp > 1 && *type == CpCommType::kAllToAll && (a.num_query_groups / tp) % cp != 0) {
    return bad("--cp-comm-type a2a splits each TP rank's query groups over CP: ",
               a.num_query_groups / tp, " query group(s) per TP rank (--num-query-groups ",
               a.num_query_groups, " / TP ", tp, ") is not divisible by CP ", cp);
  }
  if (a.bf16 && (cp > 1 || a.reset_attention_mask || a.reset_position_ids)) {
    return bad(cp > 1
                   ? "--context-parallel-size > 1"
                   : (a.reset_attention_mask ? "--reset-attention-mask" : "--reset-position-ids"),
               " runs on the float32 model so far (drop --bf16: --ops-backend cpu, or cuda in "
               "float32); the bf16 model's context-parallel and document-masked attention are not "
               "built yet");
  }
  if ((a.reset_position_ids || a.reset_attention_mask || a.eod_mask_loss) && a.eod_id < 0) {
    return bad(
        "--reset-position-ids, --reset-attention-mask and --eod-mask-loss need an "
        "end-of-document token, and ",
        a.tokenizer_type, " has none");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTrainArgs(TrainArgs* a) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  // NaN passes every comparison below and infinity most; either would train to NaN weights (and
  // write them, and the flag, into metadata.json, which JSON cannot hold).
  for (auto [flag, v] : {std::pair{"--lr", a->lr},
                         {"--min-lr", a->min_lr},
                         {"--lr-warmup-init", a->lr_warmup_init},
                         {"--weight-decay", a->weight_decay},
                         {"--adam-beta1", a->adam_beta1},
                         {"--adam-beta2", a->adam_beta2},
                         {"--adam-eps", a->adam_eps},
                         {"--clip-grad", a->clip_grad},
                         {"--init-method-std", a->init_method_std},
                         {"--hidden-dropout", a->hidden_dropout},
                         {"--attention-dropout", a->attention_dropout},
                         {"--rotary-base", a->rotary_base},
                         {"--rope-scaling-factor", a->rope_scaling_factor},
                         {"--norm-epsilon", a->norm_epsilon}}) {
    if (!std::isfinite(v)) return bad(flag, " must be a finite number, not ", v);
  }
  for (auto [flag, v] : {std::pair{"--min-lr", a->min_lr},
                         {"--lr-warmup-init", a->lr_warmup_init},
                         {"--weight-decay", a->weight_decay},
                         {"--clip-grad", a->clip_grad},
                         {"--init-method-std", a->init_method_std},
                         {"--norm-epsilon", a->norm_epsilon}}) {
    if (v < 0) return bad(flag, " must not be negative, not ", v);
  }
  if (a->adam_beta1 < 0 || a->adam_beta1 >= 1 || a->adam_beta2 < 0 || a->adam_beta2 >= 1)
    return bad("--adam-beta1 and --adam-beta2 must be in [0, 1)");
  if (a->adam_eps <= 0) return bad("--adam-eps must be positive, not ", a->adam_eps);
  if (a->rotary_base <= 0) return bad("--rotary-base must be positive, not ", a->rotary_base);
  if (a->rope_scaling_factor <= 0)
    return bad("--rope-scaling-factor must be positive, not ", a->rope_scaling_factor);
  const TrainArgs::Unsupported& u = a->unsupported;
  if (u.fp16) return bad("--fp16 is not implemented (loss scaling); use --bf16");
  if (absl::Status s = ValidateFp8(*a); !s.ok()) return s;
  if (a->normalization != "LayerNorm" && a->normalization != "RMSNorm")
    return bad("--normalization must be LayerNorm or RMSNorm, not ", a->normalization);
  if (a->position_embedding_type != "learned_absolute" && a->position_embedding_type != "rope")
    return bad("--position-embedding-type must be learned_absolute or rope, not ",
               a->position_embedding_type);
  if (a->num_layers <= 0 || a->hidden_size <= 0 || a->num_attention_heads <= 0)
    return bad("--num-layers, --hidden-size and --num-attention-heads must be given and positive");
  if (a->seq_length <= 0) return bad("--seq-length must be given and positive");
  if (a->train_iters <= 0) return bad("--train-iters must be given and positive");
  if (a->global_batch_size <= 0) return bad("--global-batch-size must be given and positive");
  if (a->micro_batch_size <= 0) return bad("--micro-batch-size must be positive");
  if (a->lr <= 0.0) return bad("--lr must be given and positive");
  if (a->ffn_hidden_size == 0) {
    // Megatron: 4h, or with SwiGLU 2/3 of it rounded down to a multiple of 64.
    a->ffn_hidden_size = a->swiglu ? (4 * a->hidden_size * 2 / 3) / 64 * 64 : 4 * a->hidden_size;
    if (a->ffn_hidden_size == 0)
      return bad("--ffn-hidden-size must be given for this --hidden-size");
  }
  if (!a->group_query_attention) a->num_query_groups = a->num_attention_heads;
  if (a->num_query_groups <= 0 || a->num_attention_heads % a->num_query_groups != 0)
    return bad("--num-attention-heads ", a->num_attention_heads,
               " is not divisible by --num-query-groups ", a->num_query_groups);
  if (a->kv_channels == 0) {
    if (a->hidden_size % a->num_attention_heads != 0)
      return bad("--hidden-size ", a->hidden_size, " is not divisible by --num-attention-heads ",
                 a->num_attention_heads);
    a->kv_channels = a->hidden_size / a->num_attention_heads;
  }
  if (a->max_position_embeddings == 0) a->max_position_embeddings = a->seq_length;
  if (a->seq_length > a->max_position_embeddings)
    return bad("--seq-length ", a->seq_length, " exceeds --max-position-embeddings ",
               a->max_position_embeddings);
  if (a->hidden_dropout < 0 || a->hidden_dropout >= 1 || a->attention_dropout < 0 ||
      a->attention_dropout >= 1)
    return bad("dropout probabilities must be in [0, 1)");
  if (a->tokenizer_type == "NullTokenizer") {
    if (a->vocab_size <= 0) return bad("NullTokenizer needs --vocab-size");
    a->eod_id = a->vocab_size;
  } else if (a->tokenizer_type == "GPT2BPETokenizer") {
    a->eod_id = 50256;
  } else {
    // The other types are read for the vocabulary size Megatron's tokenizer reports.
    data::TokenizerOptions t;
    t.type = a->tokenizer_type;
    t.model = a->tokenizer_model;
    t.tiktoken_pattern = a->tiktoken_pattern;
    t.vocab_size = a->vocab_size;
    t.tiktoken_num_special_tokens = a->tiktoken_num_special_tokens;
    t.special_tokens = a->tokenizer_special_tokens;
    absl::StatusOr<std::unique_ptr<data::Tokenizer>> tokenizer = data::LoadTokenizer(t);
    if (!tokenizer.ok()) return tokenizer.status();
    a->tokenizer_vocab_size = (*tokenizer)->vocab_size();
    a->eod_id = (*tokenizer)->eod_id().value_or(-1);
  }
  if (!(a->distributed_timeout_minutes > 0) || a->rendezvous_timeout_seconds <= 0 ||
      a->heartbeat_timeout_seconds <= 0)
    return bad(
        "--distributed-timeout-minutes, --rendezvous-timeout-seconds and "
        "--heartbeat-timeout-seconds must be positive");
  const int tp = a->tensor_model_parallel_size, pp = a->pipeline_model_parallel_size;
  const int cp = a->context_parallel_size;
  if (tp <= 0 || pp <= 0 || cp <= 0) return bad("parallel sizes must be positive");
  if (a->world_size % (tp * cp * pp) != 0)
    return bad("world size ", a->world_size, " is not divisible by TP ", tp,
               cp > 1 ? absl::StrCat(" x CP ", cp) : "", " x PP ", pp);
  if (a->num_attention_heads % tp != 0)
    return bad("--num-attention-heads ", a->num_attention_heads, " is not divisible by TP ", tp);
  if (a->num_query_groups % tp != 0)
    return bad("--num-query-groups ", a->num_query_groups, " is not divisible by TP ", tp);
  if (a->use_rope_scaling && a->position_embedding_type != "rope")
    return bad("--use-rope-scaling needs --position-embedding-type rope");
  if (a->position_embedding_type == "rope" && a->kv_channels % 2 != 0)
    return bad("rope needs an even head dimension, not ", a->kv_channels);
  if (a->ffn_hidden_size % tp != 0)
    return bad("--ffn-hidden-size ", a->ffn_hidden_size, " is not divisible by TP ", tp);
  const std::optional<int64_t> first = a->decoder_first_pipeline_num_layers,
                               last = a->decoder_last_pipeline_num_layers;
  if (first || last) {
    // Megatron-Core's uneven split: the first and/or last stage hold what is asked, the other
    // stages share the rest evenly.
    std::string what;  // "--decoder-first-pipeline-num-layers 5 and --decoder-last-... 7"
    for (auto [flag, n] : {std::pair{"--decoder-first-pipeline-num-layers", first},
                           std::pair{"--decoder-last-pipeline-num-layers", last}}) {
      if (!n) continue;
      if (*n < 1) return bad(flag, " must be at least 1, not ", *n);
      absl::StrAppend(&what, what.empty() ? "" : " and ", flag, " ", *n);
    }
    if (pp < 2) return bad(what, " needs PP > 1");
    if (a->num_layers_per_virtual_pipeline_stage != 0)
      return bad(what, " does not work with --num-layers-per-virtual-pipeline-stage");
    const int64_t rest = a->num_layers - first.value_or(0) - last.value_or(0);
    const int others = pp - (first ? 1 : 0) - (last ? 1 : 0);
    if (others == 0 && rest != 0)
      return bad(what, " must add up to --num-layers ", a->num_layers, " with PP ", pp);
    if (others > 0 && (rest < others || rest % others != 0))
      return bad("--num-layers ", a->num_layers, " minus ", what, " leaves ", rest,
                 " layers, which do not split evenly over the other ", others, " pipeline stage",
                 others == 1 ? "" : "s", " of PP ", pp, " (at least 1 layer each)");
  } else if (a->num_layers % pp != 0) {
    return bad("--num-layers ", a->num_layers, " is not divisible by PP ", pp);
  }
  const int dp = a->data_parallel_size();
  if (a->global_batch_size % (a->micro_batch_size * dp) != 0)
    return bad("--global-batch-size ", a->global_batch_size, " is not divisible by micro-batch ",
               a->micro_batch_size, " x DP ", dp);
  if (a->num_layers_per_virtual_pipeline_stage != 0) {
    const int64_t per = a->num_layers_per_virtual_pipeline_stage;
    if (pp < 2) return bad("--num-layers-per-virtual-pipeline-stage needs PP > 1");
    if (per <= 0 || a->num_layers % (per * pp) != 0)
      return bad("--num-layers ", a->num_layers, " is not divisible by PP ", pp,
                 " x --num-layers-per-virtual-pipeline-stage ", per);
    if (a->num_micro_batches() % pp != 0)
      return bad("the interleaved schedule needs the ", a->num_micro_batches(),
                 " micro-batches per step to be divisible by PP ", pp);
  }
  if (!a->recompute_granularity.empty()) {
    if (a->recompute_granularity != "full" && a->recompute_granularity != "selective")
      return bad("--recompute-granularity must be full or selective, not ",
                 a->recompute_granularity);
    for (const std::string& m : a->recompute_modules) {
      if (m == "moe_act" || m == "moe" || m == "shared_experts" || m == "mla_up_proj")
        return bad("--recompute-modules ", m,
                   " is not implemented (core_attn, layernorm and mlp are)");
      if (m != "core_attn" && m != "layernorm" && m != "mlp")
        return bad("--recompute-modules takes core_attn, layernorm or mlp, not ", m);
    }
    if (a->recompute_granularity == "full") {
      if (a->recompute_method != "uniform" && a->recompute_method != "block")
        return bad("--recompute-granularity full needs --recompute-method uniform or block");
      if (a->recompute_num_layers <= 0)
        return bad("--recompute-granularity full needs --recompute-num-layers > 0");
    }
  }
  if (tp == 1) a->sequence_parallel = false;  // as Megatron does
  if (absl::Status s = ValidateContextParallel(*a); !s.ok()) return s;
  if (a->sequence_parallel && a->seq_length / cp % tp != 0) {
    return cp == 1 ? bad("--sequence-parallel needs --seq-length ", a->seq_length,
                         " divisible by TP ", tp)
                   : bad("--sequence-parallel needs each CP rank's ", a->seq_length / cp,
                         " tokens (--seq-length ", a->seq_length, " / CP ", cp,
                         ") divisible by TP ", tp);
  }
  if (a->mock_data == !a->data_path.empty())
    return bad("give exactly one of --data-path and --mock-data");
  if (a->lr_decay_iters == 0) a->lr_decay_iters = a->train_iters;
  if (a->lr_warmup_iters > a->lr_decay_iters)
    return bad("--lr-warmup-iters ", a->lr_warmup_iters, " exceeds --lr-decay-iters ",
               a->lr_decay_iters);
  if (absl::StatusOr<DecayStyle> s = ParseDecayStyle(a->lr_decay_style); !s.ok()) return s.status();
  if (a->lr_decay_style == "WSD") {
    if (absl::StatusOr<WsdDecayStyle> s = ParseWsdDecayStyle(a->lr_wsd_decay_style); !s.ok())
      return s.status();
    if (a->lr_wsd_decay_iters <= 0 || a->lr_wsd_decay_iters > a->lr_decay_iters)
      return bad("WSD needs 0 < --lr-wsd-decay-iters <= --lr-decay-iters");
  }
  if (a->min_lr > a->lr) return bad("--min-lr ", a->min_lr, " exceeds --lr ", a->lr);
  if (a->save_interval > 0 && a->save.empty()) return bad("--save-interval needs --save");
  if (a->log_interval <= 0 || a->eval_interval <= 0 || a->eval_iters < 0)
    return bad("--log-interval and --eval-interval must be positive, --eval-iters not negative");
  if (a->backend.empty()) a->backend = a->bf16 ? "cuda" : "cpu";
#ifdef LEANTRON_HAVE_CUDA
  if (a->backend != "cpu" && a->backend != "cuda")
    return bad("--ops-backend must be cpu or cuda, not ", a->backend);
#else
  if (a->backend != "cpu")
    return bad("--ops-backend ", a->backend, " is not in this build (cpu; built without CUDA)");
#endif
  if (a->bf16 && a->backend != "cuda") return bad("--bf16 needs --ops-backend cuda");

  if (a->grad_reduce_in_bf16 && !a->bf16) return bad("--grad-reduce-in-bf16 needs --bf16");
  std::string& sharding = a->data_parallel_sharding_strategy;
  if (sharding.empty()) sharding = a->use_distributed_optimizer ? "optim" : "no_shard";
  if (sharding != "no_shard" && sharding != "optim" && sharding != "optim_grads" &&
      sharding != "optim_grads_params")
    return bad(
        "--data-parallel-sharding-strategy must be no_shard, optim, optim_grads or "
        "optim_grads_params, not ",
        sharding);
  if (sharding == "optim_grads_params" && !a->fp8_format.empty())
    return bad(
        "--data-parallel-sharding-strategy optim_grads_params gathers the bf16 weights per layer; "
        "the FP8 layers' weight copies (--fp8-format) are not sharded: use optim_grads");
  if ((sharding == "no_shard") == a->use_distributed_optimizer)
    return bad("--data-parallel-sharding-strategy ", sharding,
               a->use_distributed_optimizer ? " contradicts --use-distributed-optimizer"
                                            : " needs --use-distributed-optimizer");
  if (!(a->optimizer_offload_fraction > 0.0 && a->optimizer_offload_fraction <= 1.0))
    return bad("--optimizer-offload-fraction must be in (0, 1], not ",
               a->optimizer_offload_fraction);
  if (a->optimizer_offload_fraction != 1.0 && !a->optimizer_cpu_offload)
    return bad("--optimizer-offload-fraction needs --optimizer-cpu-offload");
  if (a->optimizer_cpu_offload) {
    if (!a->bf16)
      return bad(
          "--optimizer-cpu-offload needs --bf16 (the float32 model computes with its "
          "fp32 weights)");
    if (sharding == "optim_grads" || sharding == "optim_grads_params")
      return bad(
          "--optimizer-cpu-offload steps whole gradients on the host; it does not go with "
          "--data-parallel-sharding-strategy ",
          sharding);
    if (a->use_distributed_optimizer && dp * cp > 1 && a->optimizer_offload_fraction != 1.0)
      return bad(
          "--optimizer-offload-fraction below 1 with --use-distributed-optimizer is implemented "
          "for one data-parallel rank (DP x CP = 1), not ",
          dp * cp, ": each rank offloads its whole part");
  }
  return absl::OkStatus();
}

ckpt::ModelConfig ModelConfigFromArgs(const TrainArgs& a) {
  ckpt::ModelConfig c;
  c.num_layers = a.num_layers;
  c.hidden_size = a.hidden_size;
  c.ffn_hidden_size = a.ffn_hidden_size;
  c.num_attention_heads = a.num_attention_heads;
  c.num_query_groups = a.num_query_groups;
  c.kv_channels = a.kv_channels;
  c.vocab_size = a.true_vocab_size();
  c.max_position_embeddings = a.max_position_embeddings;
  c.make_vocab_size_divisible_by = a.make_vocab_size_divisible_by;
  c.normalization =
      a.normalization == "RMSNorm" ? ckpt::NormType::kRMSNorm : ckpt::NormType::kLayerNorm;
  c.norm_epsilon = a.norm_epsilon;
  c.activation = a.swiglu        ? ckpt::Activation::kSwiGLU
                 : a.openai_gelu ? ckpt::Activation::kGeluTanh
                                 : ckpt::Activation::kGelu;
  c.position_embedding_type = a.position_embedding_type == "rope"
                                  ? ckpt::PositionEmbedding::kRope
                                  : ckpt::PositionEmbedding::kLearnedAbsolute;
  c.rotary_base = a.rotary_base;
  // Megatron's --use-rope-scaling fixes the other three at Llama 3.1's values.
  c.rope_scaling.llama3 = a.use_rope_scaling;
  if (a.use_rope_scaling) c.rope_scaling.factor = a.rope_scaling_factor;
  c.add_bias_linear = !a.disable_bias_linear;
  c.add_qkv_bias = !a.disable_bias_linear || a.add_qkv_bias;
  c.untie_embeddings_and_output_weights = a.untie_embeddings;
  c.params_dtype = ckpt::DType::kF32;
  return c;
}

ckpt::ParallelConfig ParallelConfigFromArgs(const TrainArgs& a) {
  ckpt::ParallelConfig p;
  p.tp = a.tensor_model_parallel_size;
  p.pp = a.pipeline_model_parallel_size;
  p.vpp = a.virtual_pipeline_size();
  p.first_stage_layers = static_cast<int>(a.decoder_first_pipeline_num_layers.value_or(0));
  p.last_stage_layers = static_cast<int>(a.decoder_last_pipeline_num_layers.value_or(0));
  return p;
}

std::string TrainArgsToJson(const TrainArgs& a) {
  // Megatron writes null for an unset uneven split.
  auto count = [](const std::optional<int64_t>& n) {
    return n ? absl::StrCat(*n) : std::string("null");
  };
  return absl::StrFormat(
      "{\"micro_batch_size\": %d, \"global_batch_size\": %d, \"seq_length\": %d, "
      "\"train_iters\": %d, \"lr\": %.17g, \"min_lr\": %.17g, \"lr_decay_style\": \"%s\", "
      "\"lr_warmup_iters\": %d, \"lr_decay_iters\": %d, \"weight_decay\": %.17g, "
      "\"adam_beta1\": %.17g, \"adam_beta2\": %.17g, \"adam_eps\": %.17g, "
      "\"clip_grad\": %.17g, \"seed\": %d, \"hidden_dropout\": %.17g, "
      "\"attention_dropout\": %.17g, \"tensor_model_parallel_size\": %d, "
      "\"pipeline_model_parallel_size\": %d, \"data_parallel_size\": %d, "
      "\"sequence_parallel\": %s, \"use_distributed_optimizer\": %s, "
      "\"data_parallel_sharding_strategy\": \"%s\", \"tokenizer_type\": \"%s\", "
      "\"virtual_pipeline_model_parallel_size\": %d, \"decoder_first_pipeline_num_layers\": %s, "
      "\"decoder_last_pipeline_num_layers\": %s, \"context_parallel_size\": %d, "
      "\"cp_comm_type\": \"%s\", \"reset_position_ids\": %s, \"reset_attention_mask\": %s, "
      "\"eod_mask_loss\": %s, \"optimizer_cpu_offload\": %s, \"fp8\": %s, \"fp8_recipe\": \"%s\"}",
      a.micro_batch_size, a.global_batch_size, a.seq_length, a.train_iters, a.lr, a.min_lr,
      a.lr_decay_style, a.lr_warmup_iters, a.lr_decay_iters, a.weight_decay, a.adam_beta1,
      a.adam_beta2, a.adam_eps, a.clip_grad, a.seed, a.hidden_dropout, a.attention_dropout,
      a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.data_parallel_size(),
      a.sequence_parallel ? "true" : "false", a.use_distributed_optimizer ? "true" : "false",
      !a.data_parallel_sharding_strategy.empty() ? a.data_parallel_sharding_strategy
      : a.use_distributed_optimizer              ? "optim"
                                                 : "no_shard",
      a.tokenizer_type, a.virtual_pipeline_size(), count(a.decoder_first_pipeline_num_layers),
      count(a.decoder_last_pipeline_num_layers), a.context_parallel_size, a.cp_comm_type,
      a.reset_position_ids ? "true" : "false", a.reset_attention_mask ? "true" : "false",
      a.eod_mask_loss ? "true" : "false", a.optimizer_cpu_offload ? "true" : "false",
      a.fp8_format.empty() ? std::string("null") : absl::StrCat("\"", a.fp8_format, "\""),
      a.fp8_recipe);
}

}  // namespace leantron::trainer
