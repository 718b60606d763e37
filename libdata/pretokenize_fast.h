// Hand-written pre-tokenizers for the well-known patterns, each a state machine that splits
// valid UTF-8 exactly as its regex does (tests/libdata/pretokenize_fast_test.cc checks each
// against the general engine, regex_engine.h, on real text and random Unicode):
//
//   kGpt2     GPT-2: HF ByteLevel's  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
//   ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//             and tiktoken's r50k    '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++|
//             ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s
//   kLlama3   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ kQwen2    the same with \p{N} for \p{N}{1,3}
//   kCl100k   tiktoken's cl100k_base: as kLlama3, but trailing white space is one piece (\s++$)
//
// A pattern is recognized only by its exact text and dialect; anything else runs on PCRE2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "libdata/pretokenizer.h"
#include "libdata/regex_translate.h"
#include "libdata/unicode_class.h"

namespace leantron::data {

enum class FastPattern { kNone, kGpt2, kLlama3, kQwen2, kCl100k };

FastPattern RecognizeFastPattern(std::string_view pattern,
                                 RegexDialect dialect = RegexDialect::kOniguruma);

// The Llama 3 family (kLlama3, kQwen2, kCl100k).
class Llama3Pretokenizer {
 public:
  Llama3Pretokenizer(int max_digits, bool trailing_space_whole)
      : table_(CodePointClassTable()),
        max_digits_(max_digits),
        trailing_space_whole_(trailing_space_whole) {}

  // Length in bytes of the piece that starts at p (p < end, valid UTF-8).
  size_t PieceLength(const uint8_t* p, const uint8_t* end) const;

 private:
  CharClass ClassAt(const uint8_t* p, const uint8_t* end, int* len) const {
    if (*p < 0x80) {
      *len = 1;
      return table_[*p];
    }
    uint32_t cp;
    const int n = DecodeUtf8(p, end, &cp);
    if (n == 0) {
      *len = 1;
      return CharClass::kOther;
    }
    *len = n;
    return table_[cp];
  }
  const CharClass* table_;
  int max_digits_;
  bool trailing_space_whole_;
};

// One of the fast pre-tokenizers, chosen at run time.
class FastPreTokenizer {
 public:
  explicit FastPreTokenizer(FastPattern pattern)
      : pattern_(pattern),
        llama3_(pattern == FastPattern::kQwen2 ? 1 : 3, pattern == FastPattern::kCl100k) {}
  size_t PieceLength(const uint8_t* p, const uint8_t* end) const {
    return pattern_ == FastPattern::kGpt2 ? gpt2_.PieceLength(p, end) : llama3_.PieceLength(p, end);
  }

 private:
  FastPattern pattern_;
  Pretokenizer gpt2_;
  Llama3Pretokenizer llama3_;
};

}  // namespace leantron::data
