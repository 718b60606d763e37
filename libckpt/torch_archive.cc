#include "libckpt/torch_archive.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {
namespace {

struct TorchDtypeEntry {
  DType dtype;
  std::string_view storage;  // torch.<storage> class
  std::string_view name;     // torch.<name> dtype
};

constexpr TorchDtypeEntry kTorchDtypes[] = {
    {DType::kF32, "FloatStorage", "float32"},
    {DType::kF64, "DoubleStorage", "float64"},
    {DType::kF16, "HalfStorage", "float16"},
    {DType::kBF16, "BFloat16Storage", "bfloat16"},
    {DType::kI64, "LongStorage", "int64"},
    {DType::kI32, "IntStorage", "int32"},
    {DType::kI16, "ShortStorage", "int16"},
    {DType::kI8, "CharStorage", "int8"},
    {DType::kU8, "ByteStorage", "uint8"},
    {DType::kBool, "BoolStorage", "bool"},
    {DType::kU16, "UInt16Storage", "uint16"},
    {DType::kU32, "UInt32Storage", "uint32"},
    {DType::kU64, "UInt64Storage", "uint64"},
    {DType::kC64, "ComplexFloatStorage", "complex64"},
    {DType::kF8E4M3, "Float8_e4m3fnStorage", "float8_e4m3fn"},
    {DType::kF8E5M2, "Float8_e5m2Storage", "float8_e5m2"},
};

// Aliases the pickle may use for the same dtypes.
constexpr std::pair<std::string_view, DType> kDtypeAliases[] = {
    {"float", DType::kF32}, {"double", DType::kF64}, {"half", DType::kF16},
    {"long", DType::kI64},  {"int", DType::kI32},    {"short", DType::kI16},
};

constexpr int64_t kMaxElements = int64_t{1} << 50;

// The call that rebuilds a tensor, seen through nn.Parameter and tensor-subclass wrappers:
// (function, args) of torch._utils._rebuild_tensor_v2 / _rebuild_tensor.
std::pair<const PyValue*, const PyValue*> RebuildCall(const PyValue* v) {
  for (int depth = 0; v != nullptr && depth < 4; ++depth) {
    if (v->kind != PyKind::kCall || v->callable == nullptr || v->args == nullptr) break;
    const std::vector<PyValue*>& a = v->args->items;
    if (v->IsCallOf("torch._utils", "_rebuild_tensor_v2") ||
        v->IsCallOf("torch._utils", "_rebuild_tensor")) {
      return {v->callable, v->args};
    }
    if ((v->IsCallOf("torch._utils", "_rebuild_parameter") ||
         v->IsCallOf("torch._utils", "_rebuild_parameter_with_state")) &&
        !a.empty()) {
      v = a[0];
      continue;
    }
    if (v->IsCallOf("torch._tensor", "_rebuild_from_type_v2") && a.size() >= 3 &&
        a[0]->kind == PyKind::kGlobal && a[2]->kind == PyKind::kTuple &&
        (a[0]->IsGlobal("torch._utils", "_rebuild_tensor_v2") ||
         a[0]->IsGlobal("torch._utils", "_rebuild_tensor"))) {
      return {a[0], a[2]};
    }
    break;
  }
  return {nullptr, nullptr};
}

bool AllInts(const PyValue* v) {
  if (v == nullptr || v->kind != PyKind::kTuple) return false;
  for (const PyValue* x : v->items) {
    if (x->kind != PyKind::kInt) return false;
  }
  return true;
}

}  // namespace

std::optional<DType> DTypeOfTorchStorage(std::string_view class_name) {
  if (class_name == "UntypedStorage") return DType::kU8;
  for (const auto& e : kTorchDtypes) {
    if (e.storage == class_name) return e.dtype;
  }
  return std::nullopt;
}

std::optional<DType> DTypeOfTorchDtype(const PyValue* value) {
  if (value == nullptr || value->kind != PyKind::kGlobal || value->s != "torch") {
    return std::nullopt;
  }
  for (const auto& e : kTorchDtypes) {
    if (e.name == value->name) return e.dtype;
  }
  for (const auto& [alias, dtype] : kDtypeAliases) {
    if (alias == value->name) return dtype;
  }
  return std::nullopt;
}

std::string_view TorchStorageClass(DType dtype) {
  for (const auto& e : kTorchDtypes) {
    if (e.dtype == dtype) return e.storage;
  }
  return "UntypedStorage";
}

std::string_view TorchDtypeName(DType dtype) {
  for (const auto& e : kTorchDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "uint8";
}

absl::StatusOr<std::unique_ptr<TorchArchive>> TorchArchive::Open(const std::string& path) {
  auto file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  std::unique_ptr<TorchArchive> archive(new TorchArchive());
  archive->bytes_ = (*file)->bytes();
  archive->file_ = *std::move(file);
  archive->source_ = path;
  if (auto s = archive->Init(); !s.ok()) return s;
  return archive;
}

absl::StatusOr<std::unique_ptr<TorchArchive>> TorchArchive::OpenSlice(
    std::shared_ptr<const MappedFile> file, uint64_t offset, uint64_t length) {
  const uint64_t size = file->bytes().size();
  if (offset > size || length > size - offset) {
    return absl::DataLossError(Cat(file->path(), ": an archive at [", offset, ", +", length,
                                   ") runs past the file's ", size, " bytes"));
  }
  std::unique_ptr<TorchArchive> archive(new TorchArchive());
  archive->bytes_ = file->bytes().subspan(offset, length);
  archive->source_ = Cat(file->path(), "@", offset);
  archive->file_ = std::move(file);
  if (auto s = archive->Init(); !s.ok()) return s;
  return archive;
}

absl::StatusOr<std::unique_ptr<TorchArchive>> TorchArchive::Parse(std::span<const std::byte> bytes,
                                                                  std::string source) {
  std::unique_ptr<TorchArchive> archive(new TorchArchive());
  archive->bytes_ = bytes;
  archive->source_ = std::move(source);
  if (auto s = archive->Init(); !s.ok()) return s;
  return archive;
}

absl::Status TorchArchive::Init() {
  auto zip = ZipArchive::Parse(bytes_, source_,
                               [this](std::span<const std::byte> header) { Release(header); });
  if (!zip.ok()) return zip.status();
  zip_ = std::make_unique<ZipArchive>(*std::move(zip));
  if (zip_->entries().empty()) return absl::DataLossError(Cat(source_, ": empty archive"));
  // As torch does: every record lives under the folder the first one names.
  const std::string& first = zip_->entries().front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0) {
    return absl::DataLossError(
        Cat(source_, ": not a torch.save archive (entry '", first, "' is not in a folder)"));
  }
  prefix_ = first.substr(0, slash + 1);
  for (const ZipEntry& entry : zip_->entries()) {
    if (entry.name.compare(0, prefix_.size(), prefix_) != 0) {
      return absl::DataLossError(
          Cat(source_, ": entry '", entry.name, "' is outside the archive folder ", prefix_));
    }
  }
  const ZipEntry* pkl = zip_->Find(prefix_ + "data.pkl");
  if (pkl == nullptr) {
    return absl::DataLossError(Cat(source_, ": not a torch.save archive (no ", prefix_,
                                   "data.pkl; TorchScript and legacy tar files are not read)"));
  }
  if (const ZipEntry* order = zip_->Find(prefix_ + "byteorder")) {
    const std::span<const std::byte> text = zip_->Data(*order);
    if (std::string_view(reinterpret_cast<const char*>(text.data()), text.size()) != "little") {
      return absl::DataLossError(Cat(source_, ": tensors were saved big-endian"));
    }
  }
  if (auto s = zip_->VerifyCrc(*pkl); !s.ok()) return s;
  auto pickle = Pickle::Parse(zip_->Data(*pkl), Cat(source_, ": data.pkl"));
  if (!pickle.ok()) return pickle.status();
  pickle_ = *std::move(pickle);
  // The pickle holds copies of what it needs; the central directory and data.pkl go.
  ReleaseAll();
  return absl::OkStatus();
}

bool TorchArchive::IsTensor(const PyValue* value) { return RebuildCall(value).first != nullptr; }

absl::StatusOr<TorchTensor> TorchArchive::Tensor(const PyValue* value,
                                                 std::string_view what) const {
  auto bad = [&](std::string_view why) {
    return absl::DataLossError(Cat(source_, ": tensor '", what, "': ", why));
  };
  const auto [function, args] = RebuildCall(value);
  if (function == nullptr) {
    return bad(Cat("is not a tensor but ", PyRepr(value, 120)));
  }
  const std::vector<PyValue*>& a = args->items;
  if (a.size() < 4 || a[0]->kind != PyKind::kPersistent || a[1]->kind != PyKind::kInt ||
      !AllInts(a[2]) || !AllInts(a[3])) {
    return bad(Cat("malformed rebuild arguments ", PyRepr(args, 160)));
  }
  const PyValue* id = a[0]->args;
  if (id == nullptr || id->kind != PyKind::kTuple || id->items.size() != 5 ||
      !id->items[0]->IsStr("storage") || id->items[1]->kind != PyKind::kGlobal ||
      id->items[2]->kind != PyKind::kStr || id->items[4]->kind != PyKind::kInt) {
    return bad(Cat("unknown storage reference ", PyRepr(id, 160)));
  }
  const PyValue* type = id->items[1];
  const std::optional<DType> dtype = DTypeOfTorchStorage(type->name);
  if (type->s != "torch" || !dtype) {
    return bad(Cat("storage type ", type->s, ".", type->name, " is not supported"));
  }
  const std::string& key = id->items[2]->s;
  const int64_t numel = id->items[4]->integer;
  const ZipEntry* record = zip_->Find(Cat(prefix_, "data/", key));
  if (record == nullptr) return bad(Cat("storage record data/", key, " is missing"));
  const size_t element = DTypeSize(*dtype);
  if (numel < 0 || numel > kMaxElements || record->size != static_cast<uint64_t>(numel) * element) {
    return bad(Cat("storage data/", key, " holds ", record->size, " bytes, not ", numel,
                   " elements of ", DTypeName(*dtype)));
  }
  TorchTensor out;
  out.dtype = *dtype;
  out.storage_key = key;
  int64_t count = 1, expected_stride = 1;
  const std::vector<PyValue*>& size = a[2]->items;
  const std::vector<PyValue*>& stride = a[3]->items;
  if (size.size() != stride.size()) return bad("size and stride differ in length");
  bool empty = false;
  for (const PyValue* d : size) {
    if (d->integer < 0 || d->integer > kMaxElements) return bad(Cat("bad dimension ", d->integer));
    out.shape.push_back(d->integer);
    if (d->integer == 0) {
      empty = true;
    } else if (count > kMaxElements / d->integer) {
      return bad("too many elements");
    } else {
      count *= d->integer;
    }
  }
  if (empty) count = 0;
  for (size_t i = size.size(); i-- > 0;) {
    if (out.shape[i] != 1 && count > 0 && stride[i]->integer != expected_stride) {
      return bad(Cat("is not contiguous (size [", absl::StrJoin(out.shape, ","), "], stride ",
                     PyRepr(a[3], 80), "); only contiguous tensors are read"));
    }
    expected_stride *= out.shape[i] == 0 ? 1 : out.shape[i];
  }
  const int64_t offset = a[1]->integer;
  if (offset < 0 || offset > numel || count > numel - offset) {
    return bad(Cat(count, " elements at offset ", offset, " run past its storage of ", numel));
  }
  out.storage_byte_offset = static_cast<uint64_t>(offset) * element;
  out.data =
      zip_->Data(*record).subspan(out.storage_byte_offset, static_cast<size_t>(count) * element);
  return out;
}

absl::Status TorchArchive::VerifyCrcs(bool storages) const {
  const std::string data_prefix = Cat(prefix_, "data/");
  for (const ZipEntry& entry : zip_->entries()) {
    if (!storages && absl::StartsWith(entry.name, data_prefix)) continue;
    if (auto s = zip_->VerifyCrc(entry, [this](std::span<const std::byte> done) { Release(done); });
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::span<const std::byte>, uint32_t>> TorchArchive::StorageRecord(
    std::string_view key) const {
  const ZipEntry* record = zip_->Find(Cat(prefix_, "data/", key));
  if (record == nullptr) {
    return absl::DataLossError(Cat(source_, ": no storage record 'data/", key, "'"));
  }
  return std::make_pair(zip_->Data(*record), record->crc32);
}

absl::Status TorchArchive::CheckStorageCrc(std::string_view key, uint32_t crc) const {
  auto record = StorageRecord(key);
  if (!record.ok()) return record.status();
  if (crc != record->second) {
    return absl::DataLossError(Cat(source_, ": entry '", prefix_, "data/", key,
                                   "' does not match its CRC-32 (corrupted)"));
  }
  verified_.insert(std::string(key));
  return absl::OkStatus();
}

absl::Status TorchArchive::VerifyStorage(std::string_view key) const {
  if (verified_.contains(ToAbsl(key))) return absl::OkStatus();
  const ZipEntry* record = zip_->Find(Cat(prefix_, "data/", key));
  if (record == nullptr) {
    return absl::DataLossError(Cat(source_, ": no storage record 'data/", key, "'"));
  }
  if (auto s = zip_->VerifyCrc(*record, [this](std::span<const std::byte> done) { Release(done); });
      !s.ok()) {
    return s;
  }
  verified_.insert(std::string(key));
  return absl::OkStatus();
}

}  // namespace leantron::ckpt
