#include "libckpt/torch_dist_metadata.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "libckpt/pickle.h"
#include "libckpt/strings.h"
#include "libckpt/torch_archive.h"

namespace leantron::ckpt {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 40;
// Pairwise overlap checks beyond this many chunks per tensor are skipped (a torch_dist tensor has
// one chunk per layer and TP rank, a few thousand at most).
constexpr size_t kMaxOverlapCheck = 8192;

// An object built by NEWOBJ/REDUCE of a class named `name` (any module), or nullptr.
const PyValue* ObjectOf(const PyValue* v, std::string_view name) {
  if (v == nullptr || v->kind != PyKind::kCall || v->callable == nullptr ||
      v->callable->kind != PyKind::kGlobal || v->callable->name != name) {
    return nullptr;
  }
  return v;
}

bool IntTuple(const PyValue* v, std::vector<int64_t>* out) {
  if (v == nullptr || (v->kind != PyKind::kTuple && v->kind != PyKind::kList)) return false;
  out->clear();
  for (const PyValue* x : v->items) {
    if (x->kind != PyKind::kInt || x->integer < 0 || x->integer > kMaxDim) return false;
    out->push_back(x->integer);
  }
  return true;
}

struct Parser {
  const std::string& source;
  absl::Status Bad(std::string_view why) const {
    return absl::DataLossError(Cat(source, ": not a torch.distributed.checkpoint Metadata: ", why));
  }

  absl::StatusOr<DcpStorage> Storage(const PyValue* info, std::string_view fqn) const {
    const PyValue* dict = ObjectDict(ObjectOf(info, "_StorageInfo"));
    const PyValue* path = DictGet(dict, "relative_path");
    const PyValue* offset = DictGet(dict, "offset");
    const PyValue* length = DictGet(dict, "length");
    if (path == nullptr || path->kind != PyKind::kStr || offset == nullptr ||
        offset->kind != PyKind::kInt || length == nullptr || length->kind != PyKind::kInt ||
        offset->integer < 0 || length->integer < 0) {
      return Bad(Cat("storage of '", fqn, "' is ", PyRepr(info, 120)));
    }
    // Only files of this checkpoint directory: a path naming another directory is refused.
    const std::string& name = path->s;
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\\') != std::string::npos || name.find('\0') != std::string::npos) {
      return Bad(Cat("storage of '", fqn, "' names the path '", name,
                     "', which is not a file of the checkpoint directory"));
    }
    if (const PyValue* transforms = DictGet(dict, "transform_descriptors");
        transforms != nullptr && transforms->kind != PyKind::kNone &&
        !((transforms->kind == PyKind::kList || transforms->kind == PyKind::kTuple) &&
          transforms->items.empty())) {
      return absl::InvalidArgumentError(Cat(source, ": '", fqn, "' is stored through ",
                                            PyRepr(transforms, 80),
                                            " stream transforms, which are not supported"));
    }
    return DcpStorage{name, static_cast<uint64_t>(offset->integer),
                      static_cast<uint64_t>(length->integer)};
  }
};

bool Overlap(const DcpChunk& a, const DcpChunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.sizes[d] <= b.offsets[d] || b.offsets[d] + b.sizes[d] <= a.offsets[d]) {
      return false;
    }
  }
  return true;
}

bool Empty(const DcpChunk& c) {
  return std::find(c.sizes.begin(), c.sizes.end(), 0) != c.sizes.end();
}

}  // namespace

absl::StatusOr<DcpMetadata> ParseDcpMetadata(std::span<const std::byte> bytes,
                                             const std::string& source) {
  auto pickle = Pickle::Parse(bytes, source);
  if (!pickle.ok()) return pickle.status();
  Parser p{source};
  const PyValue* root = ObjectDict(ObjectOf((*pickle)->root(), "Metadata"));
  if (root == nullptr) return p.Bad(Cat("holds ", PyRepr((*pickle)->root(), 100)));
  const PyValue* entries = DictGet(root, "state_dict_metadata");
  const PyValue* storage = DictGet(root, "storage_data");
  if (entries == nullptr || entries->kind != PyKind::kDict || storage == nullptr ||
      storage->kind != PyKind::kDict) {
    return p.Bad("no state_dict_metadata / storage_data dicts");
  }
  DcpMetadata out;
  if (const PyValue* version = DictGet(root, "version"); version && version->kind == PyKind::kStr) {
    out.version = version->s;
  }
  // Storage first: (fqn, offsets) -> where.
  std::map<std::pair<std::string, std::vector<int64_t>>, DcpStorage> where;
  std::map<std::string, DcpStorage> bytes_where;
  for (size_t i = 0; i + 1 < storage->items.size(); i += 2) {
    const PyValue* index = ObjectDict(ObjectOf(storage->items[i], "MetadataIndex"));
    const PyValue* fqn = DictGet(index, "fqn");
    if (fqn == nullptr || fqn->kind != PyKind::kStr) {
      return p.Bad(Cat("storage key ", PyRepr(storage->items[i], 100)));
    }
    auto info = p.Storage(storage->items[i + 1], fqn->s);
    if (!info.ok()) return info.status();
    const PyValue* offset = DictGet(index, "offset");
    if (offset == nullptr || offset->kind == PyKind::kNone) {
      bytes_where[fqn->s] = *info;
      continue;
    }
    std::vector<int64_t> offsets;
    if (!IntTuple(offset, &offsets)) return p.Bad(Cat("offset of '", fqn->s, "'"));
    if (!where.emplace(std::make_pair(fqn->s, offsets), *info).second) {
      return p.Bad(Cat("'", fqn->s, "' has two storages at one offset"));
    }
  }
  for (size_t i = 0; i + 1 < entries->items.size(); i += 2) {
    const PyValue* key = entries->items[i];
    if (key->kind != PyKind::kStr) return p.Bad(Cat("key ", PyRepr(key, 60)));
    const std::string& fqn = key->s;
    const PyValue* value = entries->items[i + 1];
    if (ObjectOf(value, "BytesStorageMetadata") != nullptr) {
      auto it = bytes_where.find(fqn);
      if (it == bytes_where.end()) return p.Bad(Cat("bytes item '", fqn, "' has no storage"));
      out.bytes[fqn] = it->second;
      continue;
    }
    const PyValue* md = ObjectDict(ObjectOf(value, "TensorStorageMetadata"));
    if (md == nullptr) return p.Bad(Cat("'", fqn, "' is ", PyRepr(value, 100)));
    DcpTensorInfo tensor;
    if (!IntTuple(DictGet(md, "size"), &tensor.shape)) return p.Bad(Cat("size of '", fqn, "'"));
    const PyValue* properties = ObjectOf(DictGet(md, "properties"), "TensorProperties");
    const PyValue* dtype = nullptr;
    if (properties != nullptr && properties->state != nullptr) {
      if (properties->state->kind == PyKind::kTuple && !properties->state->items.empty()) {
        dtype = properties->state->items[0];
      } else {
        dtype = DictGet(ObjectDict(properties), "dtype");
      }
    }
    const std::optional<DType> d = DTypeOfTorchDtype(dtype);
    if (!d) return p.Bad(Cat("dtype of '", fqn, "' is ", PyRepr(dtype, 60)));
    tensor.dtype = *d;
    const PyValue* chunks = DictGet(md, "chunks");
    if (chunks == nullptr || chunks->kind != PyKind::kList)
      return p.Bad(Cat("chunks of '", fqn, "'"));
    for (const PyValue* c : chunks->items) {
      const PyValue* cd = ObjectDict(ObjectOf(c, "ChunkStorageMetadata"));
      DcpChunk chunk;
      if (!IntTuple(DictGet(cd, "offsets"), &chunk.offsets) ||
          !IntTuple(DictGet(cd, "sizes"), &chunk.sizes) ||
          chunk.offsets.size() != tensor.shape.size() ||
          chunk.sizes.size() != tensor.shape.size()) {
        return p.Bad(Cat("chunk ", PyRepr(c, 100), " of '", fqn, "'"));
      }
      for (size_t dim = 0; dim < tensor.shape.size(); ++dim) {
        if (chunk.offsets[dim] + chunk.sizes[dim] > tensor.shape[dim]) {
          return p.Bad(Cat("chunk at [", absl::StrJoin(chunk.offsets, ","), "] of size [",
                           absl::StrJoin(chunk.sizes, ","), "] lies outside '", fqn, "' [",
                           absl::StrJoin(tensor.shape, ","), "]"));
        }
      }
      auto it = where.find(std::make_pair(fqn, chunk.offsets));
      if (it == where.end()) {
        return p.Bad(Cat("chunk at [", absl::StrJoin(chunk.offsets, ","), "] of '", fqn,
                         "' has no storage"));
      }
      chunk.storage = it->second;
      tensor.chunks.push_back(std::move(chunk));
    }
    if (tensor.chunks.size() <= kMaxOverlapCheck) {
      for (size_t a = 0; a < tensor.chunks.size(); ++a) {
        for (size_t b = a + 1; b < tensor.chunks.size(); ++b) {
          if (!Empty(tensor.chunks[a]) && !Empty(tensor.chunks[b]) &&
              Overlap(tensor.chunks[a], tensor.chunks[b])) {
            return p.Bad(Cat("chunks of '", fqn, "' overlap"));
          }
        }
      }
    }
    out.tensors.emplace(fqn, std::move(tensor));
  }
  return out;
}

}  // namespace leantron::ckpt
