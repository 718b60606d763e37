// Test helper for the Python interop tests: reads a safetensors file with libckpt's reader and
// writes every tensor and the metadata again with libckpt's writer.
//   safetensors_roundtrip IN OUT      exit 1 with the reader's message on an invalid file
#include <iostream>
#include <vector>

#include "libckpt/safetensors.h"
#include "libckpt/safetensors_writer.h"

int main(int argc, char** argv) {
  using namespace leantron::ckpt;
  if (argc != 3) {
    std::cerr << "usage: safetensors_roundtrip IN OUT\n";
    return 2;
  }
  auto file = SafetensorsFile::Open(argv[1]);
  if (!file.ok()) {
    std::cerr << file.status().message() << "\n";
    return 1;
  }
  std::vector<NamedTensorData> tensors;
  for (const TensorInfo& info : (*file)->tensors()) {
    auto view = (*file)->Get(info.name);
    tensors.push_back({{info.name, info.dtype, info.shape}, view->data});
  }
  if (auto s = WriteSafetensors(argv[2], tensors, (*file)->metadata()); !s.ok()) {
    std::cerr << s.message() << "\n";
    return 1;
  }
  return 0;
}
