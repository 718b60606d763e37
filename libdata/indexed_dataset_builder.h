// Streaming writer of Megatron's indexed dataset (.bin/.idx), byte-identical to
// megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder for the same calls.
//
// Megatron keeps every sequence length, pointer and document boundary in Python lists until
// finalize(), which runs out of memory on terabyte corpora. This builder spools lengths and
// document boundaries to anonymous scratch files beside the output and assembles the .idx at
// Finalize(), so its memory is a few buffers whatever the corpus size. Both outputs are written
// under temporary names and replaced together when both are complete (libfs's CommitTogether):
// a run that fails or is interrupted leaves the previous pair, if any, as it was.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libdata/indexed_dataset.h"
#include "libdata/mapped_file.h"

namespace leantron::data {

class IndexedDatasetBuilder {
 public:
  // Output files: `<prefix>.bin` and `<prefix>.idx`.
  static absl::StatusOr<std::unique_ptr<IndexedDatasetBuilder>> Create(const std::string& prefix,
                                                                       DType dtype);
  ~IndexedDatasetBuilder();

  // Megatron's add_item: one sequence. Values must fit the dtype (an error names the first that
  // does not); for float dtypes they are converted.
  absl::Status AddItem(absl::Span<const int32_t> tokens);
  absl::Status AddItem(absl::Span<const int64_t> values);
  // One sequence given as raw little-endian elements of the dtype.
  absl::Status AddItemBytes(std::string_view bytes);
  // Megatron's end_document: closes a document after the sequences added since the last one.
  absl::Status EndDocument();
  // Megatron's add_document: `tokens` holds the sequences back to back, `lengths` their sizes.
  absl::Status AddDocument(absl::Span<const int32_t> tokens, absl::Span<const int32_t> lengths);
  // Megatron's add_index: appends a whole dataset (same dtype), streaming its files.
  absl::Status AddIndex(const std::string& prefix);
  // Writes the .idx and replaces both files together (or, on failure, neither).
  absl::Status Finalize();
  // Discards everything; no output file is left (also what the destructor does if not finalized).
  void Abandon();

  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }
  uint64_t bin_bytes() const { return bin_.bytes_written(); }

 private:
  IndexedDatasetBuilder() = default;
  template <typename T>
  absl::Status AppendConverted(absl::Span<const T> values);
  absl::Status AddLength(int64_t length);

  std::string prefix_;
  DType dtype_ = DType::kUInt16;
  fs::AtomicFileWriter bin_;
  SpoolFile lengths_;    // i32 per sequence
  SpoolFile doc_index_;  // i64 per document boundary, starting with 0
  int64_t num_sequences_ = 0;
  int64_t num_documents_ = 0;
  std::vector<uint8_t> scratch_;
  bool finished_ = false;
};

// Megatron's tools/merge_datasets.py: every `<p>.bin`/`<p>.idx` pair in `input_dir` is appended in
// sorted prefix order into `<output_prefix>.bin/.idx`; dtypes must match. A lone .bin or .idx is
// an error, and so is an output that is one of the inputs (compared as files, whatever the
// spelling): it would be overwritten. Returns the prefixes merged.
absl::StatusOr<std::vector<std::string>> MergeDatasetDirectory(const std::string& input_dir,
                                                               const std::string& output_prefix);
// Same, for an explicit list of prefixes, in the given order.
absl::Status MergeDatasets(const std::vector<std::string>& prefixes,
                           const std::string& output_prefix);

}  // namespace leantron::data
