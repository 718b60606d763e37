// Opening a checkpoint iteration: metadata, every shard file mapped and verified against the layout
// (names, shapes, dtypes, no shard missing), and full (TP-merged) tensors on demand.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libckpt/checkpoint_metadata.h"
#include "libckpt/layout.h"
#include "libckpt/safetensors.h"
#include "libckpt/tensor.h"

namespace leantron::ckpt {

// Anything that can produce a parameter's full tensor shaped for a target layout: a checkpoint in
// any layout, or a HuggingFace model. Writers and loaders pull from it one tensor at a time.
class FullTensorSource {
 public:
  virtual ~FullTensorSource() = default;
  // Fills `out` with the full tensor for `target` (shape `target.shape`; vocabulary rows that the
  // source does not have are zero). A tied copy is read from the parameter it copies.
  virtual absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) = 0;
  virtual bool has_optimizer() const = 0;
};

// Checks that a shard file holds exactly the tensors `layout` puts on (tp_rank, pp_rank) for `kind`
// (all optimizer kinds for the optimizer file), with the right shapes and dtype.
absl::Status VerifyShardFile(const ModelLayout& layout, int tp_rank, int pp_rank, bool optimizer,
                             const SafetensorsFile& file);

struct CheckpointReadOptions {
  // Also check the tensors' contents (checkpoint_verify.h): one read of every shard file. The
  // tools' --no-verify-checkpoint turns it off.
  bool verify = true;
};

class CheckpointReader : public FullTensorSource {
 public:
  // Opens `iteration` of `checkpoint_dir` (the tracker's when unset) and verifies every shard:
  // its structure always, its contents unless `options.verify` is off. The counts metadata.json
  // claims (layers, ranks) are checked against the shard files present before anything is sized
  // by them.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& checkpoint_dir,
                                                                std::optional<int64_t> iteration,
                                                                CheckpointReadOptions options = {});

  const CheckpointMetadata& metadata() const { return metadata_; }
  const ModelLayout& layout() const { return layout_; }
  const std::string& iteration_dir() const { return iteration_dir_; }
  const SafetensorsFile& shard_file(int tp_rank, int pp_rank, bool optimizer) const;

  absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) override;
  bool has_optimizer() const override { return metadata_.has_optimizer; }

 private:
  CheckpointReader(CheckpointMetadata metadata, ModelLayout layout)
      : metadata_(std::move(metadata)), layout_(std::move(layout)) {}
  CheckpointMetadata metadata_;
  ModelLayout layout_;
  std::string iteration_dir_;
  // [pp][tp]
  std::vector<std::vector<std::unique_ptr<SafetensorsFile>>> model_files_;
  std::vector<std::vector<std::unique_ptr<SafetensorsFile>>> optimizer_files_;
};

}  // namespace leantron::ckpt
