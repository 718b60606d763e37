#include "libckpt/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "libckpt/strings.h"

namespace leantron::ckpt {

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(Cat(path, ": no such file"));
    return absl::PermissionDeniedError(Cat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(Cat(path, ": not a regular file"));
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(Cat(path, ": cannot mmap: ", std::strerror(err)));
    }
    file->map_ = static_cast<const std::byte*>(map);
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(file));
}

MappedFile::~MappedFile() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), size_);
}

namespace {

// A fault maps the kernel's fault-around window (64 KiB of address space) and, on kernels that
// keep files in large folios, the whole folio holding the faulting page: up to 2 MiB, aligned in
// the file. Dropping only the pages of a view leaves those neighbours mapped (150 MB of a 2.3 GB
// file streamed in 256 KiB pieces not aligned to pages, measured on Linux 6.18).
constexpr uintptr_t kWindow = uintptr_t{64} << 10;
constexpr uintptr_t kFolio = uintptr_t{2} << 20;

}  // namespace

void MappedFile::Release(std::span<const std::byte> view) const {
  if (view.empty() || map_ == nullptr) return;
  const auto map_begin = reinterpret_cast<uintptr_t>(map_);
  const auto end = reinterpret_cast<uintptr_t>(view.data()) + view.size();
  const uintptr_t folio_last = map_begin + (end - map_begin + kFolio - 1) / kFolio * kFolio;
  Drop(view.data(), std::max(folio_last, (end + kWindow - 1) / kWindow * kWindow));
}

void MappedFile::ReleaseBehind(std::span<const std::byte> view) const {
  if (view.empty() || map_ == nullptr) return;
  const auto map_begin = reinterpret_cast<uintptr_t>(map_);
  const auto end = reinterpret_cast<uintptr_t>(view.data()) + view.size();
  Drop(view.data(),
       std::min(map_begin + (end - map_begin) / kFolio * kFolio, end / kWindow * kWindow));
}

void MappedFile::Drop(const std::byte* from, uintptr_t upto) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto map_begin = reinterpret_cast<uintptr_t>(map_);
  const uintptr_t map_end = (map_begin + size_ + page - 1) / page * page;
  const auto begin = reinterpret_cast<uintptr_t>(from);
  const uintptr_t folio_first = map_begin + (begin - map_begin) / kFolio * kFolio;
  const uintptr_t first = std::max(map_begin, std::min(folio_first, begin / kWindow * kWindow));
  const uintptr_t last = std::min(map_end, upto);
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace leantron::ckpt
