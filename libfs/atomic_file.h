// Crash-safe file writing, shared by libdata and libckpt (which stay independent of each other):
// everything the tools publish is written under a temporary name beside its final one, flushed,
// fsynced and renamed into place, so a reader sees the old file or the complete new one, never a
// part. Groups of files that only make sense together (a dataset's .bin/.idx) are replaced
// together or not at all, and a folder can be replaced as a whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace leantron::fs {

// "<what> <path>: <strerror(err)>" as a Status of the matching kind (NotFound, PermissionDenied,
// ResourceExhausted for a full disk or quota, else Internal).
absl::Status ErrnoError(absl::string_view what, const std::string& path, int err);

// A fresh temporary name beside `final_path`: "<final>.tmp-<pid>-<n>".
std::string TempPathFor(const std::string& final_path);

absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// fsync of a file or a directory.
absl::Status FsyncPath(const std::string& path);
absl::Status FsyncParentDir(const std::string& path);
// Refuses (FailedPrecondition) when something other than a regular file sits at `path`, so a
// rename could not replace it; a missing path is fine.
absl::Status CheckReplaceableFile(const std::string& path);

// Writes `contents` to `path` via a temporary file, fsync and rename; then fsyncs the directory.
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

// A file written under a temporary name and published by Commit(). Sequential writes are
// buffered; WriteAt writes at an offset (flushing the buffer first). Destroying an uncommitted
// writer removes the temporary file.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& final_path);
  AtomicFileWriter() = default;
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Write(const void* data, size_t size);
  absl::Status Write(std::string_view bytes) { return Write(bytes.data(), bytes.size()); }
  absl::Status WriteAt(uint64_t offset, const void* data, size_t size);
  // Sets the file's size (pre-sizing a file written with WriteAt).
  absl::Status Truncate(uint64_t size);
  // Flushes the buffer; with `sync` also fsyncs: the data is durable under the temporary name.
  absl::Status Flush(bool sync);
  // Flush, fsync and close, without renaming: what CommitTogether expects.
  absl::Status Finish();
  // Finish (when not yet done), rename to the final path, fsync the directory.
  absl::Status Commit();
  // Closes and removes the temporary file (idempotent).
  void Abandon();

  uint64_t bytes_written() const { return bytes_written_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }
  bool finished() const { return finished_; }

 private:
  friend absl::Status CommitTogether(const std::vector<AtomicFileWriter*>& files);
  absl::Status FlushBuffer();
  void Forget();  // after a successful rename: nothing left to remove
  int fd_ = -1;
  int cleanup_slot_ = -1;  // registration for InstallTempFileCleanupOnSignals
  bool finished_ = false;
  std::string final_path_;
  std::string temp_path_;
  std::vector<uint8_t> buffer_;
  uint64_t bytes_written_ = 0;
};

// Publishes files that belong together (each Finish()ed or not yet): all are replaced, or, on
// any failure, none is and the old files stay. The old files are first moved aside (the last one
// named first: put the file readers open first, such as a dataset's .idx, last), then the new
// ones renamed in order, then the old ones removed; a failure renames the old ones back. Signals
// are held off meanwhile, so only a crash can interrupt it, and then the old files are still
// there under "<final>.old-<pid>" names. Something other than a regular file in the way is an
// error before anything moves.
absl::Status CommitTogether(const std::vector<AtomicFileWriter*>& files);

// Replaces `final_dir` (absent, or a directory) by the complete directory `new_dir` beside it:
// swapped in one step where the file system can (renameat2 RENAME_EXCHANGE), else via a rename
// aside; the old tree is removed afterwards.
absl::Status ReplaceDirectory(const std::string& new_dir, const std::string& final_dir);

// Makes SIGINT, SIGTERM and SIGHUP remove the temporary files of every AtomicFileWriter still
// open before the process dies (with the signal's default action, so the exit status still
// tells). For tools: a killed run then leaves nothing behind; SIGKILL leaves only `*.tmp-*`.
void InstallTempFileCleanupOnSignals();

}  // namespace leantron::fs
