#include "libdata/pretokenize_fast.h"

namespace leantron::data {
namespace {

constexpr std::string_view kGpt2Hf =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Tiktoken =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kCl100k =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";

uint8_t Lower(uint8_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

}  // namespace

FastPattern RecognizeFastPattern(std::string_view pattern, RegexDialect dialect) {
  // Patterns without `$` or `{n,m}+` mean the same in both dialects.
  if (pattern == kGpt2Hf) return FastPattern::kGpt2;
  if (pattern == kLlama3) return FastPattern::kLlama3;
  if (pattern == kQwen2) return FastPattern::kQwen2;
  if (dialect == RegexDialect::kRust) {
    if (pattern == kGpt2Tiktoken) return FastPattern::kGpt2;
    if (pattern == kCl100k) return FastPattern::kCl100k;
  }
  return FastPattern::kNone;
}

size_t Llama3Pretokenizer::PieceLength(const uint8_t* p, const uint8_t* end) const {
  const uint8_t b = p[0];
  // (?i:'s|'t|'re|'ve|'m|'ll|'d): case-insensitive, so 's also matches 'S and U+017F (long s).
  if (b == '\'' && end - p >= 2) {
    const uint8_t c1 = Lower(p[1]);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (p[1] == 0xC5 && end - p >= 3 && p[2] == 0xBF) return 3;
    if (end - p >= 3) {
      const uint8_t c2 = Lower(p[2]);
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        return 3;
    }
  }
  int len;
  const CharClass cls = ClassAt(p, end, &len);
  const uint8_t* q = p + len;
  const auto run = [&](const uint8_t* from, CharClass want) {
    while (from < end) {
      if (*from < 0x80) {
        if (table_[*from] != want) break;
        ++from;
      } else {
        int l;
        if (ClassAt(from, end, &l) != want) break;
        from += l;
      }
    }
    return from;
  };
  if (cls == CharClass::kLetter) return static_cast<size_t>(run(q, CharClass::kLetter) - p);
  if (cls == CharClass::kNumber) {
    for (int k = 1; k < max_digits_ && q < end; ++k) {
      int l;
      if (ClassAt(q, end, &l) != CharClass::kNumber) break;
      q += l;
    }
    return static_cast<size_t>(q - p);
  }
  const bool crlf = b == '\r' || b == '\n';
  int next_len = 0;
  const CharClass next = q < end ? ClassAt(q, end, &next_len) : CharClass::kSpace;
  // [^\r\n\p{L}\p{N}]?\p{L}+ : one non-letter, non-number character leading a run of letters.
  if (!crlf && q < end && next == CharClass::kLetter)
    return static_cast<size_t>(run(q + next_len, CharClass::kLetter) - p);
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  if (cls == CharClass::kOther || (b == ' ' && q < end && next == CharClass::kOther)) {
    const uint8_t* r = run(cls == CharClass::kOther ? q : q + next_len, CharClass::kOther);
    while (r < end && (*r == '\r' || *r == '\n')) ++r;
    return static_cast<size_t>(r - p);
  }
  // White space: the run, and where its last CR or LF ends.
  const uint8_t* last_crlf_end = crlf ? q : nullptr;
  const uint8_t* last_start = p;
  const uint8_t* r = q;
  while (r < end) {
    int l;
    if (ClassAt(r, end, &l) != CharClass::kSpace) break;
    if (*r == '\r' || *r == '\n') last_crlf_end = r + 1;
    last_start = r;
    r += l;
  }
  if (r == end && trailing_space_whole_) return static_cast<size_t>(r - p);     // \s++$
  if (last_crlf_end != nullptr) return static_cast<size_t>(last_crlf_end - p);  // \s*[\r\n]+
  if (r == end) return static_cast<size_t>(r - p);                              // \s+(?!\S)
  if (last_start != p) return static_cast<size_t>(last_start - p);  // leave the last one
  return static_cast<size_t>(len);                                  // \s+ of one character
}

}  // namespace leantron::data
