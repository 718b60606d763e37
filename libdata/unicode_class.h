// Character classes of GPT-2's pre-tokenizer: letters (\p{L}), numbers (\p{N}), White_Space (\s)
// and everything else. Classes come from ICU's Unicode database, tabulated once per process.
#pragma once

#include <cstdint>

namespace leantron::data {

enum class CharClass : uint8_t { kLetter = 0, kNumber = 1, kSpace = 2, kOther = 3 };

// Class of a Unicode scalar value (0..0x10FFFF). Thread-safe; the first call builds the table.
CharClass ClassOfCodePoint(uint32_t cp);

// The whole table, indexed by code point (0x110000 entries), for hot loops.
const CharClass* CodePointClassTable();

// Decodes one UTF-8 scalar at p (p < end). Returns its byte length (1..4) and stores the code
// point; returns 0 when the bytes at p do not start a valid UTF-8 sequence (overlong, surrogate,
// out of range, truncated or stray continuation byte).
inline int DecodeUtf8(const uint8_t* p, const uint8_t* end, uint32_t* cp) {
  const uint8_t b0 = p[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  const long avail = end - p;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (avail < 2 || (p[1] & 0xC0) != 0x80) return 0;
    *cp = ((b0 & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (avail < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
    const uint32_t c = ((b0 & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    if (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (avail < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
      return 0;
    const uint32_t c =
        ((b0 & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
    if (c < 0x10000 || c > 0x10FFFF) return 0;
    *cp = c;
    return 4;
  }
  return 0;
}

}  // namespace leantron::data
