// How Megatron-LM lays a GPT model out in its own checkpoints, on top of ModelLayout (which owns
// the tensor-parallel split rules): the state-dict names of each format and the flat buffers of
// Megatron's distributed optimizer.
//
// Names. The legacy `torch` format saves each pipeline stage's (and virtual chunk's) state dict
// with chunk-local layer indices (`decoder.layers.0.` is the chunk's first layer); `torch_dist`
// stacks the layers along a leading dimension (`decoder.layers.self_attention.linear_qkv.weight`
// is [num_layers, ...]) or, for non-homogeneous models, names them with global indices.
// TransformerEngine builds fuse the norms into the next linear (`...linear_qkv.layer_norm_weight`
// is the input norm, `...mlp.linear_fc1.layer_norm_weight` the pre-MLP norm), and torch_dist uses
// those names even for the local implementation. Pre-Megatron-Core checkpoints use
// `language_model.encoder.*` names. `_extra_state` entries hold no parameters.
//
// Distributed optimizer. Each model chunk's parameters (in the module's registration order, which
// puts linear_proj before linear_qkv) are laid out in reverse into one flat buffer per dtype: each
// parameter starts at a multiple of 64 elements, buckets close after `bucket_size` elements (and
// around a tied embedding shared across pipeline stages) and are padded to lcm(DP, 128). The
// checkpoint's flat fp32 tensors keep the intra-bucket gaps but drop each bucket's end padding.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "libckpt/layout.h"

namespace leantron::ckpt {

// A legacy state-dict name of model chunk (pp_rank, virtual_chunk) as the canonical name (global
// layer index, Megatron-Core names); nullopt for an `_extra_state` entry. An empty string means
// the name is not one a GPT model has.
std::optional<std::string> CanonicalFromLegacyName(const ModelLayout& layout, int pp_rank,
                                                   int virtual_chunk, std::string_view name);
// The legacy name Megatron-Core (local implementation) saves a canonical parameter under.
std::string LegacyNameOf(const ModelLayout& layout, const ParamSpec& spec);

// A torch_dist key of a model parameter: the canonical name, or for a stacked key (first
// dimension = layer index) the canonical name's parts around the layer index. nullopt when the
// key is not a GPT model parameter.
struct DistKeyTarget {
  std::string name;      // Canonical name; for a stacked key the part after the index.
  bool stacked = false;  // "decoder.layers.<index>." + name for each layer index.
};
std::optional<DistKeyTarget> CanonicalFromDistKey(std::string_view key);

// Model chunk (pp_rank, virtual_chunk)'s parameters in Megatron's named_parameters() order.
std::vector<const ParamSpec*> MegatronParamOrder(const ModelLayout& layout, int pp_rank,
                                                 int virtual_chunk);

struct BufferParam {
  const ParamSpec* spec = nullptr;
  int64_t numel = 0;         // Of this rank's shard.
  int64_t world_offset = 0;  // In the checkpoint's coalesced flat tensor (bucket padding dropped).
  int bucket = 0;
  int64_t bucket_offset = 0;  // From the start of its bucket.
};
struct BufferLayout {
  std::vector<BufferParam> params;       // In the order of MegatronParamOrder.
  std::vector<int64_t> bucket_unpadded;  // Elements of each bucket up to its last parameter.
  int64_t numel_unpadded = 0;            // Sum of bucket_unpadded.
};

// The distributed optimizer's buffer of model chunk (pp_rank, virtual_chunk) at a TP rank (all TP
// ranks have the same shapes). `bucket_size`: Megatron's DDP bucket size for this chunk (unset:
// one bucket); `data_parallel_size` pads bucket ends.
BufferLayout MegatronBufferLayout(const ModelLayout& layout, int pp_rank, int virtual_chunk,
                                  std::optional<int64_t> bucket_size, int64_t data_parallel_size);

// Megatron's parameter groups of the non-distributed optimizer: weight decay off (wd_mult 0) for
// biases and 1-D parameters, on for the rest; returns whether `spec` is in the no-decay group.
bool MegatronNoWeightDecay(const ParamSpec& spec);

}  // namespace leantron::ckpt
