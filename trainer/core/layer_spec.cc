#include "trainer/core/layer_spec.h"

namespace leantron::trainer {

ModelSpec ModelSpecFromConfig(const ckpt::ModelConfig& c, int64_t padded_vocab) {
  ModelSpec m;
  m.hidden = c.hidden_size;
  m.padded_vocab = padded_vocab;
  m.learned_positions = c.position_embedding_type == ckpt::PositionEmbedding::kLearnedAbsolute;
  m.max_positions = c.max_position_embeddings;
  m.tied_embeddings = !c.untie_embeddings_and_output_weights;
  NormSpec norm;
  norm.kind = c.normalization;
  norm.eps = static_cast<float>(c.norm_epsilon);
  m.final_norm = norm;
  LayerSpec l;
  l.hidden = c.hidden_size;
  l.input_norm = l.pre_mlp_norm = norm;
  l.attention.heads = c.num_attention_heads;
  l.attention.query_groups = c.num_query_groups;
  l.attention.head_dim = c.kv_channels;
  l.attention.qkv_bias = c.add_qkv_bias;
  l.attention.proj_bias = c.add_bias_linear;
  l.attention.rope = c.position_embedding_type == ckpt::PositionEmbedding::kRope;
  l.attention.rotary_base = c.rotary_base;
  l.mlp.activation = c.activation;
  l.mlp.ffn = c.ffn_hidden_size;
  l.mlp.bias = c.add_bias_linear;
  m.layers.assign(c.num_layers, l);
  return m;
}

LayerShard ShardOf(const LayerSpec& spec, int tp_size) {
  LayerShard s;
  s.heads = spec.attention.heads / tp_size;
  s.groups = spec.attention.query_groups / tp_size;
  s.head_dim = spec.attention.head_dim;
  s.qkv_width = (s.heads + 2 * s.groups) * s.head_dim;
  s.attn_width = s.heads * s.head_dim;
  s.ffn = spec.mlp.ffn / tp_size;
  s.fc1_width = spec.mlp.gated() ? 2 * s.ffn : s.ffn;
  return s;
}

}  // namespace leantron::trainer
