// The correspondence between Megatron-Core parameters and HuggingFace tensors (spec §3-4), and the
// byte-level transforms between them. One table serves import and export.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "libckpt/hf_config.h"
#include "libckpt/model_config.h"
#include "libckpt/tensor.h"

namespace leantron::ckpt {

enum class HfTransform {
  kCopy,       // Same tensor.
  kVocabRows,  // Same tensor; Megatron pads the vocabulary rows, HF holds the true vocabulary.
  kTranspose,  // GPT-2 Conv1D weights are stored [in, out]; Megatron's are [out, in].
  kFusedQkv,   // GPT-2 c_attn: [in, Q | K | V] (bias [Q | K | V]) <-> grouped [np, 3, hn] rows.
  kSplitQkv,   // Llama q_proj, k_proj, v_proj (Qwen2: and their biases) <-> grouped
               // [ng, np/ng + 2, hn] rows.
  kSwiglu,     // Llama gate_proj, up_proj <-> linear_fc1 = [gate; up].
};

struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
};

struct HfMapping {
  std::string megatron;      // Megatron-Core name (global layer index).
  std::vector<HfTensor> hf;  // 1 tensor, or q/k/v, or gate/up.
  HfTransform transform;
};

// Every mapping of the model, in HF's usual order. `gpt2_prefix` is "transformer." or "" (files
// in the wild use both). Llama, Mistral and Qwen2 share names (Qwen2 adds q/k/v biases, present
// when config.add_qkv_bias). Tied embeddings have no output-layer mapping.
std::vector<HfMapping> HfMappings(HfArchitecture architecture, const ModelConfig& config,
                                  const std::string& gpt2_prefix = "transformer.");

// HF tensors (in mapping.hf order, dtype `dtype`) -> Megatron full tensor of `megatron_shape`
// (vocabulary rows beyond the HF rows are zero).
void HfToMegatron(const HfMapping& mapping, const ModelConfig& config, DType dtype,
                  const std::vector<std::span<const std::byte>>& hf,
                  const std::vector<int64_t>& megatron_shape, Tensor* out);
// Megatron full tensor -> HF tensors (in mapping.hf order); padded vocabulary rows dropped.
void MegatronToHf(const HfMapping& mapping, const ModelConfig& config, const Tensor& full,
                  std::vector<Tensor>* hf);

}  // namespace leantron::ckpt
