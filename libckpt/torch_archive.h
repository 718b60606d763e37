// Reading what torch.save writes, without Python: the zip container (zip_archive.h), the pickle
// in <archive>/data.pkl (pickle.h), and the tensors it refers to, each a view into one storage
// record <archive>/data/<key> of the mapped file.
//
// A tensor in the pickle is torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)
// (possibly wrapped as an nn.Parameter), its storage the persistent id
// ('storage', torch.<Type>Storage, key, location, numel). Resolving one checks the storage record
// exists with exactly numel elements of the storage's dtype, the tensor lies inside it, and it is
// contiguous; anything else is an error naming the archive and the tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "libckpt/dtype.h"
#include "libckpt/mapped_file.h"
#include "libckpt/pickle.h"
#include "libckpt/strings.h"
#include "libckpt/zip_archive.h"

namespace leantron::ckpt {

struct TorchTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // The tensor's bytes, row-major.
  std::string storage_key;
  uint64_t storage_byte_offset = 0;  // Where `data` starts in its storage.
};

// dtype of a torch storage class (torch.FloatStorage, torch.BFloat16Storage, ...); UntypedStorage
// is bytes.
std::optional<DType> DTypeOfTorchStorage(std::string_view class_name);
// torch.float32, torch.bfloat16, ... as the pickle names them (global "torch" + name).
std::optional<DType> DTypeOfTorchDtype(const PyValue* value);
// The torch storage class and dtype attribute names for a dtype ("BFloat16Storage", "bfloat16").
std::string_view TorchStorageClass(DType dtype);
std::string_view TorchDtypeName(DType dtype);

class TorchArchive {
 public:
  // A torch.save file, mapped.
  static absl::StatusOr<std::unique_ptr<TorchArchive>> Open(const std::string& path);
  // A torch.save archive occupying [offset, offset + length) of `file`.
  static absl::StatusOr<std::unique_ptr<TorchArchive>> OpenSlice(
      std::shared_ptr<const MappedFile> file, uint64_t offset, uint64_t length);
  // An archive in memory (`bytes` must outlive it); for tests and the fuzzer.
  static absl::StatusOr<std::unique_ptr<TorchArchive>> Parse(std::span<const std::byte> bytes,
                                                             std::string source);

  const std::string& source() const { return source_; }
  // The unpickled data.pkl; null after DropPickle.
  const PyValue* root() const { return pickle_ ? pickle_->root() : nullptr; }
  // Frees the unpickled data.pkl (tens of bytes per tensor in the archive, many times data.pkl's
  // size): for a reader that has taken what it needs from it.
  void DropPickle() { pickle_.reset(); }
  const ZipArchive& zip() const { return *zip_; }

  // Whether `value` is a tensor as torch.save pickles one.
  static bool IsTensor(const PyValue* value);
  // Resolves a tensor; `what` names it in errors (a parameter name, "optimizer exp_avg 3").
  absl::StatusOr<TorchTensor> Tensor(const PyValue* value, std::string_view what) const;
  // Drops the pages of consumed data from the resident set (MappedFile::Release).
  void Release(std::span<const std::byte> data) const {
    if (file_) file_->Release(data);
  }
  void ReleaseBehind(std::span<const std::byte> data) const {
    if (file_) file_->ReleaseBehind(data);
  }
  // Drops every page of the archive that was read through the mapping (the pickle, small records
  // such as Adam's `step` tensors): for a reader done with the parsed metadata.
  void ReleaseAll() const { Release(bytes_); }
  // Compares every record with its CRC-32 (storages=false: all but the data/ storage records):
  // one read of those bytes, their pages dropped from the resident set as the check passes them.
  absl::Status VerifyCrcs(bool storages = true) const;
  // Compares storage record data/<key> with its CRC-32 the first time it is asked for (the readers
  // call it before copying a tensor out of a record they do not check as they stream it, so such
  // a record is read twice while it is in the page cache rather than the whole archive once more
  // up front), its pages dropped from the resident set as the check passes them.
  absl::Status VerifyStorage(std::string_view key) const;

  // For a reader that checks a storage record as it copies it out front to back (one read of the
  // bytes instead of VerifyStorage's extra one): the record's bytes (a view of the archive) and
  // CRC-32 as the zip stores it, and, once the reader has the CRC of all of them, the check,
  // which VerifyStorage then skips. Errors name the archive and the record.
  absl::StatusOr<std::pair<std::span<const std::byte>, uint32_t>> StorageRecord(
      std::string_view key) const;
  bool StorageVerified(std::string_view key) const { return verified_.contains(ToAbsl(key)); }
  absl::Status CheckStorageCrc(std::string_view key, uint32_t crc) const;

 private:
  TorchArchive() = default;
  absl::Status Init();
  std::shared_ptr<const MappedFile> file_;
  std::span<const std::byte> bytes_;
  std::string source_;
  std::unique_ptr<ZipArchive> zip_;
  std::string prefix_;  // "<archive name>/"
  std::unique_ptr<Pickle> pickle_;
  mutable absl::flat_hash_set<std::string> verified_;  // storage keys VerifyStorage has checked
};

}  // namespace leantron::ckpt
