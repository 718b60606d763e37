#include "libdata/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace leantron::data {
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

// Temporary paths the signal handler removes. Fixed storage, because a handler may only touch
// memory that is always valid; a slot is 0 free, 1 being written, 2 ready.
constexpr int kCleanupSlots = 64;
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

}  // namespace

void InstallTempFileCleanupOnSignals() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction action {};
    action.sa_handler = RemoveTempFilesAndDie;
    sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
}

absl::Status ErrnoError(absl::string_view what, const std::string& path, int err) {
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

// ---- MappedFile ----

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("cannot mmap", path, err);
    }
    file.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---- AtomicFileWriter ----

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& final_path) {
  static std::atomic<uint64_t> counter{0};
  AtomicFileWriter writer;
  writer.final_path_ = final_path;
  writer.temp_path_ = absl::StrCat(final_path, ".tmp-", ::getpid(), "-", counter++);
  writer.fd_ = ::open(writer.temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (writer.fd_ < 0) return ErrnoError("cannot create", writer.temp_path_, errno);
  writer.cleanup_slot_ = RegisterCleanup(writer.temp_path_);
  writer.buffer_.reserve(kWriteBufferSize);
  return writer;
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept { *this = std::move(other); }

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    fd_ = std::exchange(other.fd_, -1);
    cleanup_slot_ = std::exchange(other.cleanup_slot_, -1);
    final_path_ = std::move(other.final_path_);
    temp_path_ = std::move(other.temp_path_);
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
  buffer_.insert(buffer_.end(), p, p + size);
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

absl::Status AtomicFileWriter::Commit() {
  if (absl::Status s = Flush(/*sync=*/true); !s.ok()) return s;
  if (::close(std::exchange(fd_, -1)) != 0) return ErrnoError("cannot close", temp_path_, errno);
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return ErrnoError("cannot rename to", final_path_, err);
  }
  temp_path_.clear();
  UnregisterCleanup(std::exchange(cleanup_slot_, -1));
  return absl::OkStatus();
}

void AtomicFileWriter::Abandon() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  UnregisterCleanup(std::exchange(cleanup_slot_, -1));
  temp_path_.clear();
  buffer_.clear();
}

// ---- SpoolFile ----

absl::StatusOr<SpoolFile> SpoolFile::Create(const std::string& directory) {
  std::string pattern =
      (directory.empty() ? std::string(".") : directory) + "/.leantron-spool-XXXXXX";
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) return ErrnoError("cannot create spool file in", directory, errno);
  ::unlink(pattern.c_str());  // Anonymous from now on: nothing is left behind if we are killed.
  SpoolFile file;
  file.fd_ = fd;
  file.buffer_.reserve(kWriteBufferSize);
  return file;
}

SpoolFile::SpoolFile(SpoolFile&& other) noexcept { *this = std::move(other); }

SpoolFile& SpoolFile::operator=(SpoolFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    buffer_ = std::move(other.buffer_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SpoolFile::~SpoolFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status SpoolFile::Append(const void* data, size_t size) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  size_ += size;
  if (buffer_.size() + size > kWriteBufferSize) {
    if (absl::Status s = FlushBuffer(); !s.ok()) return s;
    if (size >= kWriteBufferSize) return WriteAll(fd_, p, size, "(spool file)");
  }
  buffer_.insert(buffer_.end(), p, p + size);
  return absl::OkStatus();
}

absl::Status SpoolFile::FlushBuffer() {
  absl::Status s = WriteAll(fd_, buffer_.data(), buffer_.size(), "(spool file)");
  buffer_.clear();
  return s;
}

absl::Status SpoolFile::ReadAt(uint64_t offset, void* data, size_t size) {
  uint8_t* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::pread(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError("cannot read back spool file");
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace leantron::data
