#include "libckpt/pickle_writer.h"

#include <cstdint>
#include <cstring>

namespace leantron::ckpt {

PickleWriter::PickleWriter() {
  out_.push_back(static_cast<char>(0x80));
  out_.push_back(2);
}

void PickleWriter::None() { out_.push_back('N'); }

void PickleWriter::Bool(bool value) { out_.push_back(static_cast<char>(value ? 0x88 : 0x89)); }

void PickleWriter::Int(int64_t value) {
  if (value >= 0 && value < 256) {
    out_.push_back('K');
    out_.push_back(static_cast<char>(value));
  } else if (value >= 0 && value < 65536) {
    out_.push_back('M');
    out_.push_back(static_cast<char>(value & 0xFF));
    out_.push_back(static_cast<char>(value >> 8));
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out_.push_back('J');
    const auto v = static_cast<uint32_t>(static_cast<int32_t>(value));
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  } else {
    // LONG1: the shortest two's complement little-endian form, as CPython writes it.
    std::string bytes;
    auto v = static_cast<uint64_t>(value);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    while (bytes.size() > 1) {
      const auto last = static_cast<uint8_t>(bytes.back());
      const auto prev = static_cast<uint8_t>(bytes[bytes.size() - 2]);
      if ((last == 0x00 && !(prev & 0x80)) || (last == 0xFF && (prev & 0x80))) {
        bytes.pop_back();
      } else {
        break;
      }
    }
    out_.push_back(static_cast<char>(0x8a));
    out_.push_back(static_cast<char>(bytes.size()));
    out_ += bytes;
  }
}

void PickleWriter::Float(double value) {
  out_.push_back('G');
  uint64_t bits;
  std::memcpy(&bits, &value, 8);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void PickleWriter::Str(std::string_view text) {
  out_.push_back('X');
  const auto n = static_cast<uint32_t>(text.size());
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  out_ += text;
}

void PickleWriter::Global(std::string_view module, std::string_view name) {
  out_.push_back('c');
  out_ += module;
  out_.push_back('\n');
  out_ += name;
  out_.push_back('\n');
}

void PickleWriter::Mark() { out_.push_back('('); }
void PickleWriter::Tuple() { out_.push_back('t'); }
void PickleWriter::EmptyTuple() { out_.push_back(')'); }
void PickleWriter::EmptyList() { out_.push_back(']'); }
void PickleWriter::Appends() { out_.push_back('e'); }
void PickleWriter::EmptyDict() { out_.push_back('}'); }
void PickleWriter::SetItems() { out_.push_back('u'); }
void PickleWriter::Reduce() { out_.push_back('R'); }
void PickleWriter::NewObj() { out_.push_back(static_cast<char>(0x81)); }
void PickleWriter::Build() { out_.push_back('b'); }
void PickleWriter::BinPersId() { out_.push_back('Q'); }

std::string PickleWriter::Finish() {
  out_.push_back('.');
  return std::move(out_);
}

void PickleWriter::OrderedDict() {
  Global("collections", "OrderedDict");
  EmptyTuple();
  Reduce();
}

void PickleWriter::Tensor(std::string_view storage_class, std::string_view key, int64_t numel,
                          const std::vector<int64_t>& shape) {
  Global("torch._utils", "_rebuild_tensor_v2");
  Mark();
  {
    Mark();
    Str("storage");
    Global("torch", storage_class);
    Str(key);
    Str("cpu");
    Int(numel);
    Tuple();
    BinPersId();
  }
  Int(0);
  Mark();
  for (int64_t d : shape) Int(d);
  Tuple();
  Mark();
  int64_t stride = 1;
  std::vector<int64_t> strides(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  for (int64_t s : strides) Int(s);
  Tuple();
  Bool(false);
  OrderedDict();
  Tuple();
  Reduce();
}

}  // namespace leantron::ckpt
