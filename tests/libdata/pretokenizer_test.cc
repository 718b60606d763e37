// Pre-tokenizer splits derived by hand from the regex in specs/tokenizer.md:
//   '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s
#include "libdata/pretokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace leantron::data {
namespace {

std::vector<std::string> Split(const std::string& text) {
  Pretokenizer pre;
  std::vector<std::string> pieces;
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* end = p + text.size();
  while (p < end) {
    const size_t n = pre.PieceLength(p, end);
    EXPECT_GT(n, 0u);
    pieces.emplace_back(reinterpret_cast<const char*>(p), n);
    p += n;
  }
  return pieces;
}

using V = std::vector<std::string>;

TEST(Pretokenizer, WordsTakeTheirLeadingSpace) {
  EXPECT_EQ(Split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(Split("a 12 b!?"), (V{"a", " 12", " b", "!?"}));
}

TEST(Pretokenizer, ContractionsAreCaseSensitiveAndOnlyAtPieceStart) {
  EXPECT_EQ(Split("it's we'll I'd they've you're"),
            (V{"it", "'s", " we", "'ll", " I", "'d", " they", "'ve", " you", "'re"}));
  EXPECT_EQ(Split("IT'S"), (V{"IT", "'", "S"}));
  EXPECT_EQ(Split("x 's"), (V{"x", " '", "s"}));
  EXPECT_EQ(Split("..'s"), (V{"..'", "s"}));
  EXPECT_EQ(Split("'sa'lla"), (V{"'s", "a", "'ll", "a"}));
}

TEST(Pretokenizer, WhitespaceRunsLeaveTheirLastCharacterToTheNextPiece) {
  EXPECT_EQ(Split("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(Split("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(Split("x\n\ny"), (V{"x", "\n", "\n", "y"}));
  EXPECT_EQ(Split("x\ny"), (V{"x", "\n", "y"}));
  EXPECT_EQ(Split("x \ny"), (V{"x", " ", "\n", "y"}));
  EXPECT_EQ(Split("x\n y"), (V{"x", "\n", " y"}));
}

TEST(Pretokenizer, TrailingWhitespaceIsOnePiece) {
  EXPECT_EQ(Split("end  \n "), (V{"end", "  \n "}));
  EXPECT_EQ(Split(" "), (V{" "}));
  EXPECT_EQ(Split("\t\t"), (V{"\t\t"}));
}

TEST(Pretokenizer, UnicodeClasses) {
  // U+00E9 letter, U+0663 Arabic-Indic digit three, U+00A0 no-break space (White_Space).
  EXPECT_EQ(Split("caf\xC3\xA9 \xD9\xA3\xD9\xA3"), (V{"caf\xC3\xA9", " \xD9\xA3\xD9\xA3"}));
  EXPECT_EQ(Split("a\xC2\xA0\xC2\xA0z"), (V{"a", "\xC2\xA0", "\xC2\xA0", "z"}));
  // Emoji are symbols: a run of them is one piece, and the space joins it.
  EXPECT_EQ(Split("hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80"),
            (V{"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80"}));
  // Combining marks (Mn) are neither letters nor numbers.
  EXPECT_EQ(Split("e\xCC\x81x"), (V{"e", "\xCC\x81", "x"}));
}

TEST(Pretokenizer, InvalidUtf8BytesActAsSymbols) {
  EXPECT_EQ(Split("a\xFF\xFE!b"), (V{"a", "\xFF\xFE!", "b"}));
  EXPECT_EQ(Split(" \xC3"), (V{" \xC3"}));                      // truncated sequence at the end
  EXPECT_EQ(Split("\xED\xA0\x80z"), (V{"\xED\xA0\x80", "z"}));  // a UTF-16 surrogate
}

TEST(Pretokenizer, SafeSplitPoints) {
  const std::string s = "ab cd\n ef  g";
  const auto* t = reinterpret_cast<const uint8_t*>(s.data());
  EXPECT_TRUE(IsSafeSplit(t, 2));  // "b| cd"
  EXPECT_FALSE(IsSafeSplit(t, 0));
  EXPECT_FALSE(IsSafeSplit(t, 6));   // after a newline
  EXPECT_FALSE(IsSafeSplit(t, 10));  // second space of a run
  EXPECT_TRUE(IsSafeSplit(t, 9));
}

}  // namespace
}  // namespace leantron::data
