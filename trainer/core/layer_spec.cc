#include "trainer/core/layer_spec.h"

#include <cmath>

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
  l.attention.rope_scaling = c.rope_scaling;
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

std::vector<double> RopeInverseFrequencies(double base, int64_t head_dim,
                                           const ckpt::RopeScaling& scaling) {
  const int64_t half = head_dim / 2;
  std::vector<double> f(half);
  for (int64_t i = 0; i < half; ++i)
    f[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  if (!scaling.llama3) return f;
  // Wavelengths beyond the original context / low_freq_factor are stretched by `factor`, those
  // below original / high_freq_factor kept, and those between interpolated.
  const double original = static_cast<double>(scaling.original_max_position_embeddings);
  const double low_wavelen = original / scaling.low_freq_factor;
  const double high_wavelen = original / scaling.high_freq_factor;
  for (double& theta : f) {
    const double wavelen = 2.0 * M_PI / theta;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      theta /= scaling.factor;
      continue;
    }
    const double smooth = (original / wavelen - scaling.low_freq_factor) /
                          (scaling.high_freq_factor - scaling.low_freq_factor);
    theta = (1.0 - smooth) * theta / scaling.factor + smooth * theta;
  }
  return f;
}

void RopeTable(const std::vector<double>& inv_freq, int64_t seq, std::vector<float>* cos,
               std::vector<float>* sin) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  cos->resize(seq * half);
  sin->resize(seq * half);
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * inv_freq[i];
      (*cos)[t * half + i] = static_cast<float>(std::cos(angle));
      (*sin)[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace leantron::trainer
