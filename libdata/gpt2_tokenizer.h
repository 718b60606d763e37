// GPT-2 byte-level BPE, exactly tiktoken's `gpt2` encoding.
//
// Gpt2Tokenizer is immutable and thread-safe once loaded. Encoding goes through a Gpt2Encoder,
// a per-thread workspace that caches the merges of recently seen pieces; make one per thread.
//
// Invalid UTF-8 (tiktoken only sees valid text): every byte that does not start a valid UTF-8
// scalar is pre-tokenized as U+FFFD would be (a symbol: it joins runs of punctuation), while the
// byte itself is kept, so Decode(Encode(bytes)) == bytes for every input.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libdata/bpe_vocab.h"
#include "libdata/piece_cache.h"

namespace leantron::data {

// Where the vocabulary comes from: Megatron's pair of files, or one tiktoken rank file.
struct VocabFiles {
  std::string vocab_file;     // encoder.json (Megatron's --vocab-file)
  std::string merge_file;     // vocab.bpe (Megatron's --merge-file)
  std::string tiktoken_file;  // gpt2.tiktoken / r50k_base.tiktoken
};

class Gpt2Tokenizer {
 public:
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  // Loads and cross-checks the vocabulary; errors name the file and line or token at fault.
  static absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Load(const VocabFiles& files);
  explicit Gpt2Tokenizer(BpeVocab vocab);

  // Convenience wrappers that use a fresh workspace; prefer a Gpt2Encoder in loops.
  std::vector<int32_t> EncodeOrdinary(std::string_view text) const;
  std::vector<int32_t> Encode(std::string_view text, bool allow_special) const;

  // Appends the bytes of `ids`. An id outside the vocabulary is an error naming its position.
  absl::Status Decode(absl::Span<const int32_t> ids, std::string* out) const;

  int32_t eod_id() const { return vocab_.eod_id(); }
  // Number of ids, <|endoftext|> included (50257 for GPT-2).
  int32_t vocab_size() const { return vocab_.eod_id() + 1; }
  const BpeVocab& vocab() const { return vocab_; }

 private:
  BpeVocab vocab_;
};

// Per-thread encoding workspace.
class Gpt2Encoder {
 public:
  // The piece cache remembers the merges of pieces that are not one token (words, rules like
  // "|-----|" in text tables). Memory: about max_cache_entries * (max_cached_piece + ids).
  struct Options {
    size_t max_cached_piece = 128;       // bytes; longer pieces are merged every time
    size_t max_cache_entries = 1 << 17;  // the cache is cleared when it reaches this
  };
  explicit Gpt2Encoder(const Gpt2Tokenizer& tokenizer) : Gpt2Encoder(tokenizer, Options()) {}
  Gpt2Encoder(const Gpt2Tokenizer& tokenizer, Options options);

  // Appends the ids of `text` as tiktoken's encode_ordinary would (special tokens are text).
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* out);
  // With allow_special, "<|endoftext|>" becomes eod_id() (tiktoken's encode(allowed_special=all));
  // without, it is encoded as ordinary text.
  void Encode(std::string_view text, bool allow_special, std::vector<int32_t>* out);

 private:
  // A piece that is not a single token: cached merges, else byte-pair merging.
  void EncodePiece(const uint8_t* p, size_t n, std::vector<int32_t>* out);
  // A segment no merge crosses out of: cached merges, else byte-pair merging.
  void EncodeSegment(const uint8_t* p, size_t n, std::vector<int32_t>* out);

  const Gpt2Tokenizer& tokenizer_;
  const BpeVocab& vocab_;
  const Options options_;
  // Piece bytes -> ids, for pieces that are not a single token. Bounded; cleared when full.
  PieceCache cache_;
  std::vector<int32_t> scratch_;
};

}  // namespace leantron::data
