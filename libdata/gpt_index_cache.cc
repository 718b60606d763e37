#include "libdata/gpt_index_cache.h"

#include <cstring>

#include "libdata/gpt_dataset.h"
#include "xxhash.h"

namespace leantron::data {
namespace {

// Version 2 stores a checksum of the arrays (version 1 files are a miss, rebuilt).
constexpr char kMagic[8] = {'L', 'T', 'G', 'P', 'T', 'I', 'X', '2'};
constexpr uint64_t kHeaderWords = 6;  // epochs, separate, n_doc, n_sample, n_shuffle, xxh3

uint64_t Pad8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

}  // namespace

uint64_t StableHash64(absl::string_view bytes) {
  uint64_t h = 14695981039346656037ULL;
  for (const char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

std::optional<MappedGptIndices> LoadGptIndexCache(const std::string& path, const std::string& key) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  if (!file.ok()) return std::nullopt;
  const uint8_t* p = file->data();
  const uint64_t size = file->size();
  uint64_t key_len;
  if (size < 16 || std::memcmp(p, kMagic, 8) != 0) return std::nullopt;
  std::memcpy(&key_len, p + 8, 8);
  if (key_len != key.size() || size < 16 + Pad8(key_len) + 8 * kHeaderWords) return std::nullopt;
  if (std::memcmp(p + 16, key.data(), key.size()) != 0) return std::nullopt;
  uint64_t header[kHeaderWords];
  const uint64_t h = 16 + Pad8(key_len);
  std::memcpy(header, p + h, sizeof(header));
  const uint64_t n_doc = header[2], n_sample = header[3], n_shuffle = header[4];
  if (n_doc > size || n_sample > size || n_shuffle > size) return std::nullopt;
  const uint64_t doc_at = h + 8 * kHeaderWords;
  const uint64_t sample_at = doc_at + Pad8(4 * n_doc);
  const uint64_t shuffle_at = sample_at + 8 * n_sample;
  if (shuffle_at + 8 * n_shuffle != size) return std::nullopt;
  // A damaged file (valid key, changed arrays) is a miss: rebuilt, never used.
  if (XXH3_64bits(p + doc_at, size - doc_at) != header[5]) return std::nullopt;
  MappedGptIndices out;
  out.num_epochs = static_cast<int64_t>(header[0]);
  out.separate_final_epoch = header[1] != 0;
  // mmap returns page-aligned memory and every array offset is a multiple of 8.
  out.document_index = absl::MakeConstSpan(reinterpret_cast<const int32_t*>(p + doc_at), n_doc);
  out.sample_index = absl::MakeConstSpan(reinterpret_cast<const int64_t*>(p + sample_at), n_sample);
  out.shuffle_index =
      absl::MakeConstSpan(reinterpret_cast<const int64_t*>(p + shuffle_at), n_shuffle);
  out.file = *std::move(file);
  return out;
}

absl::Status SaveGptIndexCache(const std::string& path, const std::string& key,
                               const GptIndices& indices) {
  absl::StatusOr<fs::AtomicFileWriter> writer = fs::AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  const uint64_t zeros = 0;
  const uint64_t key_len = key.size();
  const uint64_t doc_bytes = 4 * indices.document_index.size();
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return absl::ResourceExhaustedError("cannot allocate a hash state");
  const uint64_t zeros_for_hash = 0;
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, indices.document_index.data(), doc_bytes);
  XXH3_64bits_update(state, &zeros_for_hash, Pad8(doc_bytes) - doc_bytes);
  XXH3_64bits_update(state, indices.sample_index.data(), 8 * indices.sample_index.size());
  XXH3_64bits_update(state, indices.shuffle_index.data(), 8 * indices.shuffle_index.size());
  const uint64_t checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  const uint64_t header[kHeaderWords] = {static_cast<uint64_t>(indices.num_epochs),
                                         indices.separate_final_epoch ? 1u : 0u,
                                         indices.document_index.size(),
                                         indices.sample_index.size(),
                                         indices.shuffle_index.size(),
                                         checksum};
  absl::Status s = writer->Write(kMagic, 8);
  if (s.ok()) s = writer->Write(&key_len, 8);
  if (s.ok()) s = writer->Write(key);
  if (s.ok()) s = writer->Write(&zeros, Pad8(key_len) - key_len);
  if (s.ok()) s = writer->Write(header, sizeof(header));
  if (s.ok()) s = writer->Write(indices.document_index.data(), 4 * indices.document_index.size());
  if (s.ok()) s = writer->Write(&zeros, Pad8(doc_bytes) - doc_bytes);
  if (s.ok()) s = writer->Write(indices.sample_index.data(), 8 * indices.sample_index.size());
  if (s.ok()) s = writer->Write(indices.shuffle_index.data(), 8 * indices.shuffle_index.size());
  if (s.ok()) s = writer->Commit();
  return s;
}

}  // namespace leantron::data
