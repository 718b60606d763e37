#include "libdata/indexed_dataset_builder.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <set>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace leantron::data {
namespace {

std::string DirectoryOf(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Out is never wider than int64 and In is a signed integer, so int64 compares are exact.
template <typename Out, typename In>
bool Fits(In v) {
  if constexpr (std::is_floating_point_v<Out>) {
    return true;
  } else {
    return static_cast<int64_t>(v) >= static_cast<int64_t>(std::numeric_limits<Out>::min()) &&
           static_cast<int64_t>(v) <= static_cast<int64_t>(std::numeric_limits<Out>::max());
  }
}

template <typename Out, typename In>
absl::Status Convert(absl::Span<const In> values, std::vector<uint8_t>* bytes, DType dtype) {
  bytes->resize(values.size() * sizeof(Out));
  for (size_t k = 0; k < values.size(); ++k) {
    const In v = values[k];
    if constexpr (sizeof(Out) < sizeof(In) || std::is_unsigned_v<Out>) {
      if (!Fits<Out>(v)) {
        return absl::InvalidArgumentError(absl::StrCat("value ", v, " at position ", k,
                                                       " does not fit dtype ", DTypeName(dtype)));
      }
    }
    const Out out = static_cast<Out>(v);
    std::memcpy(bytes->data() + k * sizeof(Out), &out, sizeof(Out));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<IndexedDatasetBuilder>> IndexedDatasetBuilder::Create(
    const std::string& prefix, DType dtype) {
  std::unique_ptr<IndexedDatasetBuilder> b(new IndexedDatasetBuilder());
  b->prefix_ = prefix;
  b->dtype_ = dtype;
  const std::string dir = DirectoryOf(prefix);
  // Refuse before any work what would make the final renames fail.
  if (absl::Status s = fs::CheckReplaceableFile(IdxPath(prefix)); !s.ok()) return s;
  absl::StatusOr<fs::AtomicFileWriter> bin = fs::AtomicFileWriter::Create(BinPath(prefix));
  if (!bin.ok()) return bin.status();
  b->bin_ = *std::move(bin);
  absl::StatusOr<SpoolFile> lengths = SpoolFile::Create(dir);
  if (!lengths.ok()) return lengths.status();
  b->lengths_ = *std::move(lengths);
  absl::StatusOr<SpoolFile> docs = SpoolFile::Create(dir);
  if (!docs.ok()) return docs.status();
  b->doc_index_ = *std::move(docs);
  const int64_t zero = 0;
  if (absl::Status s = b->doc_index_.Append(&zero, sizeof(zero)); !s.ok()) return s;
  return b;
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() { Abandon(); }

void IndexedDatasetBuilder::Abandon() {
  if (!finished_) bin_.Abandon();
  finished_ = true;
}

absl::Status IndexedDatasetBuilder::AddLength(int64_t length) {
  if (length > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix_, ": a sequence of ", length, " items exceeds the int32 length field"));
  }
  const int32_t len = static_cast<int32_t>(length);
  ++num_sequences_;
  return lengths_.Append(&len, sizeof(len));
}

template <typename T>
absl::Status IndexedDatasetBuilder::AppendConverted(absl::Span<const T> values) {
  absl::Status s;
  switch (dtype_) {
    case DType::kUInt8:
      s = Convert<uint8_t>(values, &scratch_, dtype_);
      break;
    case DType::kInt8:
      s = Convert<int8_t>(values, &scratch_, dtype_);
      break;
    case DType::kInt16:
      s = Convert<int16_t>(values, &scratch_, dtype_);
      break;
    case DType::kInt32:
      s = Convert<int32_t>(values, &scratch_, dtype_);
      break;
    case DType::kInt64:
      s = Convert<int64_t>(values, &scratch_, dtype_);
      break;
    case DType::kFloat64:
      s = Convert<double>(values, &scratch_, dtype_);
      break;
    case DType::kFloat32:
      s = Convert<float>(values, &scratch_, dtype_);
      break;
    case DType::kUInt16:
      s = Convert<uint16_t>(values, &scratch_, dtype_);
      break;
  }
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(prefix_, ": ", s.message()));
  return bin_.Write(scratch_.data(), scratch_.size());
}

absl::Status IndexedDatasetBuilder::AddItem(absl::Span<const int32_t> tokens) {
  if (finished_) return absl::FailedPreconditionError(prefix_ + ": builder already finished");
  if (absl::Status s = AppendConverted(tokens); !s.ok()) return s;
  return AddLength(static_cast<int64_t>(tokens.size()));
}

absl::Status IndexedDatasetBuilder::AddItem(absl::Span<const int64_t> values) {
  if (finished_) return absl::FailedPreconditionError(prefix_ + ": builder already finished");
  if (absl::Status s = AppendConverted(values); !s.ok()) return s;
  return AddLength(static_cast<int64_t>(values.size()));
}

absl::Status IndexedDatasetBuilder::AddItemBytes(std::string_view bytes) {
  if (finished_) return absl::FailedPreconditionError(prefix_ + ": builder already finished");
  if (bytes.size() % DTypeSize(dtype_) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, ": ", bytes.size(),
                                                   " bytes is not a whole number of ",
                                                   DTypeName(dtype_), " items"));
  }
  if (absl::Status s = bin_.Write(bytes); !s.ok()) return s;
  return AddLength(static_cast<int64_t>(bytes.size() / DTypeSize(dtype_)));
}

absl::Status IndexedDatasetBuilder::EndDocument() {
  if (finished_) return absl::FailedPreconditionError(prefix_ + ": builder already finished");
  ++num_documents_;
  return doc_index_.Append(&num_sequences_, sizeof(num_sequences_));
}

absl::Status IndexedDatasetBuilder::AddDocument(absl::Span<const int32_t> tokens,
                                                absl::Span<const int32_t> lengths) {
  if (finished_) return absl::FailedPreconditionError(prefix_ + ": builder already finished");
  int64_t total = 0;
  for (const int32_t len : lengths) {
    if (len < 0) return absl::InvalidArgumentError(prefix_ + ": negative sequence length");
    total += len;
  }
  if (total != static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, ": document lengths sum to ", total,
                                                   " but it has ", tokens.size(), " tokens"));
  }
  if (absl::Status s = AppendConverted(tokens); !s.ok()) return s;
  for (const int32_t len : lengths) {
    if (absl::Status s = AddLength(len); !s.ok()) return s;
  }
  return EndDocument();
}

absl::Status IndexedDatasetBuilder::AddIndex(const std::string& prefix) {
  if (finished_) return absl::FailedPreconditionError(prefix_ + ": builder already finished");
  absl::StatusOr<IndexedDataset> in = IndexedDataset::Open(prefix);
  if (!in.ok()) return in.status();
  if (in->dtype() != dtype_) {
    return absl::InvalidArgumentError(
        absl::StrCat(IdxPath(prefix), ": dtype ", DTypeName(in->dtype()),
                     " differs from the merged dataset's ", DTypeName(dtype_)));
  }
  if (in->multimodal()) {
    return absl::UnimplementedError(absl::StrCat(
        IdxPath(prefix), ": multimodal datasets (per-sequence modes) cannot be merged here"));
  }
  // Megatron copies the whole .bin and recomputes pointers from the lengths; that is only right
  // when the input's sequences are contiguous and fill its .bin, so check that instead of
  // silently writing a dataset whose pointers are wrong.
  const int64_t item = static_cast<int64_t>(in->item_size());
  int64_t expected_ptr = 0;
  for (int64_t i = 0; i < in->num_sequences(); ++i) {
    if (in->sequence_pointer(i) != expected_ptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(IdxPath(prefix), ": sequence ", i,
                       " is not contiguous with the previous one; cannot merge"));
    }
    expected_ptr += in->sequence_length(i) * item;
  }
  if (static_cast<uint64_t>(expected_ptr) != in->bin_file().size()) {
    return absl::InvalidArgumentError(absl::StrCat(BinPath(prefix), ": ", in->bin_file().size(),
                                                   " bytes but its index describes ",
                                                   expected_ptr));
  }
  const uint8_t* idx = in->idx_file().data();
  const size_t n = static_cast<size_t>(in->num_sequences());
  if (absl::Status s = lengths_.Append(idx + kIndexHeaderSize, 4 * n); !s.ok()) return s;
  const int64_t offset = num_sequences_;
  for (int64_t d = 1; d <= in->num_documents(); ++d) {
    const int64_t v = in->document_index(d) + offset;
    if (absl::Status s = doc_index_.Append(&v, sizeof(v)); !s.ok()) return s;
  }
  num_sequences_ += in->num_sequences();
  num_documents_ += in->num_documents();
  // Stream the .bin in chunks so the page cache, not this process, holds it.
  const uint8_t* bin = in->bin_file().data();
  const size_t bin_size = in->bin_file().size();
  constexpr size_t kChunk = 8 << 20;
  for (size_t off = 0; off < bin_size; off += kChunk) {
    if (absl::Status s = bin_.Write(bin + off, std::min(kChunk, bin_size - off)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status IndexedDatasetBuilder::Finalize() {
  if (finished_) return absl::FailedPreconditionError(prefix_ + ": builder already finished");
  absl::StatusOr<fs::AtomicFileWriter> idx_or = fs::AtomicFileWriter::Create(IdxPath(prefix_));
  if (!idx_or.ok()) return idx_or.status();
  fs::AtomicFileWriter idx = *std::move(idx_or);
  const uint64_t version = kIndexVersion;
  const uint8_t code = static_cast<uint8_t>(dtype_);
  const uint64_t num_sequences = static_cast<uint64_t>(num_sequences_);
  const uint64_t num_doc_index = doc_index_.size() / sizeof(int64_t);
  absl::Status s = idx.Write(kIndexMagic, sizeof(kIndexMagic));
  if (s.ok()) s = idx.Write(&version, 8);
  if (s.ok()) s = idx.Write(&code, 1);
  if (s.ok()) s = idx.Write(&num_sequences, 8);
  if (s.ok()) s = idx.Write(&num_doc_index, 8);
  // Lengths as spooled, then pointers recomputed from them (Megatron's _sequence_pointers).
  if (s.ok())
    s = lengths_.ForEachChunk([&](const uint8_t* p, size_t n) { return idx.Write(p, n); });
  int64_t pointer = 0;
  const int64_t item = static_cast<int64_t>(DTypeSize(dtype_));
  std::vector<int64_t> pointers;
  if (s.ok()) {
    s = lengths_.ForEachChunk([&](const uint8_t* p, size_t n) {
      pointers.resize(n / 4);
      for (size_t k = 0; k < n / 4; ++k) {
        int32_t len;
        std::memcpy(&len, p + 4 * k, 4);
        pointers[k] = pointer;
        pointer += static_cast<int64_t>(len) * item;
      }
      return idx.Write(pointers.data(), pointers.size() * 8);
    });
  }
  if (s.ok())
    s = doc_index_.ForEachChunk([&](const uint8_t* p, size_t n) { return idx.Write(p, n); });
  // The pair is replaced together or not at all: a failure here (a full disk, something in the
  // way) leaves the previous <prefix>.bin/.idx as they were.
  if (s.ok()) s = fs::CommitTogether({&bin_, &idx});
  finished_ = true;
  if (!s.ok()) {
    bin_.Abandon();
    idx.Abandon();
  }
  return s;
}

absl::Status MergeDatasets(const std::vector<std::string>& prefixes,
                           const std::string& output_prefix) {
  if (prefixes.empty()) return absl::InvalidArgumentError("no datasets to merge");
  // Files, not spellings: "parts/x", "./parts/x" and "$PWD/parts/x" are one dataset.
  for (const std::string& input : prefixes) {
    for (const std::string& out : {BinPath(output_prefix), IdxPath(output_prefix)}) {
      for (const std::string& in : {BinPath(input), IdxPath(input)}) {
        if (SameFile(in, out)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--output-prefix ", output_prefix, " is the input dataset ", input,
              ": merging would overwrite it (and leave it out, or read it while writing it); "
              "write the merge outside the input or move that dataset away"));
        }
      }
    }
  }
  absl::StatusOr<IndexedDataset> first = IndexedDataset::Open(prefixes.front());
  if (!first.ok()) return first.status();
  absl::StatusOr<std::unique_ptr<IndexedDatasetBuilder>> builder =
      IndexedDatasetBuilder::Create(output_prefix, first->dtype());
  if (!builder.ok()) return builder.status();
  for (const std::string& prefix : prefixes) {
    if (absl::Status s = (*builder)->AddIndex(prefix); !s.ok()) return s;
  }
  return (*builder)->Finalize();
}

absl::StatusOr<std::vector<std::string>> MergeDatasetDirectory(const std::string& input_dir,
                                                               const std::string& output_prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(input_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(input_dir, ": not a directory"));
  }
  std::set<std::string> prefixes;  // std::string order == Python's sorted() for UTF-8 names.
  for (const fs::directory_entry& entry : fs::directory_iterator(input_dir, ec)) {
    if (!entry.is_regular_file()) continue;
    const fs::path path = entry.path();
    const std::string ext = path.extension().string();
    if (ext != ".bin" && ext != ".idx") continue;
    const std::string prefix = (path.parent_path() / path.stem()).string();
    const std::string pair = prefix + (ext == ".bin" ? ".idx" : ".bin");
    if (!fs::is_regular_file(pair, ec)) {
      return absl::NotFoundError(absl::StrCat(path.string(), " has no matching ", pair));
    }
    prefixes.insert(prefix);
  }
  if (ec) return absl::InternalError(absl::StrCat(input_dir, ": ", ec.message()));
  std::vector<std::string> ordered(prefixes.begin(), prefixes.end());
  if (ordered.empty()) {
    return absl::NotFoundError(absl::StrCat(input_dir, ": no .bin/.idx pairs to merge"));
  }
  if (absl::Status s = MergeDatasets(ordered, output_prefix); !s.ok()) return s;
  return ordered;
}

}  // namespace leantron::data
