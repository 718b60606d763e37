// Fuzzes the zip reader and the torch.save archive layer with whole files: any input must give an
// archive or an error, never an out-of-bounds read. For an accepted archive every entry's data
// must lie inside the input, and every tensor the pickle names must resolve to bytes inside it
// (or to an error).
#include <cstdint>
#include <span>
#include <vector>

#include "libckpt/torch_archive.h"
#include "libckpt/zip_archive.h"

using namespace leantron::ckpt;

namespace {

void Walk(const TorchArchive& archive, const PyValue* v, int depth, std::span<const std::byte> all,
          int* budget) {
  if (v == nullptr || depth > 8 || --*budget < 0) return;
  if (TorchArchive::IsTensor(v)) {
    auto tensor = archive.Tensor(v, "fuzz");
    if (tensor.ok() && !tensor->data.empty()) {
      if (tensor->data.data() < all.data() ||
          tensor->data.data() + tensor->data.size() > all.data() + all.size()) {
        __builtin_trap();
      }
      volatile std::byte sink = tensor->data.back();
      (void)sink;
    }
    return;
  }
  for (const PyValue* item : v->items) Walk(archive, item, depth + 1, all, budget);
  for (const PyValue* item : v->set_items) Walk(archive, item, depth + 1, all, budget);
  if (v->args) Walk(archive, v->args, depth + 1, all, budget);
  if (v->state) Walk(archive, v->state, depth + 1, all, budget);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  if (auto zip = ZipArchive::Parse(bytes, "fuzz.zip"); zip.ok()) {
    for (const ZipEntry& entry : zip->entries()) {
      if (entry.offset > size || entry.size > size - entry.offset) __builtin_trap();
      (void)zip->VerifyCrc(entry);
    }
  }
  auto archive = TorchArchive::Parse(bytes, "fuzz.pt");
  if (!archive.ok()) return 0;
  int budget = 100000;
  Walk(**archive, (*archive)->root(), 0, bytes, &budget);
  return 0;
}
