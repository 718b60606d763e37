// Megatron's indexed dataset: `<prefix>.bin` (token arrays, concatenated, no header) and
// `<prefix>.idx` (header, sequence lengths, sequence pointers, document index). Layout and
// semantics: ../shared/specs/data.md §1. The reader memory-maps both files and checks every count,
// length and pointer against the file sizes when opened, so later reads never leave the maps.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libdata/mapped_file.h"

namespace leantron::data {

// Megatron's dtype codes (DType in indexed_dataset.py).
enum class DType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

std::optional<DType> DTypeFromCode(uint8_t code);
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // numpy's name: "uint16", "int32", ...
// The token dtype Megatron's preprocessing picks: uint16 below 65500 ids, else int32.
DType TokenDTypeForVocabSize(int64_t vocab_size);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr size_t kIndexHeaderSize = 34;

inline std::string BinPath(const std::string& prefix) { return prefix + ".bin"; }
inline std::string IdxPath(const std::string& prefix) { return prefix + ".idx"; }

class IndexedDataset {
 public:
  // Opens and validates `<prefix>.idx` and `<prefix>.bin`. Errors name the file at fault.
  static absl::StatusOr<IndexedDataset> Open(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  size_t item_size() const { return DTypeSize(dtype_); }
  int64_t num_sequences() const { return num_sequences_; }
  // Number of documents: the document index has one more entry than this.
  int64_t num_documents() const { return num_doc_index_ - 1; }
  bool multimodal() const { return multimodal_; }

  int32_t sequence_length(int64_t i) const { return Load<int32_t>(lengths_, i); }
  int64_t sequence_pointer(int64_t i) const { return Load<int64_t>(pointers_, i); }
  int64_t document_index(int64_t i) const { return Load<int64_t>(doc_index_, i); }
  int8_t mode(int64_t i) const { return static_cast<int8_t>(modes_[i]); }

  // Raw little-endian bytes of sequence i.
  std::string_view sequence_bytes(int64_t i) const;
  // Appends `length` elements of sequence i starting at element `offset`, converted to int64
  // (as numpy's astype(int64) would; floats are truncated). Errors on an out-of-range request.
  absl::Status ReadTokens(int64_t i, int64_t offset, int64_t length,
                          std::vector<int64_t>* out) const;
  absl::Status ReadTokens(int64_t i, std::vector<int64_t>* out) const {
    return ReadTokens(i, 0, sequence_length(i), out);
  }
  // Total tokens over all sequences.
  int64_t total_tokens() const { return total_tokens_; }

  const MappedFile& idx_file() const { return idx_; }
  const MappedFile& bin_file() const { return bin_; }

 private:
  template <typename T>
  static T Load(const uint8_t* base, int64_t i) {
    T value;
    std::memcpy(&value, base + static_cast<size_t>(i) * sizeof(T), sizeof(T));
    return value;
  }

  std::string prefix_;
  MappedFile idx_;
  MappedFile bin_;
  DType dtype_ = DType::kUInt16;
  int64_t num_sequences_ = 0;
  int64_t num_doc_index_ = 0;
  int64_t total_tokens_ = 0;
  bool multimodal_ = false;
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* doc_index_ = nullptr;
  const uint8_t* modes_ = nullptr;
};

}  // namespace leantron::data
