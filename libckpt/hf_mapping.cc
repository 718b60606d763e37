#include "libckpt/hf_mapping.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace leantron::ckpt {

std::vector<HfMapping> HfMappings(HfArchitecture architecture, const ModelConfig& c,
                                  const std::string& gpt2_prefix) {
  const int64_t h = c.hidden_size, v = c.vocab_size, f = c.ffn_hidden_size;
  const int64_t q_rows = c.num_attention_heads * c.kv_channels;
  const int64_t kv_rows = c.num_query_groups * c.kv_channels;
  std::vector<HfMapping> m;
  if (architecture == HfArchitecture::kGpt2) {
    const std::string& p = gpt2_prefix;
    m.push_back({"embedding.word_embeddings.weight",
                 {{p + "wte.weight", {v, h}}},
                 HfTransform::kVocabRows});
    m.push_back({"embedding.position_embeddings.weight",
                 {{p + "wpe.weight", {c.max_position_embeddings, h}}},
                 HfTransform::kCopy});
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string mg = absl::StrFormat("decoder.layers.%d.", i);
      const std::string hf = absl::StrFormat("%sh.%d.", p, i);
      m.push_back({mg + "input_layernorm.weight", {{hf + "ln_1.weight", {h}}}, HfTransform::kCopy});
      m.push_back({mg + "input_layernorm.bias", {{hf + "ln_1.bias", {h}}}, HfTransform::kCopy});
      m.push_back({mg + "self_attention.linear_qkv.weight",
                   {{hf + "attn.c_attn.weight", {h, 3 * h}}},
                   HfTransform::kFusedQkv});
      m.push_back({mg + "self_attention.linear_qkv.bias",
                   {{hf + "attn.c_attn.bias", {3 * h}}},
                   HfTransform::kFusedQkv});
      m.push_back({mg + "self_attention.linear_proj.weight",
                   {{hf + "attn.c_proj.weight", {h, h}}},
                   HfTransform::kTranspose});
      m.push_back({mg + "self_attention.linear_proj.bias",
                   {{hf + "attn.c_proj.bias", {h}}},
                   HfTransform::kCopy});
      m.push_back(
          {mg + "pre_mlp_layernorm.weight", {{hf + "ln_2.weight", {h}}}, HfTransform::kCopy});
      m.push_back({mg + "pre_mlp_layernorm.bias", {{hf + "ln_2.bias", {h}}}, HfTransform::kCopy});
      m.push_back({mg + "mlp.linear_fc1.weight",
                   {{hf + "mlp.c_fc.weight", {h, f}}},
                   HfTransform::kTranspose});
      m.push_back({mg + "mlp.linear_fc1.bias", {{hf + "mlp.c_fc.bias", {f}}}, HfTransform::kCopy});
      m.push_back({mg + "mlp.linear_fc2.weight",
                   {{hf + "mlp.c_proj.weight", {f, h}}},
                   HfTransform::kTranspose});
      m.push_back(
          {mg + "mlp.linear_fc2.bias", {{hf + "mlp.c_proj.bias", {h}}}, HfTransform::kCopy});
    }
    m.push_back({"decoder.final_layernorm.weight", {{p + "ln_f.weight", {h}}}, HfTransform::kCopy});
    m.push_back({"decoder.final_layernorm.bias", {{p + "ln_f.bias", {h}}}, HfTransform::kCopy});
    if (c.untie_embeddings_and_output_weights) {
      m.push_back({"output_layer.weight", {{"lm_head.weight", {v, h}}}, HfTransform::kVocabRows});
    }
    return m;
  }
  m.push_back({"embedding.word_embeddings.weight",
               {{"model.embed_tokens.weight", {v, h}}},
               HfTransform::kVocabRows});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string mg = absl::StrFormat("decoder.layers.%d.", i);
    const std::string hf = absl::StrFormat("model.layers.%d.", i);
    m.push_back({mg + "input_layernorm.weight",
                 {{hf + "input_layernorm.weight", {h}}},
                 HfTransform::kCopy});
    m.push_back({mg + "self_attention.linear_qkv.weight",
                 {{hf + "self_attn.q_proj.weight", {q_rows, h}},
                  {hf + "self_attn.k_proj.weight", {kv_rows, h}},
                  {hf + "self_attn.v_proj.weight", {kv_rows, h}}},
                 HfTransform::kSplitQkv});
    if (c.add_qkv_bias) {  // Qwen2
      m.push_back({mg + "self_attention.linear_qkv.bias",
                   {{hf + "self_attn.q_proj.bias", {q_rows}},
                    {hf + "self_attn.k_proj.bias", {kv_rows}},
                    {hf + "self_attn.v_proj.bias", {kv_rows}}},
                   HfTransform::kSplitQkv});
    }
    m.push_back({mg + "self_attention.linear_proj.weight",
                 {{hf + "self_attn.o_proj.weight", {h, q_rows}}},
                 HfTransform::kCopy});
    m.push_back({mg + "pre_mlp_layernorm.weight",
                 {{hf + "post_attention_layernorm.weight", {h}}},
                 HfTransform::kCopy});
    m.push_back({mg + "mlp.linear_fc1.weight",
                 {{hf + "mlp.gate_proj.weight", {f, h}}, {hf + "mlp.up_proj.weight", {f, h}}},
                 HfTransform::kSwiglu});
    m.push_back({mg + "mlp.linear_fc2.weight",
                 {{hf + "mlp.down_proj.weight", {h, f}}},
                 HfTransform::kCopy});
  }
  m.push_back({"decoder.final_layernorm.weight", {{"model.norm.weight", {h}}}, HfTransform::kCopy});
  if (c.untie_embeddings_and_output_weights) {
    m.push_back({"output_layer.weight", {{"lm_head.weight", {v, h}}}, HfTransform::kVocabRows});
  }
  return m;
}

namespace {

// Cache-blocked, with the element size known at compile time (fixed-size memcpy compiles to one
// load and store; a per-element call with a runtime size made GPT-2 XL export 2x slower).
template <size_t kElem>
void TransposeBlocked(const std::byte* in, int64_t rows, int64_t cols, std::byte* out) {
  constexpr int64_t kBlock = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c) {  // Output rows: contiguous writes.
        std::byte* dst = out + (c * rows) * kElem;
        for (int64_t r = r0; r < r1; ++r) {
          std::memcpy(dst + r * kElem, in + (r * cols + c) * kElem, kElem);
        }
      }
    }
  }
}

void Transpose(const std::byte* in, int64_t rows, int64_t cols, size_t elem, std::byte* out) {
  switch (elem) {
    case 2:
      return TransposeBlocked<2>(in, rows, cols, out);
    case 4:
      return TransposeBlocked<4>(in, rows, cols, out);
    case 8:
      return TransposeBlocked<8>(in, rows, cols, out);
    default:
      break;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(out + (c * rows + r) * elem, in + (r * cols + c) * elem, elem);
    }
  }
}

// Megatron's grouped QKV rows: for each query group g, its np/ng query heads, then its K head,
// then its V head. `row` is the byte size of one row (h elements for weights, 1 for biases).
// Calls fn(part, part_offset, qkv_offset, bytes) for each run, part 0/1/2 = q/k/v.
template <typename Fn>
void ForEachQkvRun(const ModelConfig& c, size_t row, Fn&& fn) {
  const int64_t hn = c.kv_channels, ng = c.num_query_groups;
  const int64_t q_per_group = c.num_attention_heads / ng * hn;  // Rows.
  size_t cursor = 0;
  for (int64_t g = 0; g < ng; ++g) {
    fn(0, g * q_per_group * row, cursor, q_per_group * row);
    cursor += q_per_group * row;
    fn(1, g * hn * row, cursor, hn * row);
    cursor += hn * row;
    fn(2, g * hn * row, cursor, hn * row);
    cursor += hn * row;
  }
}

}  // namespace

void HfToMegatron(const HfMapping& mapping, const ModelConfig& c, DType dtype,
                  const std::vector<std::span<const std::byte>>& hf,
                  const std::vector<int64_t>& megatron_shape, Tensor* out) {
  const size_t elem = DTypeSize(dtype);
  out->Reset(dtype, megatron_shape);
  std::byte* dst = out->data.data();
  const std::vector<int64_t>& shape0 = mapping.hf[0].shape;
  switch (mapping.transform) {
    case HfTransform::kCopy:
    case HfTransform::kVocabRows:
      std::memcpy(dst, hf[0].data(), hf[0].size());  // Padding rows stay zero.
      break;
    case HfTransform::kTranspose:
      Transpose(hf[0].data(), shape0[0], shape0[1], elem, dst);
      break;
    case HfTransform::kFusedQkv: {
      // Bring c_attn to rows [Q; K; V] (a transpose for the [in, out] weight), then regroup.
      const bool weight = shape0.size() == 2;
      const int64_t h = c.hidden_size;
      const size_t row = weight ? static_cast<size_t>(h) * elem : elem;
      std::vector<std::byte> rows(hf[0].size());
      if (weight) {
        Transpose(hf[0].data(), shape0[0], shape0[1], elem, rows.data());
      } else {
        std::memcpy(rows.data(), hf[0].data(), hf[0].size());
      }
      const std::byte* parts[3] = {rows.data(), rows.data() + h * row, rows.data() + 2 * h * row};
      ForEachQkvRun(c, row, [&](int part, size_t at, size_t qkv_at, size_t n) {
        std::memcpy(dst + qkv_at, parts[part] + at, n);
      });
      break;
    }
    case HfTransform::kSplitQkv: {
      const size_t row = shape0.size() == 2 ? static_cast<size_t>(shape0[1]) * elem : elem;
      ForEachQkvRun(c, row, [&](int part, size_t at, size_t qkv_at, size_t n) {
        std::memcpy(dst + qkv_at, hf[part].data() + at, n);
      });
      break;
    }
    case HfTransform::kSwiglu:
      std::memcpy(dst, hf[0].data(), hf[0].size());
      std::memcpy(dst + hf[0].size(), hf[1].data(), hf[1].size());
      break;
  }
}

void MegatronToHf(const HfMapping& mapping, const ModelConfig& c, const Tensor& full,
                  std::vector<Tensor>* hf) {
  const size_t elem = DTypeSize(full.dtype);
  hf->resize(mapping.hf.size());
  for (size_t i = 0; i < mapping.hf.size(); ++i) (*hf)[i].Reset(full.dtype, mapping.hf[i].shape);
  const std::byte* src = full.data.data();
  const std::vector<int64_t>& shape0 = mapping.hf[0].shape;
  switch (mapping.transform) {
    case HfTransform::kCopy:
    case HfTransform::kVocabRows:  // The first V rows; the padding is dropped.
      std::memcpy((*hf)[0].data.data(), src, (*hf)[0].data.size());
      break;
    case HfTransform::kTranspose:
      Transpose(src, shape0[1], shape0[0], elem, (*hf)[0].data.data());
      break;
    case HfTransform::kFusedQkv: {
      const bool weight = shape0.size() == 2;
      const int64_t h = c.hidden_size;
      const size_t row = weight ? static_cast<size_t>(h) * elem : elem;
      std::vector<std::byte> rows(full.data.size());
      std::byte* parts[3] = {rows.data(), rows.data() + h * row, rows.data() + 2 * h * row};
      ForEachQkvRun(c, row, [&](int part, size_t at, size_t qkv_at, size_t n) {
        std::memcpy(parts[part] + at, src + qkv_at, n);
      });
      if (weight) {
        Transpose(rows.data(), 3 * h, h, elem, (*hf)[0].data.data());
      } else {
        std::memcpy((*hf)[0].data.data(), rows.data(), rows.size());
      }
      break;
    }
    case HfTransform::kSplitQkv: {
      const size_t row = shape0.size() == 2 ? static_cast<size_t>(shape0[1]) * elem : elem;
      ForEachQkvRun(c, row, [&](int part, size_t at, size_t qkv_at, size_t n) {
        std::memcpy((*hf)[part].data.data() + at, src + qkv_at, n);
      });
      break;
    }
    case HfTransform::kSwiglu: {
      const size_t half = (*hf)[0].data.size();
      std::memcpy((*hf)[0].data.data(), src, half);
      std::memcpy((*hf)[1].data.data(), src + half, half);
      break;
    }
  }
}

}  // namespace leantron::ckpt
