// The architecture both models are built from: one LayerSpec per decoder layer (its norms, its
// attention block, its MLP block) and the model's ends (embeddings, final norm, output layer).
// Built from the ModelConfig a checkpoint names, so what trains is what a checkpoint describes.
// A new architecture is new values here and, where needed, one new module in trainer/reference/
// and trainer/cuda/nn/ — never a new model class.
#pragma once

#include <cstdint>
#include <vector>

#include "libckpt/model_config.h"

namespace leantron::trainer {

struct NormSpec {
  ckpt::NormType kind = ckpt::NormType::kLayerNorm;
  float eps = 1e-5f;
  bool rms() const { return kind == ckpt::NormType::kRMSNorm; }
  bool bias() const { return kind == ckpt::NormType::kLayerNorm; }
};

struct AttentionSpec {
  int64_t heads = 0, query_groups = 0, head_dim = 0;
  bool qkv_bias = true, proj_bias = true;
  bool rope = false;  // rotary position embedding on the queries and keys
  double rotary_base = 10000.0;
  ckpt::RopeScaling rope_scaling;
  // Megatron-Core's grouped qkv layout read as plain multi-head attention (no RoPE, groups ==
  // heads): the layout the bf16 model's attention reads without rearranging.
  bool interleaved_mha() const { return !rope && query_groups == heads; }
};

struct MlpSpec {
  // kGelu: erf GELU; kGeluTanh: GPT-2's tanh GELU; kSwiGLU: silu(gate)·up, fc1 = [gate | up].
  ckpt::Activation activation = ckpt::Activation::kGelu;
  int64_t ffn = 0;
  bool bias = true;  // linear_fc1 and linear_fc2
  bool gated() const { return activation == ckpt::Activation::kSwiGLU; }
};

struct LayerSpec {
  int64_t hidden = 0;
  NormSpec input_norm, pre_mlp_norm;
  AttentionSpec attention;
  MlpSpec mlp;
};

struct ModelSpec {
  int64_t hidden = 0;
  int64_t padded_vocab = 0;
  bool learned_positions = true;  // a position table added to the word embedding
  int64_t max_positions = 0;
  bool tied_embeddings = true;    // the output layer is the word embedding
  std::vector<LayerSpec> layers;  // every decoder layer, global order
  NormSpec final_norm;
};

ModelSpec ModelSpecFromConfig(const ckpt::ModelConfig& config, int64_t padded_vocab);

// One tensor-parallel rank's share of a layer: heads and query groups split by whole groups, the
// MLP by columns of fc1 (for SwiGLU each rank holds its gate and its up block).
struct LayerShard {
  int64_t heads = 0, groups = 0, head_dim = 0;
  int64_t qkv_width = 0;   // (heads + 2·groups)·head_dim: this rank's rows of linear_qkv
  int64_t attn_width = 0;  // heads·head_dim: the core attention's output, linear_proj's input
  int64_t ffn = 0;         // this rank's MLP width (linear_fc2's input)
  int64_t fc1_width = 0;   // linear_fc1's output: ffn, or 2·ffn when gated
};
LayerShard ShardOf(const LayerSpec& spec, int tp_size);

// The rotary frequencies θ_i of the dimension pairs i < head_dim/2 (rotate-half pairs i and
// i + head_dim/2): base^(−2i/head_dim), with Llama 3.1's scaling applied when asked (HF's
// rope_type "llama3", Megatron's --use-rope-scaling). In double.
std::vector<double> RopeInverseFrequencies(double base, int64_t head_dim,
                                           const ckpt::RopeScaling& scaling);
// cos(t·θ_i) and sin(t·θ_i) for positions t < seq, [seq, head_dim/2] row-major: computed in double
// and rounded to float, so every backend rotates by the same values.
void RopeTable(const std::vector<double>& inv_freq, int64_t seq, std::vector<float>* cos,
               std::vector<float>* sin);

}  // namespace leantron::trainer
