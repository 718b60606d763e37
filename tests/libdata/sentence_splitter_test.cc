#include "libdata/sentence_splitter.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace leantron::data {
namespace {

std::vector<std::string> Split(std::string_view text, bool keep_newlines) {
  auto splitter = SentenceSplitter::Create(keep_newlines);
  EXPECT_TRUE(splitter.ok());
  std::vector<std::string_view> views;
  EXPECT_TRUE((*splitter)->Split(text, &views).ok());
  return std::vector<std::string>(views.begin(), views.end());
}

TEST(SentenceSplitter, SplitsAtTerminatorsAndDropsWhitespaceBetween) {
  EXPECT_EQ(Split("Hello world. How are you? I am fine!", false),
            (std::vector<std::string>{"Hello world.", "How are you?", "I am fine!"}));
}

TEST(SentenceSplitter, KeepNewlinesKeepsTheWhitespaceAfterEachSentence) {
  EXPECT_EQ(Split("One.\nTwo.  Three.\n\n", true),
            (std::vector<std::string>{"One.\n", "Two.  ", "Three."}));
  EXPECT_EQ(Split("One.\nTwo.  Three.\n\n", false),
            (std::vector<std::string>{"One.", "Two.", "Three."}));
}

TEST(SentenceSplitter, ABareNewlineIsNotASentenceBoundary) {
  // punkt never splits without a terminator; neither do we.
  EXPECT_EQ(Split("a heading\nand its text. Next one.", false),
            (std::vector<std::string>{"a heading\nand its text.", "Next one."}));
}

TEST(SentenceSplitter, LeadingWhitespaceStaysOnTheFirstSentenceAndEmptyTextHasNone) {
  EXPECT_EQ(Split("  Hi. Bye.", false), (std::vector<std::string>{"  Hi.", "Bye."}));
  EXPECT_TRUE(Split("", false).empty());
  EXPECT_TRUE(Split(" \n\t ", false).empty());
}

TEST(SentenceSplitter, KnownAbbreviationsDoNotEndASentence) {
  EXPECT_EQ(Split("He saw Mr. Jones at noon. Then he left.", false),
            (std::vector<std::string>{"He saw Mr. Jones at noon.", "Then he left."}));
}

TEST(SentenceSplitter, NonAsciiTextKeepsByteOffsets) {
  EXPECT_EQ(Split("Grüße aus Köln. 日本語の文です。次の文！", false),
            (std::vector<std::string>{"Grüße aus Köln.", "日本語の文です。", "次の文！"}));
}

}  // namespace
}  // namespace leantron::data
