// GPT-2's pre-tokenizer as a hand-written state machine over UTF-8. It splits text exactly as
// tiktoken's regex for the gpt2 encoding does:
//   '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s
// ASCII takes one table lookup per byte; other scalars are decoded and classified by
// CodePointClassTable(). A byte that starts no valid UTF-8 scalar counts as one "other" character.
#pragma once

#include <cstddef>
#include <cstdint>

#include "libdata/unicode_class.h"

namespace leantron::data {

class Pretokenizer {
 public:
  Pretokenizer() : table_(CodePointClassTable()) {}

  // Length in bytes of the piece that starts at p (p < end).
  size_t PieceLength(const uint8_t* p, const uint8_t* end) const {
    const uint8_t b = p[0];
    if (b == '\'' && end - p >= 2) {
      const uint8_t c1 = p[1];
      if (c1 == 's' || c1 == 'd' || c1 == 'm' || c1 == 't') return 2;
      if (end - p >= 3) {
        const uint8_t c2 = p[2];
        if ((c1 == 'l' && c2 == 'l') || (c1 == 'v' && c2 == 'e') || (c1 == 'r' && c2 == 'e'))
          return 3;
      }
    }
    int len;
    CharClass cls = ClassAt(p, end, &len);
    const uint8_t* q = p + len;
    if (b == ' ' && q < end) {
      int next_len;
      const CharClass next = ClassAt(q, end, &next_len);
      if (next != CharClass::kSpace) {
        cls = next;  // " ?\p{L}++" and friends: the space leads the run
        q += next_len;
      }
    }
    if (cls != CharClass::kSpace) {
      while (q < end) {
        if (*q < 0x80) {
          if (table_[*q] != cls) break;
          ++q;
        } else {
          int l;
          if (ClassAt(q, end, &l) != cls) break;
          q += l;
        }
      }
      return static_cast<size_t>(q - p);
    }
    // A whitespace run.
    const uint8_t* last = p;
    while (q < end) {
      int l;
      if (ClassAt(q, end, &l) != CharClass::kSpace) break;
      last = q;
      q += l;
    }
    if (q == end) return static_cast<size_t>(q - p);      // \s++$
    if (last != p) return static_cast<size_t>(last - p);  // \s+(?!\S): leave the last one
    return static_cast<size_t>(len);                      // \s
  }

  // Class of the character at p and its length in bytes.
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

 private:
  const CharClass* table_;
};

// True when a piece boundary is certain to fall at `i` whatever surrounds [lo, hi): a space after
// an ASCII non-space byte. No piece holds a non-space character followed by a space, and the
// piece starting at the space depends only on what follows. Splitting text at such points and
// encoding the parts separately gives the same ids as encoding the whole.
inline bool IsSafeSplit(const uint8_t* text, size_t i) {
  if (i == 0 || text[i] != ' ') return false;
  const uint8_t prev = text[i - 1];
  return prev < 0x80 && prev != ' ' && !(prev >= '\t' && prev <= '\r');
}

}  // namespace leantron::data
