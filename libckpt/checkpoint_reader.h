// Opening a checkpoint iteration: metadata, every shard file mapped and verified against the layout
// (names, shapes, dtypes, no shard missing), and full (TP-merged) tensors on demand.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libckpt/checkpoint_metadata.h"
#include "libckpt/layout.h"
#include "libckpt/safetensors.h"
#include "libckpt/tensor.h"

namespace leantron::ckpt {

// Where FullTensorSource::StreamFull sends a full tensor: its dtype, then its bytes front to back
// in consecutive pieces of any size.
struct FullTensorSink {
  std::function<absl::Status(DType dtype)> begin;
  std::function<absl::Status(std::span<const std::byte> piece)> append;
};

// Anything that can produce a parameter's full tensor shaped for a target layout: a checkpoint in
// any layout, or a HuggingFace model. Writers and loaders pull from it one tensor at a time.
class FullTensorSource {
 public:
  virtual ~FullTensorSource() = default;
  // Fills `out` with the full tensor for `target` (shape `target.shape`; vocabulary rows that the
  // source does not have are zero). A tied copy is read from the parameter it copies.
  virtual absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) = 0;
  // The same bytes handed to `sink` in pieces, so that a source that can (TpShardSource) never
  // holds the whole tensor: the pieces stay in the CPU's cache from read to write. A source that
  // checks records as it streams them may find one corrupt after the sink had some of its bytes:
  // on error the caller discards what it made of them. By default, ReadFull into one buffer.
  virtual absl::Status StreamFull(const ParamSpec& target, TensorKind kind,
                                  const FullTensorSink& sink);
  virtual bool has_optimizer() const = 0;

 private:
  Tensor stream_buffer_;  // The default StreamFull's, kept between tensors.
};

// An opened checkpoint of any format (the project's own, or Megatron-LM's `torch` and
// `torch_dist`, see checkpoint_source.h): its metadata in the project's terms, the layout it was
// saved in, and full tensors on demand.
class CheckpointSource : public FullTensorSource {
 public:
  const CheckpointMetadata& metadata() const { return metadata_; }
  const ModelLayout& layout() const { return layout_; }
  const std::string& iteration_dir() const { return iteration_dir_; }
  bool has_optimizer() const override { return metadata_.has_optimizer; }
  // "leantron", "megatron torch" or "megatron torch_dist".
  virtual std::string_view format_name() const = 0;
  // The files the iteration holds, one line each, for `inspect checkpoint`.
  virtual void DescribeFiles(std::ostream& out) const = 0;

 protected:
  CheckpointSource(CheckpointMetadata metadata, ModelLayout layout)
      : metadata_(std::move(metadata)), layout_(std::move(layout)) {}
  CheckpointMetadata metadata_;
  ModelLayout layout_;
  std::string iteration_dir_;
};

// Checks that a shard file holds exactly the tensors `layout` puts on (tp_rank, pp_rank) for `kind`
// (all optimizer kinds for the optimizer file), with the right shapes and dtype.
absl::Status VerifyShardFile(const ModelLayout& layout, int tp_rank, int pp_rank, bool optimizer,
                             const SafetensorsFile& file);

// Which format a --load names: detected from the iteration's files, or required (the tools'
// --load-format leantron|megatron).
enum class CheckpointFormat { kAuto, kLeantron, kMegatron };

struct CheckpointReadOptions {
  // Also check the tensors' contents (checkpoint_verify.h): one read of every shard file. The
  // tools' --no-verify-checkpoint turns it off.
  bool verify = true;
  CheckpointFormat format = CheckpointFormat::kAuto;  // Used by OpenCheckpoint.
};

// The project's own format.
class CheckpointReader : public CheckpointSource {
 public:
  // Opens `iteration` of `checkpoint_dir` (the tracker's when unset) and verifies every shard:
  // its structure always, its contents unless `options.verify` is off. The counts metadata.json
  // claims (layers, ranks) are checked against the shard files present before anything is sized
  // by them.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& checkpoint_dir,
                                                                std::optional<int64_t> iteration,
                                                                CheckpointReadOptions options = {});

  const SafetensorsFile& shard_file(int tp_rank, int pp_rank, bool optimizer) const;

  absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) override;
  std::string_view format_name() const override { return "leantron"; }
  void DescribeFiles(std::ostream& out) const override;

 private:
  CheckpointReader(CheckpointMetadata metadata, ModelLayout layout)
      : CheckpointSource(std::move(metadata), std::move(layout)) {}
  // [pp][tp]
  std::vector<std::vector<std::unique_ptr<SafetensorsFile>>> model_files_;
  std::vector<std::vector<std::unique_ptr<SafetensorsFile>>> optimizer_files_;
};

}  // namespace leantron::ckpt
