// Small file-system helpers for crash-safe writes: everything the checkpoint code publishes is
// written under a temporary name, flushed, and renamed into place.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace leantron::ckpt {

// Quotes and escapes `text` as a JSON string the way serde_json does (so our safetensors headers
// are byte-identical to the reference writer's).
std::string JsonQuote(std::string_view text);

// Writes `contents` to `path` via `path`.tmp, fsync and rename; then fsyncs the directory.
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::Status FsyncPath(const std::string& path);  // A file or a directory.
absl::Status FsyncParentDir(const std::string& path);

}  // namespace leantron::ckpt
