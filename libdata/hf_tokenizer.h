// HuggingFace tokenizer.json with a BPE model, with the ids of the `tokenizers` library
// (tokenizer/mod.rs's encode: added tokens, normalizer, pre-tokenizer, model, post-processor).
//
// Implemented (anything else is refused at load, naming it):
//   normalizer     null, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence of those
//   pre_tokenizer  null, ByteLevel (last), Split (String or Regex pattern, every behavior,
//                  invert), Digits, Metaspace, Sequence of those
//   model          BPE: byte_fallback, unk_token, fuse_unk, ignore_merges (no dropout, no
//                  continuing_subword_prefix / end_of_word_suffix)
//   post_processor null, ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing,
//                  Sequence (single sequences)
//   decoder        null, ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence
//   added_tokens   special or not, normalized or not, lstrip, rstrip, single_word
//
// Text that is not valid UTF-8 (HF only ever sees valid text) is encoded run by run: each valid
// run as a text of its own, each invalid byte as its byte token (byte-level models), its <0xXX>
// token (byte fallback) or the unk token, so decoding gives the bytes back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "libdata/added_tokens.h"
#include "libdata/hf_bpe_model.h"
#include "libdata/pretokenize_fast.h"
#include "libdata/regex_engine.h"
#include "libdata/tokenizer.h"
#include "libdata/unicode_normalize.h"

namespace leantron::data {

struct HfNormalizer {
  enum class Kind { kUnicode, kPrepend, kReplace, kStrip };
  Kind kind = Kind::kUnicode;
  UnicodeForm form = UnicodeForm::kNFC;
  std::string content;           // Prepend's text, Replace's replacement
  std::shared_ptr<Regex> regex;  // Replace's pattern
  bool strip_left = false, strip_right = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct HfPreTokenizer {
  enum class Kind { kSplit, kByteLevel, kDigits, kMetaspace };
  Kind kind = Kind::kSplit;
  // Split; ByteLevel with use_regex (GPT-2's pattern).
  std::shared_ptr<Regex> regex;
  FastPattern fast = FastPattern::kNone;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // ByteLevel.
  bool add_prefix_space = false;
  // Digits.
  bool individual_digits = false;
  // Metaspace.
  std::string replacement;  // one character
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
};

struct HfDecoder {
  enum class Kind { kByteLevel, kByteFallback, kFuse, kStrip, kReplace, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string content;           // Strip's character, Replace's replacement, Metaspace's char
  std::shared_ptr<Regex> regex;  // Replace's pattern
  size_t start = 0, stop = 0;    // Strip
  bool metaspace_prepends = true;
};

struct HfAddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Everything tokenizer.json (and tokenizer_config.json) say, as parsed.
struct HfTokenizerSpec {
  std::unique_ptr<HfBpeModel> model;
  std::vector<HfNormalizer> normalizers;
  std::vector<HfPreTokenizer> pre_tokenizers;  // a ByteLevel can only be last
  bool has_decoder = false;
  std::vector<HfDecoder> decoders;
  std::vector<int32_t> prefix, suffix;  // post-processor, single sequence
  std::vector<HfAddedToken> added;
  std::optional<std::string> eos_token, bos_token;  // tokenizer_config.json
  std::string source;                               // path, for messages
};

// Parses tokenizer.json text; `config_json` is tokenizer_config.json's text or empty.
absl::StatusOr<HfTokenizerSpec> ParseHfTokenizerJson(std::string_view json, std::string_view name,
                                                     std::string_view config_json);

// `path` is tokenizer.json or a folder holding it (and tokenizer_config.json, read for the EOS
// and BOS tokens Megatron's HuggingFaceTokenizer takes from it).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path);
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeHfTokenizer(HfTokenizerSpec spec);

}  // namespace leantron::data
