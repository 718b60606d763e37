#include "libdata/indexed_dataset.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace leantron::data {
namespace {

// Appends n values of type T as int64 tokens. Returns the index of the first value that is no
// token (a float that is not an integer within int64's range), or -1 when all are.
template <typename T>
int64_t AppendConverted(const uint8_t* p, int64_t n, std::vector<int64_t>* out) {
  const size_t old = out->size();
  out->resize(old + static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    T v;
    std::memcpy(&v, p + k * sizeof(T), sizeof(T));
    if constexpr (std::is_floating_point_v<T>) {
      // 2^63 is exact in both float types; NaN fails both comparisons.
      if (!(v >= T(-9223372036854775808.0) && v < T(9223372036854775808.0)) || v != std::trunc(v)) {
        out->resize(old);
        return k;
      }
    }
    (*out)[old + static_cast<size_t>(k)] = static_cast<int64_t>(v);
  }
  return -1;
}

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

}  // namespace

std::optional<DType> DTypeFromCode(uint8_t code) {
  if (code >= 1 && code <= 8) return static_cast<DType>(code);
  return std::nullopt;
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
    case DType::kInt8:
      return 1;
    case DType::kInt16:
    case DType::kUInt16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat32:
      return "float32";
    case DType::kUInt16:
      return "uint16";
  }
  return "?";
}

DType TokenDTypeForVocabSize(int64_t vocab_size) {
  return vocab_size < 65500 ? DType::kUInt16 : DType::kInt32;
}

absl::StatusOr<IndexedDataset> IndexedDataset::Open(const std::string& prefix) {
  IndexedDataset ds;
  ds.prefix_ = prefix;
  const std::string idx_path = IdxPath(prefix);
  const std::string bin_path = BinPath(prefix);
  absl::StatusOr<MappedFile> idx = MappedFile::Open(idx_path);
  if (!idx.ok()) return idx.status();
  absl::StatusOr<MappedFile> bin = MappedFile::Open(bin_path);
  if (!bin.ok()) return bin.status();
  ds.idx_ = *std::move(idx);
  ds.bin_ = *std::move(bin);

  const uint8_t* p = ds.idx_.data();
  const uint64_t size = ds.idx_.size();
  if (size < kIndexHeaderSize) {
    return Corrupt(idx_path, absl::StrCat("truncated: ", size, " bytes, the header alone is ",
                                          kIndexHeaderSize));
  }
  if (std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return Corrupt(idx_path, "not an indexed-dataset index (bad magic, expected MMIDIDX)");
  }
  uint64_t version, num_sequences, num_doc_index;
  std::memcpy(&version, p + 9, 8);
  std::memcpy(&num_sequences, p + 18, 8);
  std::memcpy(&num_doc_index, p + 26, 8);
  if (version != kIndexVersion) {
    return Corrupt(idx_path, absl::StrCat("unsupported version ", version, " (expected 1)"));
  }
  const std::optional<DType> dtype = DTypeFromCode(p[17]);
  if (!dtype) return Corrupt(idx_path, absl::StrCat("unknown dtype code ", int{p[17]}));
  ds.dtype_ = *dtype;
  // Bound the counts by the file size before multiplying, so the arithmetic cannot overflow.
  if (num_sequences > size || num_doc_index > size) {
    return Corrupt(idx_path,
                   absl::StrCat("header counts (", num_sequences, " sequences, ", num_doc_index,
                                " document-index entries) exceed the file size ", size,
                                " (truncated or corrupt)"));
  }
  const uint64_t expected = kIndexHeaderSize + 12 * num_sequences + 8 * num_doc_index;
  if (size == expected + num_sequences && num_sequences > 0) {
    ds.multimodal_ = true;
  } else if (size != expected) {
    return Corrupt(idx_path,
                   absl::StrCat("size is ", size, " bytes but the header (", num_sequences,
                                " sequences, ", num_doc_index, " document-index entries) implies ",
                                expected, " (truncated or corrupt)"));
  }
  if (num_doc_index < 1) return Corrupt(idx_path, "document index is empty (needs at least 0)");
  ds.num_sequences_ = static_cast<int64_t>(num_sequences);
  ds.num_doc_index_ = static_cast<int64_t>(num_doc_index);
  ds.lengths_ = p + kIndexHeaderSize;
  ds.pointers_ = ds.lengths_ + 4 * num_sequences;
  ds.doc_index_ = ds.pointers_ + 8 * num_sequences;
  ds.modes_ = ds.doc_index_ + 8 * num_doc_index;

  const uint64_t bin_size = ds.bin_.size();
  const uint64_t item = DTypeSize(ds.dtype_);
  int64_t total = 0;
  for (int64_t i = 0; i < ds.num_sequences_; ++i) {
    const int32_t len = ds.sequence_length(i);
    const int64_t ptr = ds.sequence_pointer(i);
    if (len < 0)
      return Corrupt(idx_path, absl::StrCat("sequence ", i, " has negative length ", len));
    if (ptr < 0 || static_cast<uint64_t>(ptr) > bin_size ||
        static_cast<uint64_t>(len) * item > bin_size - static_cast<uint64_t>(ptr)) {
      return Corrupt(bin_path,
                     absl::StrCat("sequence ", i, " (", len, " items at byte ", ptr,
                                  ") lies beyond the end of the file (", bin_size,
                                  " bytes): truncated, or the .idx does not belong to it"));
    }
    total += len;
  }
  ds.total_tokens_ = total;
  int64_t previous = 0;
  for (int64_t d = 0; d < ds.num_doc_index_; ++d) {
    const int64_t v = ds.document_index(d);
    if (v < previous || v > ds.num_sequences_) {
      return Corrupt(idx_path, absl::StrCat("document index entry ", d, " = ", v,
                                            " is not a non-decreasing sequence index in [0, ",
                                            ds.num_sequences_, "]"));
    }
    previous = v;
  }
  if (ds.document_index(0) != 0) {
    return Corrupt(idx_path, absl::StrCat("first document index entry is ", ds.document_index(0),
                                          ", expected 0"));
  }
  if (ds.document_index(ds.num_doc_index_ - 1) != ds.num_sequences_) {
    return Corrupt(idx_path, absl::StrCat("last document index entry is ",
                                          ds.document_index(ds.num_doc_index_ - 1), ", expected ",
                                          ds.num_sequences_, " (the number of sequences)"));
  }
  return ds;
}

std::string_view IndexedDataset::sequence_bytes(int64_t i) const {
  return std::string_view(reinterpret_cast<const char*>(bin_.data()) + sequence_pointer(i),
                          static_cast<size_t>(sequence_length(i)) * item_size());
}

absl::Status IndexedDataset::ReadTokens(int64_t i, int64_t offset, int64_t length,
                                        std::vector<int64_t>* out) const {
  if (i < 0 || i >= num_sequences_) {
    return absl::OutOfRangeError(
        absl::StrCat(prefix_, ": sequence ", i, " out of range [0, ", num_sequences_, ")"));
  }
  const int64_t len = sequence_length(i);
  if (offset < 0 || length < 0 || offset > len || length > len - offset) {
    return absl::OutOfRangeError(absl::StrCat(prefix_, ": tokens [", offset, ", ", offset + length,
                                              ") of sequence ", i, " (length ", len, ")"));
  }
  const uint8_t* p = bin_.data() + sequence_pointer(i) + offset * static_cast<int64_t>(item_size());
  int64_t bad = -1;
  switch (dtype_) {
    case DType::kUInt8:
      bad = AppendConverted<uint8_t>(p, length, out);
      break;
    case DType::kInt8:
      bad = AppendConverted<int8_t>(p, length, out);
      break;
    case DType::kInt16:
      bad = AppendConverted<int16_t>(p, length, out);
      break;
    case DType::kInt32:
      bad = AppendConverted<int32_t>(p, length, out);
      break;
    case DType::kInt64:
      bad = AppendConverted<int64_t>(p, length, out);
      break;
    case DType::kFloat64:
      bad = AppendConverted<double>(p, length, out);
      break;
    case DType::kFloat32:
      bad = AppendConverted<float>(p, length, out);
      break;
    case DType::kUInt16:
      bad = AppendConverted<uint16_t>(p, length, out);
      break;
  }
  if (bad >= 0) {
    return Corrupt(prefix_ + ".bin",
                   absl::StrCat("sequence ", i, " token ", offset + bad,
                                ": floating-point value is not an integer token"));
  }
  return absl::OkStatus();
}

}  // namespace leantron::data
