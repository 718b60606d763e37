// Emits pickle protocol 2 (torch.save's) opcode by opcode: the data.pkl of the Megatron
// checkpoints libckpt writes. No memo is used; Python's and torch's unpicklers read the stream as
// they read CPython's own.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace leantron::ckpt {

class PickleWriter {
 public:
  PickleWriter();  // PROTO 2
  void None();
  void Bool(bool value);
  void Int(int64_t value);
  void Float(double value);
  void Str(std::string_view text);  // UTF-8
  void Global(std::string_view module, std::string_view name);
  void Mark();
  void Tuple();  // of everything since the last Mark
  void EmptyTuple();
  void EmptyList();
  void Appends();  // onto the list below the last Mark
  void EmptyDict();
  void SetItems();  // key, value pairs since the last Mark into the dict below it
  void Reduce();
  void NewObj();
  void Build();
  void BinPersId();
  // STOP; the finished stream.
  std::string Finish();

  // Helpers for what torch pickles.
  // collections.OrderedDict(): leaves the empty dict on the stack (fill with Mark ... SetItems).
  void OrderedDict();
  // A tensor of `shape` viewing storage `key` (torch.<storage_class>, `numel` elements) from its
  // start: torch._utils._rebuild_tensor_v2 as torch.save pickles one.
  void Tensor(std::string_view storage_class, std::string_view key, int64_t numel,
              const std::vector<int64_t>& shape);

 private:
  std::string out_;
};

}  // namespace leantron::ckpt
