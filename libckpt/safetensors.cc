#include "libckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "libckpt/strings.h"
#include "simdjson.h"

namespace leantron::ckpt {
namespace {

absl::Status Invalid(std::string_view source, std::string_view what) {
  return absl::InvalidArgumentError(Cat(source, ": invalid safetensors file: ", what));
}

absl::Status InvalidTensor(std::string_view source, std::string_view tensor,
                           std::string_view what) {
  return absl::InvalidArgumentError(
      Cat(source, ": invalid safetensors file: tensor '", tensor, "': ", what));
}

absl::StatusOr<uint64_t> ReadUint(simdjson::dom::element value, std::string_view source,
                                  std::string_view tensor, std::string_view field) {
  uint64_t out;
  if (value.get_uint64().get(out) != simdjson::SUCCESS) {
    return InvalidTensor(source, tensor, Cat("'", field, "' must hold non-negative integers"));
  }
  return out;
}

absl::StatusOr<TensorInfo> ParseTensorInfo(std::string_view name, simdjson::dom::element value,
                                           std::string_view source) {
  simdjson::dom::object object;
  if (value.get_object().get(object) != simdjson::SUCCESS) {
    return InvalidTensor(source, name, "entry is not a JSON object");
  }
  TensorInfo info;
  info.name = std::string(name);
  bool have_dtype = false, have_shape = false, have_offsets = false;
  for (auto field : object) {
    if (field.key == "dtype") {
      if (have_dtype) return InvalidTensor(source, name, "duplicate field 'dtype'");
      have_dtype = true;
      std::string_view dtype_name;
      if (field.value.get_string().get(dtype_name) != simdjson::SUCCESS) {
        return InvalidTensor(source, name, "'dtype' is not a string");
      }
      auto dtype = ParseDType(dtype_name);
      if (!dtype) return InvalidTensor(source, name, Cat("unknown dtype '", dtype_name, "'"));
      info.dtype = *dtype;
    } else if (field.key == "shape") {
      if (have_shape) return InvalidTensor(source, name, "duplicate field 'shape'");
      have_shape = true;
      simdjson::dom::array dims;
      if (field.value.get_array().get(dims) != simdjson::SUCCESS) {
        return InvalidTensor(source, name, "'shape' is not an array");
      }
      for (auto dim : dims) {
        auto value_or = ReadUint(dim, source, name, "shape");
        if (!value_or.ok()) return value_or.status();
        info.shape.push_back(*value_or);
      }
    } else if (field.key == "data_offsets") {
      if (have_offsets) return InvalidTensor(source, name, "duplicate field 'data_offsets'");
      have_offsets = true;
      simdjson::dom::array offsets;
      if (field.value.get_array().get(offsets) != simdjson::SUCCESS || offsets.size() != 2) {
        return InvalidTensor(source, name, "'data_offsets' is not an array of two integers");
      }
      auto begin = ReadUint(offsets.at(0).value_unsafe(), source, name, "data_offsets");
      if (!begin.ok()) return begin.status();
      auto end = ReadUint(offsets.at(1).value_unsafe(), source, name, "data_offsets");
      if (!end.ok()) return end.status();
      info.begin = *begin;
      info.end = *end;
    }
    // Unknown fields are ignored, as the reference reader does.
  }
  if (!have_dtype) return InvalidTensor(source, name, "missing field 'dtype'");
  if (!have_shape) return InvalidTensor(source, name, "missing field 'shape'");
  if (!have_offsets) return InvalidTensor(source, name, "missing field 'data_offsets'");
  return info;
}

// Offsets must tile the buffer exactly and each extent must match dtype x shape.
absl::Status ValidateExtents(std::vector<TensorInfo>& tensors, uint64_t buffer_size,
                             std::string_view source) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t cursor = 0;
  for (const TensorInfo& info : tensors) {
    if (info.begin != cursor || info.end < info.begin) {
      return InvalidTensor(
          source, info.name,
          Cat("data_offsets [", info.begin, ", ", info.end, ") do not follow the previous ",
              "tensor (expected begin ", cursor, "): hole, overlap or end < begin"));
    }
    cursor = info.end;
    uint64_t elements = 1;
    for (uint64_t dim : info.shape) {
      if (__builtin_mul_overflow(elements, dim, &elements)) {
        return InvalidTensor(source, info.name, "shape product overflows");
      }
    }
    uint64_t bits;
    if (__builtin_mul_overflow(elements, DTypeBits(info.dtype), &bits)) {
      return InvalidTensor(source, info.name, "byte size overflows");
    }
    if (bits % 8 != 0) {
      return InvalidTensor(source, info.name, "sub-byte tensor does not end on a byte boundary");
    }
    if (bits / 8 != info.end - info.begin) {
      return InvalidTensor(source, info.name,
                           Cat("holds ", info.end - info.begin, " bytes but ",
                               DTypeName(info.dtype), " with this shape needs ", bits / 8));
    }
  }
  if (cursor != buffer_size) {
    return Invalid(source, Cat("tensors cover ", cursor, " bytes of a ", buffer_size,
                               "-byte data buffer (trailing or missing bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t TensorInfo::num_elements() const {
  uint64_t n = 1;
  for (uint64_t dim : shape) n *= dim;
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> file,
                                                         std::string_view source) {
  if (file.size() < 8) return Invalid(source, "file is shorter than the 8-byte header length");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(file[i]);
  if (header_size > kMaxSafetensorsHeaderSize) {
    return Invalid(source, Cat("header length ", header_size, " exceeds the limit of ",
                               kMaxSafetensorsHeaderSize));
  }
  if (8 + header_size > file.size()) {
    return Invalid(source, Cat("header length ", header_size, " runs past the end of the ",
                               file.size(), "-byte file"));
  }
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  if (!simdjson::validate_utf8(text, header_size)) {
    return Invalid(source, "header is not valid UTF-8");
  }
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto error = parser.parse(text, header_size, /*realloc_if_needed=*/true).get(root);
      error != simdjson::SUCCESS) {
    return Invalid(source, Cat("header is not valid JSON: ", simdjson::error_message(error)));
  }
  simdjson::dom::object object;
  if (root.get_object().get(object) != simdjson::SUCCESS) {
    return Invalid(source, "header is not a JSON object");
  }
  SafetensorsHeader header;
  header.data_start = 8 + header_size;
  absl::flat_hash_set<absl::string_view> seen;
  bool have_metadata = false;
  for (auto field : object) {
    if (!seen.insert(ToAbsl(field.key)).second) {
      return Invalid(source, Cat("duplicate entry '", field.key, "' in header"));
    }
    if (field.key == "__metadata__") {
      have_metadata = true;
      if (field.value.is_null()) continue;
      simdjson::dom::object metadata;
      if (field.value.get_object().get(metadata) != simdjson::SUCCESS) {
        return Invalid(source, "__metadata__ is not a string-to-string object");
      }
      for (auto entry : metadata) {
        std::string_view value;
        if (entry.value.get_string().get(value) != simdjson::SUCCESS) {
          return Invalid(source, Cat("__metadata__ value for '", entry.key, "' is not a string"));
        }
        header.metadata.emplace_back(std::string(entry.key), std::string(value));
      }
      continue;
    }
    auto info = ParseTensorInfo(field.key, field.value, source);
    if (!info.ok()) return info.status();
    header.tensors.push_back(*std::move(info));
  }
  (void)have_metadata;
  if (auto status = ValidateExtents(header.tensors, file.size() - header.data_start, source);
      !status.ok()) {
    return status;
  }
  return header;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(Cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(Cat(path, ": cannot stat: ", std::strerror(err)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_size_ = static_cast<size_t>(st.st_size);
  if (file->map_size_ > 0) {
    void* map = ::mmap(nullptr, file->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return absl::InternalError(Cat(path, ": cannot mmap: ", std::strerror(err)));
    }
    file->map_ = static_cast<const std::byte*>(map);
  }
  ::close(fd);
  auto header = ParseSafetensorsHeader({file->map_, file->map_size_}, path);
  if (!header.ok()) return header.status();
  file->header_ = *std::move(header);
  for (size_t i = 0; i < file->header_.tensors.size(); ++i) {
    file->index_.emplace(file->header_.tensors[i].name, i);
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_size_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(ToAbsl(name));
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::StatusOr<TensorView> SafetensorsFile::Get(std::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(Cat(path_, ": no tensor '", name, "'"));
  }
  return TensorView{info, {map_ + header_.data_start + info->begin, info->num_bytes()}};
}

void SafetensorsFile::Release(const TensorView& view) const {
  if (view.data.empty()) return;
  // The mapping is private and read-only, so dropping a page never loses data: a later access
  // (a neighbour tensor's) faults it in again from the page cache. Round out to the kernel's
  // fault-around window (64 KiB by default, aligned in the address space), which maps the cached
  // pages around every faulting one: rounding in left those resident, and over the thousands of
  // small tensors of a GPT-2 XL checkpoint that added ~380 MiB to a reshard's peak RSS.
  constexpr uintptr_t kWindow = uintptr_t{64} << 10;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto map_begin = reinterpret_cast<uintptr_t>(map_);  // Page-aligned.
  const uintptr_t map_end = (map_begin + map_size_ + page - 1) / page * page;
  const auto begin = reinterpret_cast<uintptr_t>(view.data.data());
  const uintptr_t end = begin + view.data.size();
  const uintptr_t first = std::max(map_begin, begin / kWindow * kWindow);
  const uintptr_t last = std::min(map_end, (end + kWindow - 1) / kWindow * kWindow);
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace leantron::ckpt
