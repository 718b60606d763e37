// The one description of how a model's parameters are laid out over tensor- and pipeline-parallel
// ranks: Megatron-Core names (with global layer indices), full shapes, the tensor-parallel split
// rule of each parameter, and the pipeline stage (and virtual chunk) that holds it. The checkpoint
// writer and reader, the reshard tool, the HF converter and the trainer all ask this class; nobody
// else derives a split rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "libckpt/model_config.h"

namespace leantron::ckpt {

struct ParallelConfig {
  int tp = 1;   // Tensor-parallel size.
  int pp = 1;   // Pipeline-parallel size.
  int vpp = 1;  // Virtual pipeline chunks per stage (interleaved schedule); 1 = none.
  // Megatron-Core's --decoder-first/last-pipeline-num-layers: the decoder layers of the first /
  // last pipeline stage; 0 = not set. With either set (PP > 1, VPP 1), the remaining layers are
  // split evenly over the other stages.
  int first_stage_layers = 0;
  int last_stage_layers = 0;
};

enum class TpSplit {
  kReplicated,  // Whole on every TP rank (norms, row-parallel biases, position embeddings).
  kRows,        // Contiguous dim-0 blocks (column-parallel weights; grouped QKV: whole groups).
  kColumns,     // Contiguous dim-1 blocks (row-parallel weights).
  kSwigluRows,  // linear_fc1 with SwiGLU: each rank holds [gate block; up block].
  kVocabRows,   // Like kRows over the padded vocabulary.
};

struct ParamSpec {
  std::string name;            // Megatron-Core name, global layer index.
  std::vector<int64_t> shape;  // Full (TP-merged) shape; vocab rows padded for this layout.
  TpSplit split = TpSplit::kReplicated;
  int layer = -1;         // Global layer index, -1 outside the decoder layers.
  int stage = 0;          // Pipeline rank holding it.
  int virtual_chunk = 0;  // Model chunk on that stage.
  std::string tied_to;    // Set for a stored copy of another parameter (tied output layer, PP > 1).
};

// A run of indices along the split dimension: full-tensor [begin, begin + count).
struct SplitPiece {
  int64_t begin = 0;
  int64_t count = 0;
};

// Megatron's shard directory name: mp_rank_{tp:02d} (PP = 1) or mp_rank_{tp:02d}_{pp:03d}.
std::string ShardDirName(int tp_rank, int pp_rank, int pp_size);

// Megatron's default: ceil(V / (divisor * tp)) * (divisor * tp).
int64_t PaddedVocabSize(int64_t vocab_size, int64_t divisor, int tp);

class ModelLayout {
 public:
  // Refuses impossible layouts (heads, query groups or FFN not divisible by TP; layers not
  // divisible by PP x VPP, or an uneven first/last stage split that leaves a remainder) with a
  // message that says which number fails.
  static absl::StatusOr<ModelLayout> Create(const ModelConfig& config,
                                            const ParallelConfig& parallel);

  const ModelConfig& config() const { return config_; }
  const ParallelConfig& parallel() const { return parallel_; }
  int64_t padded_vocab_size() const { return padded_vocab_; }

  // Every stored tensor in model order, tied copies included.
  const std::vector<ParamSpec>& params() const { return params_; }
  const ParamSpec* Find(std::string_view name) const;
  // The tensors pipeline rank `pp_rank` stores (all its virtual chunks).
  std::vector<const ParamSpec*> StageParams(int pp_rank) const;
  // Global layers [first, second) of model chunk `virtual_chunk` on `pp_rank`. Chunks may differ
  // in size (uneven first/last stage): ask this, never num_layers / (pp * vpp).
  std::pair<int, int> StageLayers(int pp_rank, int virtual_chunk) const;

  // -1 when replicated.
  static int SplitDim(const ParamSpec& spec);
  std::vector<int64_t> ShardShape(const ParamSpec& spec) const;  // Same on every TP rank.
  // Which full-tensor indices along SplitDim() rank `tp_rank` holds, in shard order.
  std::vector<SplitPiece> Pieces(const ParamSpec& spec, int tp_rank) const;

  // Copies rank `tp_rank`'s shard out of / into a full tensor of `spec.shape`.
  void ExtractShard(const ParamSpec& spec, int tp_rank, size_t element_size,
                    std::span<const std::byte> full, std::span<std::byte> shard) const;
  // InsertShard reads `shard` front to back; when given, `consumed(n)` is called as it goes (each
  // time at least kInsertStep more bytes are done) with the length of the prefix of `shard` it no
  // longer needs, so a caller reading from a mapping can release those pages before the copy ends.
  static constexpr size_t kInsertStep = size_t{32} << 20;
  void InsertShard(const ParamSpec& spec, int tp_rank, size_t element_size,
                   std::span<const std::byte> shard, std::span<std::byte> full,
                   const std::function<void(size_t)>& consumed = {}) const;

  // The runs of `tp_rank`'s shard that overlap bytes [begin, end) of the full tensor, clipped to
  // them, in order, as fn(full_at, shard_at, n). They are adjacent in the shard, so together they
  // are one contiguous range of it: what a reader streaming the full tensor in pieces reads from
  // a rank's shard, or a writer appends to one.
  void ForEachRunIn(const ParamSpec& spec, int tp_rank, size_t element_size, size_t begin,
                    size_t end, const std::function<void(size_t, size_t, size_t)>& fn) const;

  // The shard of `tp_rank` as a view into `full` when it is one contiguous run of it (dim-0
  // splits, replicated tensors); empty otherwise. Lets writers skip a copy.
  std::optional<std::span<const std::byte>> ContiguousShard(const ParamSpec& spec, int tp_rank,
                                                            size_t element_size,
                                                            std::span<const std::byte> full) const;

  // Megatron's shard directory name: mp_rank_{tp:02d} (PP = 1) or mp_rank_{tp:02d}_{pp:03d}.
  std::string ShardDirName(int tp_rank, int pp_rank) const;

 private:
  void AddParam(ParamSpec spec);
  ModelConfig config_;
  ParallelConfig parallel_;
  int64_t padded_vocab_ = 0;
  std::vector<ParamSpec> params_;
  // First global layer of each model chunk c = virtual_chunk * pp + pp_rank, and num_layers last.
  std::vector<int> chunk_begin_;
  absl::flat_hash_map<std::string, size_t> index_;
};

int64_t NumElements(std::span<const int64_t> shape);

}  // namespace leantron::ckpt
