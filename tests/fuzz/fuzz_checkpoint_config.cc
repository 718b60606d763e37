// Fuzzes the JSON configs the checkpoint tools read before they size anything: a checkpoint's
// metadata.json and a HuggingFace config.json. Any input must give a config or an error, never a
// crash, an overflow or an allocation sized by a claimed count. The tools check layer counts
// against the tensors present before building a layout (at most a few dozen layers here, as the
// tensors of a small file would allow); what is accepted then must lay out, map to HF names and
// write back to JSON that parses to the same config.
#include <cstdint>
#include <string_view>

#include "libckpt/checkpoint_metadata.h"
#include "libckpt/hf_config.h"
#include "libckpt/hf_mapping.h"
#include "libckpt/layout.h"

namespace ckpt = leantron::ckpt;

namespace {

constexpr int64_t kLayersPresent = 64;

void MetadataJson(std::string_view json) {
  auto metadata = ckpt::ParseCheckpointMetadata(json, "metadata.json");
  if (!metadata.ok() || metadata->config.num_layers > kLayersPresent) return;
  auto layout = ckpt::ModelLayout::Create(metadata->config, metadata->parallel);
  if (!layout.ok()) return;
  const std::string again = ckpt::CheckpointMetadataToJson(*metadata, *layout);
  auto back = ckpt::ParseCheckpointMetadata(again, "again");
  if (!back.ok() || back->config.num_layers != metadata->config.num_layers ||
      back->parallel.tp != metadata->parallel.tp || back->iteration != metadata->iteration) {
    __builtin_trap();
  }
}

void HfConfigJson(std::string_view json) {
  auto info = ckpt::ParseHfConfig(json, "config.json");
  if (!info.ok() || info->config.num_layers > kLayersPresent) return;
  auto mappings = ckpt::HfMappings(info->config.hf_architecture, info->config, "");
  if (mappings.empty()) __builtin_trap();
  // What was accepted converts back to its own class, and config.json says the same again.
  auto architecture = ckpt::HfArchitectureFor(info->config);
  if (!architecture.ok() || *architecture != info->config.hf_architecture) __builtin_trap();
  auto back = ckpt::ParseHfConfig(ckpt::HfConfigJson(*info), "again");
  if (!back.ok() ||
      ckpt::ModelConfigToJson(back->config) != ckpt::ModelConfigToJson(info->config)) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  MetadataJson(json);
  HfConfigJson(json);
  return 0;
}
