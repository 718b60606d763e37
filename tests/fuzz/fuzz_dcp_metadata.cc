// Fuzzes the reader of torch.distributed.checkpoint's .metadata (a pickled Metadata). Any input
// must give metadata or an error; accepted metadata must describe chunks inside their tensors,
// each with storage in a plain file name of the checkpoint directory.
#include <cstdint>
#include <span>

#include "libckpt/torch_dist_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto md = leantron::ckpt::ParseDcpMetadata(
      std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz/.metadata");
  if (!md.ok()) return 0;
  for (const auto& [fqn, tensor] : md->tensors) {
    for (const auto& chunk : tensor.chunks) {
      if (chunk.offsets.size() != tensor.shape.size()) __builtin_trap();
      for (size_t d = 0; d < tensor.shape.size(); ++d) {
        if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 ||
            chunk.offsets[d] + chunk.sizes[d] > tensor.shape[d]) {
          __builtin_trap();
        }
      }
      if (chunk.storage.file.empty() || chunk.storage.file.find('/') != std::string::npos) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
