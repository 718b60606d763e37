// Fuzzes the restricted unpickler with arbitrary bytes. Any input must give a value tree or an
// error, never a crash, a hang or unbounded memory: every opcode creates at most two values, so
// the tree is bounded by the input. The tree is then walked the way the readers walk it (repr,
// dict lookups, object state) to show cycles and shared children are safe.
#include <cstdint>
#include <span>

#include "libckpt/pickle.h"

using leantron::ckpt::DictGet;
using leantron::ckpt::ObjectDict;
using leantron::ckpt::Pickle;
using leantron::ckpt::PyRepr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto pickle = Pickle::Parse(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz");
  if (!pickle.ok()) return 0;
  if ((*pickle)->num_values() > 2 * size + 2) __builtin_trap();
  const auto* root = (*pickle)->root();
  if (root == nullptr) __builtin_trap();
  (void)PyRepr(root, 4096);
  (void)DictGet(root, "model");
  (void)ObjectDict(root);
  return 0;
}
