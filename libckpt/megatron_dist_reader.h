// The reader of Megatron's `torch_dist` checkpoints (megatron_reader.h), shared by its two files:
// megatron_dist_reader.cc opens a checkpoint and maps its DCP tensors to parameters,
// megatron_dist_tensors.cc reads the tensors.
#pragma once

#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/mapped_file.h"
#include "libckpt/megatron_args.h"
#include "libckpt/megatron_layout.h"
#include "libckpt/torch_archive.h"
#include "libckpt/torch_dist_metadata.h"

namespace leantron::ckpt {

struct DistEntry {
  const DcpTensorInfo* info = nullptr;
  std::string key;
  int layer = -1;  // >= 0: index into a stacked tensor's first dimension.
};

// One TP rank's shard of a parameter inside a distributed-optimizer bucket tensor.
struct BucketSlice {
  const DcpTensorInfo* info = nullptr;
  std::string key;
  int64_t offset = 0;
};

class MegatronDistReader : public CheckpointSource {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointSource>> Open(const std::string& iteration_dir,
                                                                CheckpointReadOptions options);
  std::string_view format_name() const override { return "megatron torch_dist"; }
  void DescribeFiles(std::ostream& out) const override;
  absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) override;
  // A parameter stored as a whole DCP tensor (or one layer of a stacked one) goes to the sink in
  // blocks of rows of about kStreamPiece bytes, copied out of the chunks by a second thread while
  // the sink writes the blocks before (RunReadAhead): the bytes stay in the CPU's cache from copy
  // to write, and what is resident is the chunks' pages not yet passed plus kPiecesInFlight
  // buffers. Distributed-optimizer buckets and scalars go through ReadFull.
  absl::Status StreamFull(const ParamSpec& target, TensorKind kind,
                          const FullTensorSink& sink) override;

 private:
  static constexpr size_t kStreamPiece = size_t{256} << 10;
  static constexpr size_t kPiecesInFlight = 4;

  MegatronDistReader(CheckpointMetadata metadata, ModelLayout layout)
      : CheckpointSource(std::move(metadata), std::move(layout)) {}
  absl::StatusOr<std::shared_ptr<const MappedFile>> File(const std::string& name);
  absl::StatusOr<std::unique_ptr<TorchArchive>> Item(const DcpStorage& storage);
  // A chunk of a DCP tensor, its archive open and (with verify_) its records CRC-checked.
  struct OpenChunk {
    const DcpChunk* chunk = nullptr;
    std::unique_ptr<TorchArchive> archive;
    std::span<const std::byte> data;
  };
  // Opens the chunks of DCP tensor `info` that hold elements of the region (row-major
  // `sizes` at `offsets`).
  absl::StatusOr<std::vector<OpenChunk>> OpenChunks(const DcpTensorInfo& info,
                                                    const std::string& key,
                                                    const std::vector<int64_t>& offsets,
                                                    const std::vector<int64_t>& sizes);
  // Copies the region out of `chunks` into `dst` (row-major `sizes`); every element must come
  // from exactly one chunk.
  absl::Status CopyRegion(const std::vector<OpenChunk>& chunks, const DcpTensorInfo& info,
                          const std::string& key, const std::vector<int64_t>& offsets,
                          const std::vector<int64_t>& sizes, std::span<std::byte> dst) const;
  // OpenChunks, CopyRegion, and the chunks' pages dropped.
  absl::Status ReadRegion(const DcpTensorInfo& info, const std::string& key,
                          const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes,
                          std::span<std::byte> dst);
  // The source parameter a target reads (its tied parameter for a tied copy), checked against the
  // target's shape, and the dtype it is read in.
  struct Resolved {
    std::string canonical;
    const ParamSpec* source = nullptr;
    DType dtype = DType::kF32;
    bool same_shape = true;
  };
  absl::StatusOr<Resolved> Resolve(const ParamSpec& target, TensorKind kind) const;
  absl::Status MapTensors(const MegatronRun& run);

  std::string dir_;
  bool verify_ = true;
  DcpMetadata md_;
  absl::flat_hash_map<std::string, std::shared_ptr<const MappedFile>> files_;
  absl::flat_hash_map<std::string, DistEntry> entries_[4];                 // [kind][canonical]
  absl::flat_hash_map<std::string, std::vector<BucketSlice>> buckets_[4];  // [kind][canonical][tp]
};

}  // namespace leantron::ckpt
