#include "libckpt/layout.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {

int64_t NumElements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t PaddedVocabSize(int64_t vocab_size, int64_t divisor, int tp) {
  int64_t multiple = divisor * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

absl::StatusOr<ModelLayout> ModelLayout::Create(const ModelConfig& config,
                                                const ParallelConfig& parallel) {
  if (auto s = ValidateModelConfig(config); !s.ok()) return s;
  const ModelConfig& c = config;
  const ParallelConfig& p = parallel;
  auto refuse = [&](std::string why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "layout TP=%d PP=%d VPP=%d is impossible for this model: %s", p.tp, p.pp, p.vpp, why));
  };
  if (p.tp < 1 || p.pp < 1 || p.vpp < 1) return refuse("sizes must be at least 1");
  if (c.num_attention_heads % p.tp != 0) {
    return refuse(Cat(c.num_attention_heads, " attention heads are not divisible by TP ", p.tp));
  }
  if (c.num_query_groups % p.tp != 0) {
    return refuse(
        Cat(c.num_query_groups, " query groups (KV heads) are not divisible by TP ", p.tp));
  }
  if (c.ffn_hidden_size % p.tp != 0) {
    return refuse(Cat("ffn_hidden_size ", c.ffn_hidden_size, " is not divisible by TP ", p.tp));
  }
  if (p.vpp > 1 && p.pp == 1) return refuse("virtual pipeline chunks need PP > 1");
  // Layers per pipeline stage (VPP 1) or per model chunk; Megatron-Core's rule for an uneven split:
  // the first and/or last stage hold what is asked, the other stages share the rest evenly.
  std::vector<int64_t> chunk_layers;
  const int64_t first = p.first_stage_layers, last = p.last_stage_layers;
  if (first < 0 || last < 0) {
    return refuse(Cat("decoder_", first < 0 ? "first" : "last",
                      "_pipeline_num_layers must be at least 1 (0 = not set), not ",
                      first < 0 ? first : last));
  }
  if (first > 0 || last > 0) {
    const std::string what = first > 0 && last > 0
                                 ? Cat("decoder_first_pipeline_num_layers ", first,
                                       " and decoder_last_pipeline_num_layers ", last)
                                 : Cat(first > 0 ? "decoder_first" : "decoder_last",
                                       "_pipeline_num_layers ", first > 0 ? first : last);
    if (p.pp == 1) return refuse(Cat(what, " needs PP > 1"));
    if (p.vpp > 1) return refuse(Cat(what, " does not work with virtual pipeline chunks"));
    const int64_t rest = c.num_layers - first - last;
    const int others = p.pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
    if (others == 0) {
      if (rest != 0) {
        return refuse(
            Cat(what, " with PP ", p.pp, " must add up to the model's ", c.num_layers, " layers"));
      }
    } else if (rest < others || rest % others != 0) {
      return refuse(Cat(c.num_layers, " layers minus ", what, " leave ", rest,
                        " layers, which do not split evenly over the other ", others,
                        " pipeline stage", others == 1 ? "" : "s", " (at least 1 layer each)"));
    }
    for (int s = 0; s < p.pp; ++s) {
      chunk_layers.push_back(s == 0 && first > 0         ? first
                             : s == p.pp - 1 && last > 0 ? last
                                                         : rest / others);
    }
  } else {
    const int64_t chunks = static_cast<int64_t>(p.pp) * p.vpp;
    if (c.num_layers % chunks != 0) {
      return refuse(Cat(c.num_layers, " layers are not divisible by PP x VPP = ", chunks));
    }
    chunk_layers.assign(chunks, c.num_layers / chunks);
  }

  ModelLayout layout;
  layout.config_ = config;
  layout.parallel_ = parallel;
  layout.padded_vocab_ = PaddedVocabSize(c.vocab_size, c.make_vocab_size_divisible_by, p.tp);
  layout.chunk_begin_ = {0};
  for (int64_t n : chunk_layers) {
    layout.chunk_begin_.push_back(layout.chunk_begin_.back() + static_cast<int>(n));
  }
  const int64_t h = c.hidden_size;
  const int64_t vpad = layout.padded_vocab_;
  const int last_stage = p.pp - 1;
  const int last_chunk = p.vpp - 1;
  const bool norm_bias = c.has_norm_bias();

  layout.AddParam(
      {"embedding.word_embeddings.weight", {vpad, h}, TpSplit::kVocabRows, -1, 0, 0, ""});
  if (c.position_embedding_type == PositionEmbedding::kLearnedAbsolute) {
    layout.AddParam({"embedding.position_embeddings.weight",
                     {c.max_position_embeddings, h},
                     TpSplit::kReplicated,
                     -1,
                     0,
                     0,
                     ""});
  }
  const int64_t qkv_rows = (c.num_attention_heads + 2 * c.num_query_groups) * c.kv_channels;
  const int64_t attn_width = c.num_attention_heads * c.kv_channels;
  const int64_t fc1_rows = c.ffn_hidden_size * (c.swiglu() ? 2 : 1);
  const TpSplit fc1_split = c.swiglu() ? TpSplit::kSwigluRows : TpSplit::kRows;
  int chunk = 0;  // Model chunk c lives on stage c % pp as virtual chunk c / pp.
  for (int i = 0; i < c.num_layers; ++i) {
    while (i >= layout.chunk_begin_[chunk + 1]) ++chunk;
    const int stage = chunk % p.pp;
    const int vchunk = chunk / p.pp;
    const std::string prefix = absl::StrFormat("decoder.layers.%d.", i);
    auto add = [&](const std::string& suffix, std::vector<int64_t> shape, TpSplit split) {
      layout.AddParam({prefix + suffix, std::move(shape), split, i, stage, vchunk, ""});
    };
    add("input_layernorm.weight", {h}, TpSplit::kReplicated);
    if (norm_bias) add("input_layernorm.bias", {h}, TpSplit::kReplicated);
    add("self_attention.linear_qkv.weight", {qkv_rows, h}, TpSplit::kRows);
    if (c.add_qkv_bias) add("self_attention.linear_qkv.bias", {qkv_rows}, TpSplit::kRows);
    add("self_attention.linear_proj.weight", {h, attn_width}, TpSplit::kColumns);
    if (c.add_bias_linear) add("self_attention.linear_proj.bias", {h}, TpSplit::kReplicated);
    add("pre_mlp_layernorm.weight", {h}, TpSplit::kReplicated);
    if (norm_bias) add("pre_mlp_layernorm.bias", {h}, TpSplit::kReplicated);
    add("mlp.linear_fc1.weight", {fc1_rows, h}, fc1_split);
    if (c.add_bias_linear) add("mlp.linear_fc1.bias", {fc1_rows}, fc1_split);
    add("mlp.linear_fc2.weight", {h, c.ffn_hidden_size}, TpSplit::kColumns);
    if (c.add_bias_linear) add("mlp.linear_fc2.bias", {h}, TpSplit::kReplicated);
  }
  // Parameters of the last stage outside the layers; `tied_to` names the parameter a copy mirrors.
  auto add_last = [&](const std::string& name, std::vector<int64_t> shape, TpSplit split,
                      const std::string& tied_to = "") {
    layout.AddParam({name, std::move(shape), split, -1, last_stage, last_chunk, tied_to});
  };
  add_last("decoder.final_layernorm.weight", {h}, TpSplit::kReplicated);
  if (norm_bias) add_last("decoder.final_layernorm.bias", {h}, TpSplit::kReplicated);
  if (c.untie_embeddings_and_output_weights) {
    add_last("output_layer.weight", {vpad, h}, TpSplit::kVocabRows);
  } else if (p.pp > 1) {
    // Megatron keeps a copy of the tied embedding on the last stage (its gradients are all-reduced
    // with the first stage's, so the two stay equal).
    add_last("output_layer.weight", {vpad, h}, TpSplit::kVocabRows,
             "embedding.word_embeddings.weight");
  }
  return layout;
}

void ModelLayout::AddParam(ParamSpec spec) {
  index_.emplace(spec.name, params_.size());
  params_.push_back(std::move(spec));
}

const ParamSpec* ModelLayout::Find(std::string_view name) const {
  auto it = index_.find(ToAbsl(name));
  return it == index_.end() ? nullptr : &params_[it->second];
}

std::vector<const ParamSpec*> ModelLayout::StageParams(int pp_rank) const {
  std::vector<const ParamSpec*> out;
  for (const ParamSpec& spec : params_) {
    if (spec.stage == pp_rank) out.push_back(&spec);
  }
  return out;
}

std::pair<int, int> ModelLayout::StageLayers(int pp_rank, int virtual_chunk) const {
  const int chunk = virtual_chunk * parallel_.pp + pp_rank;
  return {chunk_begin_[chunk], chunk_begin_[chunk + 1]};
}

int ModelLayout::SplitDim(const ParamSpec& spec) {
  switch (spec.split) {
    case TpSplit::kReplicated:
      return -1;
    case TpSplit::kColumns:
      return 1;
    default:
      return 0;
  }
}

std::vector<int64_t> ModelLayout::ShardShape(const ParamSpec& spec) const {
  std::vector<int64_t> shape = spec.shape;
  const int dim = SplitDim(spec);
  if (dim >= 0) shape[dim] /= parallel_.tp;
  return shape;
}

std::vector<SplitPiece> ModelLayout::Pieces(const ParamSpec& spec, int tp_rank) const {
  const int dim = SplitDim(spec);
  if (dim < 0) return {{0, spec.shape.empty() ? 1 : spec.shape[0]}};
  const int64_t full = spec.shape[dim];
  if (spec.split == TpSplit::kSwigluRows) {
    // Gate rows [0, ffn) then up rows [ffn, 2 ffn); each rank holds its block of both halves.
    const int64_t half = full / 2;
    const int64_t block = half / parallel_.tp;
    return {{tp_rank * block, block}, {half + tp_rank * block, block}};
  }
  const int64_t block = full / parallel_.tp;
  return {{tp_rank * block, block}};
}

namespace {

// Shared by extract and insert: walks the (outer, piece) runs of contiguous bytes.
template <typename Fn>
void ForEachRun(const ModelLayout& layout, const ParamSpec& spec, int tp_rank, size_t element_size,
                Fn&& fn) {
  const int dim = ModelLayout::SplitDim(spec);
  if (dim < 0) {
    fn(0, 0, static_cast<size_t>(NumElements(spec.shape)) * element_size);
    return;
  }
  int64_t outer = 1;
  for (int d = 0; d < dim; ++d) outer *= spec.shape[d];
  int64_t inner = 1;
  for (size_t d = dim + 1; d < spec.shape.size(); ++d) inner *= spec.shape[d];
  const size_t inner_bytes = static_cast<size_t>(inner) * element_size;
  const int64_t full_dim = spec.shape[dim];
  const int64_t shard_dim = full_dim / layout.parallel().tp;
  const std::vector<SplitPiece> pieces = layout.Pieces(spec, tp_rank);
  for (int64_t o = 0; o < outer; ++o) {
    int64_t local = 0;
    for (const SplitPiece& piece : pieces) {
      fn((o * full_dim + piece.begin) * inner_bytes, (o * shard_dim + local) * inner_bytes,
         piece.count * inner_bytes);
      local += piece.count;
    }
  }
}

}  // namespace

void ModelLayout::ExtractShard(const ParamSpec& spec, int tp_rank, size_t element_size,
                               std::span<const std::byte> full, std::span<std::byte> shard) const {
  ForEachRun(*this, spec, tp_rank, element_size, [&](size_t full_at, size_t shard_at, size_t n) {
    std::memcpy(shard.data() + shard_at, full.data() + full_at, n);
  });
}

void ModelLayout::InsertShard(const ParamSpec& spec, int tp_rank, size_t element_size,
                              std::span<const std::byte> shard, std::span<std::byte> full,
                              const std::function<void(size_t)>& consumed) const {
  // Runs come in shard order, each starting where the previous one ended.
  size_t reported = 0;
  ForEachRun(*this, spec, tp_rank, element_size, [&](size_t full_at, size_t shard_at, size_t n) {
    if (!consumed) {
      std::memcpy(full.data() + full_at, shard.data() + shard_at, n);
      return;
    }
    for (size_t done = 0; done < n;) {
      const size_t step = std::min(n - done, kInsertStep);
      std::memcpy(full.data() + full_at + done, shard.data() + shard_at + done, step);
      done += step;
      if (shard_at + done - reported >= kInsertStep) {
        reported = shard_at + done;
        consumed(reported);
      }
    }
  });
}

void ModelLayout::ForEachRunIn(const ParamSpec& spec, int tp_rank, size_t element_size,
                               size_t begin, size_t end,
                               const std::function<void(size_t, size_t, size_t)>& fn) const {
  end = std::min(end, static_cast<size_t>(NumElements(spec.shape)) * element_size);
  if (begin >= end) return;
  const int dim = SplitDim(spec);
  if (dim < 0) {
    fn(begin, begin, end - begin);
    return;
  }
  int64_t inner = 1;
  for (size_t d = dim + 1; d < spec.shape.size(); ++d) inner *= spec.shape[d];
  const size_t inner_bytes = static_cast<size_t>(inner) * element_size;
  const size_t full_stride = static_cast<size_t>(spec.shape[dim]) * inner_bytes;
  const size_t shard_stride = full_stride / parallel_.tp;
  const std::vector<SplitPiece> pieces = Pieces(spec, tp_rank);
  // Outer index o covers full bytes [o * full_stride, (o + 1) * full_stride).
  for (size_t o = begin / full_stride; o * full_stride < end; ++o) {
    size_t local = o * shard_stride;
    for (const SplitPiece& piece : pieces) {
      const size_t run = o * full_stride + static_cast<size_t>(piece.begin) * inner_bytes;
      const size_t n = static_cast<size_t>(piece.count) * inner_bytes;
      const size_t lo = std::max(run, begin), hi = std::min(run + n, end);
      if (lo < hi) fn(lo, local + (lo - run), hi - lo);
      local += n;
    }
  }
}

std::optional<std::span<const std::byte>> ModelLayout::ContiguousShard(
    const ParamSpec& spec, int tp_rank, size_t element_size,
    std::span<const std::byte> full) const {
  int runs = 0;
  size_t begin = 0, size = 0;
  ForEachRun(*this, spec, tp_rank, element_size, [&](size_t full_at, size_t, size_t n) {
    ++runs;
    begin = full_at;
    size = n;
  });
  if (runs != 1) return std::nullopt;
  return full.subspan(begin, size);
}

std::string ShardDirName(int tp_rank, int pp_rank, int pp_size) {
  if (pp_size == 1) return absl::StrFormat("mp_rank_%02d", tp_rank);
  return absl::StrFormat("mp_rank_%02d_%03d", tp_rank, pp_rank);
}

std::string ModelLayout::ShardDirName(int tp_rank, int pp_rank) const {
  return ckpt::ShardDirName(tp_rank, pp_rank, parallel_.pp);
}

}  // namespace leantron::ckpt
