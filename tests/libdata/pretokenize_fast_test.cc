// Every hand-written pre-tokenizer against the general engine (PCRE2 with the translated
// pattern) on real text (Debian's licence texts, always installed), random Unicode and
// hand-picked edge cases: the pieces must be identical.
#include "libdata/pretokenize_fast.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "libdata/regex_engine.h"

namespace leantron::data {
namespace {

struct Case {
  const char* name;
  const char* pattern;
  RegexDialect dialect;
  FastPattern fast;
};

const Case kCases[] = {
    {"gpt2_hf", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
     RegexDialect::kOniguruma, FastPattern::kGpt2},
    {"gpt2_tiktoken",
     R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)",
     RegexDialect::kRust, FastPattern::kGpt2},
    {"llama3",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     RegexDialect::kOniguruma, FastPattern::kLlama3},
    {"llama3_tiktoken",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     RegexDialect::kRust, FastPattern::kLlama3},
    {"qwen2",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     RegexDialect::kOniguruma, FastPattern::kQwen2},
    {"cl100k",
     R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)",
     RegexDialect::kRust, FastPattern::kCl100k},
};

std::vector<std::string> Fast(FastPattern pattern, const std::string& text) {
  FastPreTokenizer pre(pattern);
  std::vector<std::string> pieces;
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* end = p + text.size();
  while (p < end) {
    const size_t n = pre.PieceLength(p, end);
    if (n == 0) break;
    pieces.emplace_back(reinterpret_cast<const char*>(p), n);
    p += n;
  }
  return pieces;
}

std::vector<std::string> General(const Regex& regex, const std::string& text) {
  RegexMatcher matcher(regex);
  std::vector<std::string> pieces;
  const absl::Status st = matcher.FindMatches(text, [&](size_t s, size_t e, bool is_match) {
    EXPECT_TRUE(is_match || s == e) << "text not covered by the pattern";
    if (e > s) pieces.push_back(text.substr(s, e - s));
  });
  EXPECT_TRUE(st.ok()) << st;
  return pieces;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string RandomText(std::mt19937& rng, size_t chars) {
  static const char* const kBits[] = {
      " ",           "  ",  "\n", "\r\n",     "\t",           "'s",       "'S",
      "'LL",         "'re", "'",  "0",        "12",           "3456",     "x",
      "Ab",          "!?",  "/",  "\xC5\xBF", "\xE2\x80\x83", "\xC2\x85", "\xE1\xA0\x8E",
      "\xE3\x80\x80"};
  std::string s;
  for (size_t i = 0; i < chars; ++i) {
    const uint32_t r = rng() % 100;
    if (r < 40) {
      s += kBits[rng() % (sizeof(kBits) / sizeof(kBits[0]))];
    } else if (r < 60) {
      s.push_back(static_cast<char>(0x20 + rng() % 95));
    } else {
      uint32_t cp;
      do {
        const uint32_t kind = rng() % 4;
        cp = kind == 0   ? 0x80 + rng() % 0x780
             : kind == 1 ? 0x800 + rng() % 0xF800
             : kind == 2 ? 0x1C80 + rng() % 0x40
                         : 0x10000 + rng() % 0x100000;
      } while (cp >= 0xD800 && cp <= 0xDFFF);
      AppendUtf8(cp, &s);
    }
  }
  return s;
}

std::string LicenceTexts() {
  std::string all;
  for (const char* name : {"GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "Artistic"}) {
    std::ifstream f(std::string("/usr/share/common-licenses/") + name);
    std::stringstream ss;
    ss << f.rdbuf();
    all += ss.str();
  }
  return all;
}

class FastPatternTest : public ::testing::TestWithParam<Case> {};

TEST_P(FastPatternTest, IsRecognized) {
  const Case& c = GetParam();
  EXPECT_EQ(RecognizeFastPattern(c.pattern, c.dialect), c.fast);
}

TEST_P(FastPatternTest, SplitsAsThePcre2Engine) {
  const Case& c = GetParam();
  absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(c.pattern, c.dialect);
  ASSERT_TRUE(regex.ok()) << regex.status();
  std::vector<std::string> texts = {"",
                                    " ",
                                    "  ",
                                    "a",
                                    "Hello world",
                                    "it's we'll I'D they'VE 'ſ x'S",
                                    "  x  \n\n  y \r\n",
                                    "a\n",
                                    "a \n ",
                                    "1234567 12 x1 ١٢٣٤",
                                    "((hello)) '(x' ..'s",
                                    " \t\nfoo",
                                    "end   ",
                                    "\xE3\x80\x80\xE3\x81\x82 ab\xC2\xA0 cd",
                                    "a\r\r\n\n  b",
                                    "x/y//\n",
                                    "A\xCC\x81" "bc"};
  const std::string licences = LicenceTexts();
  ASSERT_GT(licences.size(), 10000u) << "Debian's licence texts are missing";
  texts.push_back(licences);
  std::mt19937 rng(17);
  for (int i = 0; i < 2000; ++i) texts.push_back(RandomText(rng, rng() % 200));
  for (const std::string& t : texts) {
    ASSERT_EQ(Fast(c.fast, t), General(**regex, t))
        << c.name << ": \"" << absl::CHexEscape(t) << "\"";
  }
}

INSTANTIATE_TEST_SUITE_P(Patterns, FastPatternTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(RecognizeFastPattern, DialectMatters) {
  // In Oniguruma `{1,3}+` repeats the group and `$` ends a line: cl100k's pattern means
  // something else there, so only PCRE2 may run it.
  EXPECT_EQ(RecognizeFastPattern(kCases[5].pattern, RegexDialect::kOniguruma), FastPattern::kNone);
  EXPECT_EQ(RecognizeFastPattern("\\s+", RegexDialect::kRust), FastPattern::kNone);
}

}  // namespace
}  // namespace leantron::data
