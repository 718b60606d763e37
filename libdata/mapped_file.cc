#include "libdata/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

}  // namespace

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
