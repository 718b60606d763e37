// The BPE model of a HuggingFace tokenizer.json, with the `tokenizers` library's semantics
// (models/bpe/model.rs and word.rs):
//
// - A piece starts as its characters (bytes, when the pre-tokenizer is byte-level), each its vocab
//   id; a character not in the vocab becomes <0xXX> byte tokens (byte_fallback, when all exist),
//   else the unk token (consecutive ones fused with fuse_unk), else it is dropped.
// - Merges are pairs of ids ranked by their line in the merges list: the pair of lowest rank,
//   leftmost on ties, merges first; repeat until no adjacent pair is a merge. (tiktoken instead
//   ranks the concatenated bytes; the two differ when a token is reachable by several splits.)
// - ignore_merges: a piece that is a vocab token is that token without merging.
//
// Byte-level models work on raw bytes here: vocab strings are mapped back from GPT-2's printable
// byte alphabet at load, so pieces are never mapped to that alphabet and back.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "libdata/piece_cache.h"
#include "libdata/token_table.h"

namespace leantron::data {

struct HfBpeSettings {
  bool byte_level = false;  // the pre-tokenizer is ByteLevel: pieces are raw bytes
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::string unk_token;  // empty: none
};

class HfBpeModel {
 public:
  // `vocab` holds (token string as in tokenizer.json, id); `merges` the pairs in rank order.
  // Errors name the offending entry.
  static absl::StatusOr<std::unique_ptr<HfBpeModel>> Create(
      const std::vector<std::pair<std::string, int64_t>>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, HfBpeSettings settings);

  // Id of the token with exactly these model-space bytes, or -1.
  int32_t Find(const uint8_t* p, size_t n) const { return table_.Find(p, n); }
  // Id of the token spelled `s` in tokenizer.json, or -1 (HF's model.token_to_id).
  int32_t FindString(std::string_view s) const {
    const auto it = by_string_.find(absl::string_view(s.data(), s.size()));
    return it == by_string_.end() ? -1 : it->second;
  }
  // HF's model.get_vocab_size(): the number of vocab entries.
  size_t vocab_entries() const { return vocab_entries_; }
  // The token's string as tokenizer.json spells it, or nullptr for an id not in the vocab.
  const std::string* TokenString(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < strings_.size() && has_string_[id] ? &strings_[id]
                                                                                   : nullptr;
  }
  // Model-space bytes of a token (empty for a byte-level token outside the byte alphabet).
  std::string_view TokenBytes(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(strings_.size()) - 1; }
  const HfBpeSettings& settings() const { return settings_; }

  // HF's BPE.tokenize(piece) without its cache: appends the ids of piece [p, p+n), n >= 1.
  void MergeWord(const uint8_t* p, size_t n, std::vector<int32_t>* out) const;
  // Whether MergeWord of token id's own bytes gives [id], so a piece equal to a token can skip
  // merging. Computed on first use, thread-safe.
  bool SelfEncodes(int32_t id) const;
  // Byte-level models with all 256 bytes: whether pieces may be cut where no token holds the two
  // bytes on either side (no merge can cross there, and no unknown symbol can be fused across).
  bool CanCutPieces() const { return can_cut_; }
  bool PairInSomeToken(uint8_t a, uint8_t b) const {
    const uint32_t i = (uint32_t{a} << 8) | b;
    return (pair_in_token_[i >> 6] >> (i & 63)) & 1;
  }

 private:
  HfBpeModel() = default;
  // The initial symbols of the piece (characters, byte fallback, unk fusing).
  void InitialSymbols(const uint8_t* p, size_t n, std::vector<int32_t>* ids) const;
  void MergeScan(std::vector<int32_t>* ids) const;
  void MergeHeap(std::vector<int32_t>* ids) const;

  HfBpeSettings settings_;
  TokenTable table_;                                     // model-space bytes -> id
  PairTable merges_;                                     // (left id, right id) -> (rank, merged id)
  absl::flat_hash_map<std::string, int32_t> by_string_;  // tokenizer.json string -> id
  std::vector<std::string> strings_;                     // id -> tokenizer.json string
  std::vector<uint8_t> has_string_;
  std::vector<uint32_t> bytes_offset_;  // id -> model-space bytes in bytes_blob_
  std::string bytes_blob_;
  size_t vocab_entries_ = 0;
  int32_t unk_id_ = -1;
  int32_t byte_fallback_id_[256];  // id of "<0xXX>", or -1
  int32_t byte_symbol_id_[256];    // byte-level: id of the single byte, or -1
  mutable std::unique_ptr<std::atomic<uint8_t>[]> self_encodes_;  // 0 unknown, 1 yes, 2 no
  bool can_cut_ = false;
  uint64_t pair_in_token_[1024] = {};
};

// Per-thread encoding of pieces: whole-token fast path, a bounded cache of merged pieces, merging.
class HfBpeWorkspace {
 public:
  explicit HfBpeWorkspace(const HfBpeModel& model) : model_(model) {}
  void EncodePiece(const uint8_t* p, size_t n, std::vector<int32_t>* out);

 private:
  void EncodeSegment(const uint8_t* p, size_t n, std::vector<int32_t>* out);
  static constexpr size_t kMaxCachedPiece = 128;
  static constexpr size_t kMaxCacheEntries = 1 << 17;
  const HfBpeModel& model_;
  PieceCache cache_{kMaxCacheEntries};
};

// GPT-2's byte <-> printable character map, as HF's ByteLevel uses it: the code point standing
// for a byte, and the byte a code point stands for (-1 for none).
uint32_t ByteLevelChar(uint8_t b);
int ByteLevelByte(uint32_t cp);
// Maps a byte-level token string back to raw bytes; false when it holds a character outside the
// byte alphabet.
bool ByteLevelDecode(std::string_view s, std::string* bytes);

}  // namespace leantron::data
