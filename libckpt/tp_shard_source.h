// A checkpoint source whose tensors are per-TP-rank shards held somewhere in torch.save archives
// (the legacy Megatron reader's tensors): StreamFull merges a parameter's shards into its full
// tensor the way CheckpointReader does for the project's own files, one small piece at a time.
//
// The full tensor goes to the sink in pieces of kStreamPiece bytes, made by a second thread while
// the sink writes the ones before (RunReadAhead): a piece that is one run of one shard (the bulk
// of dim-0 splits) is a view of the archive's mapping, handed on without a copy; others are
// gathered into a buffer. Every range read through a mapping leaves the resident set once the
// sink or the gather is done with it (MappedFile::ReleaseBehind as the tensor streams,
// MappedFile::Release when it is done), so what is resident of the source files is, per shard
// being read, the 2 MiB block the reading is in and the pieces read ahead; the rest is
// kPiecesInFlight piece buffers: fixed, whatever the size of the tensor or the number of them. With
// verification on, each storage record is checked against its CRC-32 as the pieces pass it (one
// read of the bytes); records that are not streamed front to back whole (views into a shared
// buffer, the replicated copies of ranks other than 0) get TorchArchive::VerifyStorage's pass
// before their first use.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/read_ahead.h"
#include "libckpt/torch_archive.h"

namespace leantron::ckpt {

struct ShardRef {
  std::span<const std::byte> data;  // The shard's bytes (a view of `archive`), row-major.
  // The archive holding `data`, and the torch.save storage record it lies in (checked against its
  // CRC-32 before or while it is first copied when the source verifies).
  const TorchArchive* archive = nullptr;
  std::string storage_key;
};

class TpShardSource : public CheckpointSource {
 public:
  // Bytes of the full tensor handed to a sink at a time: small enough that a piece stays in the
  // CPU's cache from its first read (the CRC, or the gather) through the sink's checksum and
  // pwrite (measured: 0.7 s to pwrite 2.3 GB in 256 KiB pieces, 1.6-4 s in 1 MiB ones).
  static constexpr size_t kStreamPiece = size_t{256} << 10;
  static constexpr size_t kPiecesInFlight = 4;

  absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) override;
  absl::Status StreamFull(const ParamSpec& target, TensorKind kind,
                          const FullTensorSink& sink) override;

 protected:
  TpShardSource(CheckpointMetadata metadata, ModelLayout layout)
      : CheckpointSource(std::move(metadata), std::move(layout)) {}
  // Registers rank `tp_rank`'s shard of canonical parameter `name` for `kind`; the shard must
  // already be checked against the layout (shape and dtype).
  void AddShard(TensorKind kind, const std::string& name, int tp_rank, ShardRef shard);
  // Whether every parameter (tied copies aside) has a shard on every TP rank for `kind`; returns
  // the first missing one otherwise.
  std::optional<std::pair<std::string, int>> FirstMissing(TensorKind kind) const;
  bool verify_storages_ = false;  // Check each ShardRef's record before copying from it.

 private:
  // [kind][canonical name][tp rank]
  absl::flat_hash_map<std::string, std::vector<ShardRef>> shards_[4];
  // A piece of the full tensor between the reading thread and the sink: a view of a shard in its
  // archive's mapping (`mapped`), or of `buffer` where it is gathered from several.
  struct Piece {
    std::span<const std::byte> view;
    const TorchArchive* mapped = nullptr;
    int tp = 0;  // Whose shard `view` lies in, when mapped.
    PageAlignedBuffer buffer;
  };
  std::vector<Piece> pieces_;
};

}  // namespace leantron::ckpt
