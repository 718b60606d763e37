// Small file helpers shared by the data tools: whole-file reads and atomic writes.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace leantron::data {

// Reads a whole file; the error names the path and the system's reason.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `contents` to `path` atomically: a temporary file beside it, fsync, then rename, so a
// reader sees either the old file or the complete new one.
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

}  // namespace leantron::data
