#include "libfs/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace leantron::fs {
namespace {

constexpr size_t kWriteBufferSize = 1 << 20;

absl::Status WriteAll(int fd, const uint8_t* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", path, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PwriteAll(int fd, const uint8_t* data, size_t size, uint64_t offset,
                       const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", path, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Temporary paths the signal handler removes. Fixed storage, because a handler may only touch
// memory that is always valid; a slot is 0 free, 1 being written, 2 ready.
constexpr int kCleanupSlots = 256;
constexpr size_t kCleanupPathMax = 4096;
struct CleanupSlot {
  std::atomic<int> state{0};
  char path[kCleanupPathMax];
};
CleanupSlot g_cleanup[kCleanupSlots];

int RegisterCleanup(const std::string& path) {
  if (path.size() >= kCleanupPathMax) return -1;
  for (int i = 0; i < kCleanupSlots; ++i) {
    int expected = 0;
    if (g_cleanup[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_cleanup[i].path, path.c_str(), path.size() + 1);
      g_cleanup[i].state.store(2);
      return i;
    }
  }
  return -1;
}

void UnregisterCleanup(int slot) {
  if (slot >= 0) g_cleanup[slot].state.store(0);
}

extern "C" void RemoveTempFilesAndDie(int sig) {
  for (CleanupSlot& slot : g_cleanup) {
    if (slot.state.load() == 2) ::unlink(slot.path);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Holds SIGINT, SIGTERM and SIGHUP back while a group of renames runs (delivered afterwards).
class BlockStopSignals {
 public:
  BlockStopSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
    ::pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockStopSignals() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

absl::Status ErrnoError(absl::string_view what, const std::string& path, int err) {
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

std::string TempPathFor(const std::string& final_path) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(final_path, ".tmp-", ::getpid(), "-", counter++);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status st = ErrnoError("cannot read", path, errno);
      ::close(fd);
      return st;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync", path, err);
  return absl::OkStatus();
}

absl::Status FsyncParentDir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return FsyncPath(parent.empty() ? "." : parent.string());
}

absl::Status CheckReplaceableFile(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (S_ISREG(st.st_mode)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      path, ": ", S_ISDIR(st.st_mode) ? "a directory" : "something other than a regular file",
      " is in the way of the output file; move it away"));
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = writer->Write(contents); !s.ok()) return s;
  return writer->Commit();
}

// ---- AtomicFileWriter ----

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& final_path) {
  if (absl::Status s = CheckReplaceableFile(final_path); !s.ok()) return s;
  AtomicFileWriter writer;
  writer.final_path_ = final_path;
  writer.temp_path_ = TempPathFor(final_path);
  writer.fd_ = ::open(writer.temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (writer.fd_ < 0) {
    const int err = errno;
    const std::string temp = std::exchange(writer.temp_path_, std::string());
    return ErrnoError("cannot create", temp, err);
  }
  writer.cleanup_slot_ = RegisterCleanup(writer.temp_path_);
  return writer;
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept { *this = std::move(other); }

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    fd_ = std::exchange(other.fd_, -1);
    cleanup_slot_ = std::exchange(other.cleanup_slot_, -1);
    finished_ = std::exchange(other.finished_, false);
    final_path_ = std::move(other.final_path_);
    temp_path_ = std::exchange(other.temp_path_, std::string());
    buffer_ = std::move(other.buffer_);
    bytes_written_ = std::exchange(other.bytes_written_, 0);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

absl::Status AtomicFileWriter::Write(const void* data, size_t size) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(final_path_, ": writer closed"));
  const uint8_t* p = static_cast<const uint8_t*>(data);
  bytes_written_ += size;
  if (buffer_.size() + size > kWriteBufferSize) {
    if (absl::Status s = FlushBuffer(); !s.ok()) return s;
    if (size >= kWriteBufferSize) return WriteAll(fd_, p, size, temp_path_);
  }
  if (buffer_.capacity() == 0) buffer_.reserve(std::min(kWriteBufferSize, size_t{64} << 10));
  buffer_.insert(buffer_.end(), p, p + size);
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::WriteAt(uint64_t offset, const void* data, size_t size) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(final_path_, ": writer closed"));
  if (absl::Status s = FlushBuffer(); !s.ok()) return s;
  return PwriteAll(fd_, static_cast<const uint8_t*>(data), size, offset, temp_path_);
}

absl::Status AtomicFileWriter::Truncate(uint64_t size) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(final_path_, ": writer closed"));
  if (absl::Status s = FlushBuffer(); !s.ok()) return s;
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    return ErrnoError("cannot size", temp_path_, errno);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::FlushBuffer() {
  absl::Status s = WriteAll(fd_, buffer_.data(), buffer_.size(), temp_path_);
  buffer_.clear();
  return s;
}

absl::Status AtomicFileWriter::Flush(bool sync) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(final_path_, ": writer closed"));
  if (absl::Status s = FlushBuffer(); !s.ok()) return s;
  if (sync && ::fsync(fd_) != 0) return ErrnoError("cannot fsync", temp_path_, errno);
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Finish() {
  if (finished_) return absl::OkStatus();
  if (absl::Status s = Flush(/*sync=*/true); !s.ok()) return s;
  if (::close(std::exchange(fd_, -1)) != 0) return ErrnoError("cannot close", temp_path_, errno);
  finished_ = true;
  return absl::OkStatus();
}

void AtomicFileWriter::Forget() {
  temp_path_.clear();
  UnregisterCleanup(std::exchange(cleanup_slot_, -1));
}

absl::Status AtomicFileWriter::Commit() {
  if (absl::Status s = Finish(); !s.ok()) return s;
  if (temp_path_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(final_path_, ": writer closed"));
  }
  if (absl::Status s = CheckReplaceableFile(final_path_); !s.ok()) return s;
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    return ErrnoError("cannot rename to", final_path_, errno);
  }
  Forget();
  return FsyncParentDir(final_path_);
}

void AtomicFileWriter::Abandon() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  UnregisterCleanup(std::exchange(cleanup_slot_, -1));
  temp_path_.clear();
  buffer_.clear();
}

absl::Status CommitTogether(const std::vector<AtomicFileWriter*>& files) {
  for (AtomicFileWriter* f : files) {
    if (absl::Status s = f->Finish(); !s.ok()) return s;
    if (f->temp_path_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(f->final_path_, ": writer closed"));
    }
    if (absl::Status s = CheckReplaceableFile(f->final_path_); !s.ok()) return s;
  }
  BlockStopSignals hold;
  const std::string old_suffix = absl::StrCat(".old-", ::getpid());
  std::vector<bool> moved(files.size(), false), placed(files.size(), false);
  auto undo = [&] {
    for (size_t i = files.size(); i-- > 0;) {
      if (placed[i]) ::rename(files[i]->final_path_.c_str(), files[i]->temp_path_.c_str());
    }
    for (size_t i = 0; i < files.size(); ++i) {
      if (moved[i]) {
        ::rename((files[i]->final_path_ + old_suffix).c_str(), files[i]->final_path_.c_str());
      }
    }
  };
  // Old files aside, the last named first: a reader never sees a new file beside an old one.
  for (size_t i = files.size(); i-- > 0;) {
    const std::string& final_path = files[i]->final_path_;
    if (!Exists(final_path)) continue;
    if (::rename(final_path.c_str(), (final_path + old_suffix).c_str()) != 0) {
      absl::Status s = ErrnoError("cannot move aside", final_path, errno);
      undo();
      return s;
    }
    moved[i] = true;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (::rename(files[i]->temp_path_.c_str(), files[i]->final_path_.c_str()) != 0) {
      absl::Status s = ErrnoError("cannot rename to", files[i]->final_path_, errno);
      undo();
      return s;
    }
    placed[i] = true;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (moved[i]) ::unlink((files[i]->final_path_ + old_suffix).c_str());
    files[i]->Forget();
  }
  for (AtomicFileWriter* f : files) {
    if (absl::Status s = FsyncParentDir(f->final_path_); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReplaceDirectory(const std::string& new_dir, const std::string& final_dir) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  struct stat st;
  if (::lstat(final_dir.c_str(), &st) != 0) {
    if (::rename(new_dir.c_str(), final_dir.c_str()) != 0) {
      return ErrnoError("cannot rename to", final_dir, errno);
    }
    return FsyncParentDir(final_dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(final_dir, ": exists and is not a directory; move it away"));
  }
  BlockStopSignals hold;
  std::string old_tree;
  if (::renameat2(AT_FDCWD, new_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    old_tree = new_dir;  // now holds the replaced tree
  } else {
    old_tree = absl::StrCat(final_dir, ".old-", ::getpid());
    if (::rename(final_dir.c_str(), old_tree.c_str()) != 0) {
      return ErrnoError("cannot move aside", final_dir, errno);
    }
    if (::rename(new_dir.c_str(), final_dir.c_str()) != 0) {
      absl::Status s = ErrnoError("cannot rename to", final_dir, errno);
      ::rename(old_tree.c_str(), final_dir.c_str());
      return s;
    }
  }
  if (absl::Status s = FsyncParentDir(final_dir); !s.ok()) return s;
  stdfs::remove_all(old_tree, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(final_dir, " was replaced, but the old copy ", old_tree,
                                            " could not be removed: ", ec.message()));
  }
  return absl::OkStatus();
}

void InstallTempFileCleanupOnSignals() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction action {};
    action.sa_handler = RemoveTempFilesAndDie;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
}

}  // namespace leantron::fs
