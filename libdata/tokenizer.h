// The one interface every tokenizer family plugs into; `tokenize`, `preprocess_data` and `train`
// use only this. Families (Megatron's --tokenizer-type):
//
//   GPT2BPETokenizer        GPT-2's byte-level BPE (encoder.json + vocab.bpe, or gpt2.tiktoken)
//   HuggingFaceTokenizer    a tokenizer.json with a BPE model (Llama 3, Qwen2/3, GPT-NeoX, ...)
//   TikTokenizer            tiktoken ranks: Megatron's JSON list, or a .tiktoken file with a
//                           named pattern (gpt2, cl100k_base, o200k_base, llama3)
//   SentencePieceTokenizer, Llama2Tokenizer, GPTSentencePieceTokenizer
//                           a SentencePiece tokenizer.model (BPE, byte fallback)
//   NullTokenizer           "1 2 3" -> [1, 2, 3]
//
// A Tokenizer is immutable and shared by threads; each thread encodes through its own
// TextEncoder (caches, regex state). Files that are malformed or use a feature not implemented
// here are refused at load with an error naming it: never different ids from the reference.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace leantron::data {

// How text becomes ids beyond the model itself. Defaults are per family: what Megatron's
// tokenizer.tokenize(text) does (Tokenizer::megatron_defaults()).
struct EncodeOptions {
  // Special tokens written in the text ("<|endoftext|>", "<|begin_of_text|>", ...) become their
  // ids; otherwise they are encoded as ordinary text.
  bool allow_special = false;
  // Add the tokens the tokenizer puts around every text (a tokenizer.json post-processor's BOS).
  bool add_special = false;
};

// Per-thread encoding workspace.
class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  // Appends the ids of `text` (any bytes; see each family for invalid UTF-8).
  virtual absl::Status Encode(std::string_view text, std::vector<int32_t>* out) = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::unique_ptr<TextEncoder> NewEncoder(const EncodeOptions& options) const = 0;
  // Appends the text that `ids` stand for. An id outside the vocabulary is an error naming its
  // position.
  virtual absl::Status Decode(absl::Span<const int32_t> ids, std::string* out) const = 0;

  // Megatron's tokenizer.vocab_size: what the model's embedding must hold (before padding).
  virtual int64_t vocab_size() const = 0;
  // Megatron's tokenizer.eod (appended by --append-eod), when the tokenizer has one.
  virtual std::optional<int32_t> eod_id() const = 0;
  // What Megatron's tokenize(text) does for this family.
  virtual EncodeOptions megatron_defaults() const = 0;
  // One line for logs: family, file, vocabulary size, EOD.
  virtual std::string Describe() const = 0;

  // The ids add_special puts before and after every text (a tokenizer.json post-processor's).
  virtual void SpecialTokensAround(std::vector<int32_t>* prefix,
                                   std::vector<int32_t>* suffix) const {}
  // True when a space that follows an ASCII byte other than white space always starts a piece,
  // so text cut there encodes (without add_special) to the same ids part by part: what lets
  // `tokenize` stream and parallelize one long text (pretokenizer.h's IsSafeSplit).
  virtual bool SplitsAtSpaces() const { return false; }
  // True when decoding ids part by part and concatenating gives the same text.
  virtual bool DecodesPartByPart() const { return false; }

  // Convenience: encode with a fresh encoder (prefer one encoder per thread in loops).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              const EncodeOptions& options) const;
};

// Megatron's tokenizer flags.
struct TokenizerOptions {
  std::string type = "GPT2BPETokenizer";  // --tokenizer-type
  std::string model;                      // --tokenizer-model: file, or folder with tokenizer.json
  std::string vocab_file, merge_file;     // --vocab-file, --merge-file (GPT2BPETokenizer)
  std::string tiktoken_file;              // --tiktoken-file (GPT2BPETokenizer, Leantron's)
  std::string tiktoken_pattern;           // --tiktoken-pattern
  int64_t vocab_size = 0;                 // --vocab-size (NullTokenizer, TikTokenizer)
  int64_t tiktoken_num_special_tokens = 1000;  // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;     // --tokenizer-special-tokens (TikTokenizer)
};

// The family names --tokenizer-type accepts.
const std::vector<std::string>& TokenizerTypes();

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const TokenizerOptions& options);

}  // namespace leantron::data
