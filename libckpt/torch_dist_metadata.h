// The `.metadata` file of a PyTorch distributed checkpoint (torch.distributed.checkpoint's
// FileSystemWriter; Megatron's torch_dist format): a pickle (protocol 4 or 5) of
// torch.distributed.checkpoint.metadata.Metadata, read with the restricted unpickler.
//
//   state_dict_metadata: fqn -> TensorStorageMetadata(properties(dtype, ...), size, chunks
//                                [ChunkStorageMetadata(offsets, sizes)]) | BytesStorageMetadata
//   storage_data:        MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset,
//                                                                           length)
//
// Each tensor chunk is stored as one torch.save archive at [offset, offset + length) of its
// relative_path; a bytes item is stored raw. Every chunk must lie inside its tensor, have its
// storage, and not overlap another; relative paths must be plain file names (no directories).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libckpt/dtype.h"

namespace leantron::ckpt {

struct DcpStorage {
  std::string file;  // A file name in the checkpoint directory.
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct DcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  DcpStorage storage;
};

struct DcpTensorInfo {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<DcpChunk> chunks;
};

struct DcpMetadata {
  std::map<std::string, DcpTensorInfo> tensors;
  std::map<std::string, DcpStorage> bytes;
  std::string version;  // "1.0.0" from PyTorch 2.6; empty before.
};

// `source` names the file in errors.
absl::StatusOr<DcpMetadata> ParseDcpMetadata(std::span<const std::byte> bytes,
                                             const std::string& source);

}  // namespace leantron::ckpt
