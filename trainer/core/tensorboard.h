// --tensorboard-dir: scalar summaries in TensorBoard's event-file format (TFRecord framing of
// tensorflow.Event protos), written without TensorFlow: the protos are three small messages,
// encoded here field by field.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace leantron::trainer {

// CRC-32C (Castagnoli), as TFRecord frames use. None of the project's Debian dependencies
// provides it (Abseil's crc32c arrived after the packaged version).
uint32_t Crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host> and writes the file-version record.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir);
  ~TensorBoardWriter();

  void AddScalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter() = default;
  void WriteRecord(const std::string& event);
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace leantron::trainer
