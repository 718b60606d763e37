// Streaming line reader for JSONL corpora: plain `.jsonl`, zstd `.zst` and gzip `.gz` files,
// given as files, globs or directories. Lines are returned one at a time from a bounded buffer,
// so memory does not grow with the file. Decompression errors (corrupt or truncated streams)
// are errors naming the file and line, never a silent early end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace leantron::data {

// Expands `inputs` in order: a glob pattern becomes its sorted matches, a directory its JSONL
// files (*.jsonl, *.json, and those with .zst/.gz after them) found recursively in sorted order,
// a file itself, "-" standard input. A pattern or path that matches nothing is an error.
absl::StatusOr<std::vector<std::string>> ExpandInputs(const std::vector<std::string>& inputs);

// Source of decompressed bytes for one file.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `size` bytes; 0 means end of data. Errors name the file.
  virtual absl::StatusOr<size_t> Read(char* data, size_t size) = 0;
  // Compressed bytes consumed so far (the file's own bytes for plain files).
  virtual uint64_t raw_bytes() const = 0;
};

// Picks the decoder from the file name: ".zst" zstd, ".gz" gzip, anything else plain; "-" is
// standard input, plain.
absl::StatusOr<std::unique_ptr<ByteSource>> OpenByteSource(const std::string& path);

class LineReader {
 public:
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path);

  // Sets `*line` to the next line without its '\n' (valid until the next call) and returns
  // true, or returns false at the end. The last line need not end with '\n'.
  absl::StatusOr<bool> Next(std::string_view* line);
  // 1-based number of the line last returned.
  int64_t line_number() const { return line_number_; }
  uint64_t raw_bytes() const { return source_->raw_bytes(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<ByteSource> source_;
  std::string buffer_;
  size_t begin_ = 0;  // start of unread data in buffer_
  size_t end_ = 0;    // end of valid data in buffer_
  bool eof_ = false;
  int64_t line_number_ = 0;
};

}  // namespace leantron::data
