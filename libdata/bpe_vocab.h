// The ranks of a byte-level BPE vocabulary: token bytes <-> id, with a lookup table tuned for
// the tokenizer's hot path (most pieces of real text are whole tokens of a few bytes).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace leantron::data {

class BpeVocab {
 public:
  BpeVocab() = default;

  // tiktoken rank file: one "base64(token bytes) rank" line per token.
  static absl::StatusOr<BpeVocab> FromTiktokenFile(const std::string& path);
  // The same from the file's contents; `name` labels errors.
  static absl::StatusOr<BpeVocab> FromTiktokenText(std::string_view text, const std::string& name);
  // Megatron / HF pair: encoder.json (byte-to-unicode token strings -> id) and vocab.bpe merges.
  // The ranks implied by the merges must equal encoder.json's ids.
  static absl::StatusOr<BpeVocab> FromMegatronFiles(const std::string& vocab_json,
                                                    const std::string& merges_txt);
  // The same from the files' contents; the names label errors.
  static absl::StatusOr<BpeVocab> FromMegatronText(std::string_view json_text,
                                                   const std::string& vocab_json,
                                                   std::string_view merges_text,
                                                   const std::string& merges_txt);
  // From tokens in rank order (token i has rank i). Checks uniqueness and the 256 single bytes.
  static absl::StatusOr<BpeVocab> FromTokens(std::vector<std::string> tokens);

  // The same vocabulary as the byte-exact files OpenAI published (encoder.json as Python's
  // json.dumps writes it, vocab.bpe with its "#version: 0.2" header).
  std::string ToEncoderJson() const;
  absl::StatusOr<std::string> ToMergesText() const;
  std::string ToTiktokenText() const;

  // Rank of the token with exactly these bytes, or -1.
  int32_t Rank(const uint8_t* p, size_t n) const;
  int32_t Rank(std::string_view s) const {
    return Rank(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }

  // Same as Rank, faster: the caller guarantees 8 readable bytes at p (beyond n is fine).
  int32_t RankPadded(const uint8_t* p, size_t n) const;

  int32_t num_ranks() const { return static_cast<int32_t>(token_offsets_.size()) - 1; }
  // The id after the last rank: <|endoftext|> (50256 for GPT-2).
  int32_t eod_id() const { return num_ranks(); }
  std::string_view TokenBytes(int32_t rank) const {
    return std::string_view(blob_.data() + token_offsets_[rank],
                            token_offsets_[rank + 1] - token_offsets_[rank]);
  }
  // Rank of each single byte value.
  int32_t ByteRank(uint8_t b) const { return byte_rank_[b]; }
  // Whether some token holds byte a immediately followed by byte b. When none does, no merge can
  // join the two: a piece can be cut there and its halves merged on their own.
  bool PairInSomeToken(uint8_t a, uint8_t b) const {
    const uint32_t i = (uint32_t{a} << 8) | b;
    return (pair_in_token_[i >> 6] >> (i & 63)) & 1;
  }

 private:
  struct Slot {
    uint64_t head;  // first 8 bytes of the token, zero-padded
    uint32_t len;
    int32_t rank;  // -1: empty
  };

  void BuildTable();
  static uint64_t Head(const uint8_t* p, size_t n) {
    uint64_t h = 0;
    std::memcpy(&h, p, n < 8 ? n : 8);
    return h;
  }
  static uint64_t Tail(const uint8_t* p, size_t n) {
    uint64_t t = 0;
    std::memcpy(&t, p + n - 8, 8);
    return t;
  }
  size_t SlotOf(uint64_t head, uint64_t tail, size_t n) const {
    uint64_t x = head ^ (tail * 0xC2B2AE3D27D4EB4Full) ^ (n * 0x165667B19E3779F9ull);
    x ^= x >> 32;
    x *= 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(x >> shift_);
  }

  std::string blob_;                     // all token bytes, in rank order
  std::vector<uint32_t> token_offsets_;  // num_ranks + 1 offsets into blob_
  std::vector<Slot> slots_;
  int shift_ = 64;
  // Ranks of all two-byte tokens (-1 for none), indexed by first << 8 | second: byte-pair merging
  // asks for pairs of single bytes more than anything else.
  std::vector<int32_t> two_byte_rank_;
  int32_t byte_rank_[256] = {};
  uint64_t pair_in_token_[1024] = {};
};

inline int32_t BpeVocab::Rank(const uint8_t* p, size_t n) const {
  if (n >= 8) return RankPadded(p, n);
  // Built with shifts: a byte-copy loop would become a call to memcpy.
  uint64_t head = 0;
  for (size_t i = 0; i < n; ++i) head |= uint64_t{p[i]} << (8 * i);
  uint8_t padded[8];
  std::memcpy(padded, &head, 8);
  return RankPadded(padded, n);
}

inline int32_t BpeVocab::RankPadded(const uint8_t* p, size_t n) const {
  if (n == 2 && !two_byte_rank_.empty()) return two_byte_rank_[(p[0] << 8) | p[1]];
  if (n == 0 || slots_.empty()) return -1;
  uint64_t head;
  std::memcpy(&head, p, 8);
  if (n < 8) head &= (uint64_t{1} << (8 * n)) - 1;
  const uint64_t tail = n > 8 ? Tail(p, n) : 0;
  const size_t mask = slots_.size() - 1;
  for (size_t i = SlotOf(head, tail, n);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.rank < 0) return -1;
    if (s.head == head && s.len == n &&
        (n <= 8 || std::memcmp(blob_.data() + token_offsets_[s.rank] + 8, p + 8, n - 8) == 0)) {
      return s.rank;
    }
  }
}

// Writes encoder.json, vocab.bpe and gpt2.tiktoken into `dir` (created if missing), each file
// atomically.
absl::Status ExportVocabFiles(const BpeVocab& vocab, const std::string& dir);

// GPT-2's printable stand-in for each byte in encoder.json and vocab.bpe strings.
uint32_t ByteToUnicode(uint8_t b);

}  // namespace leantron::data
