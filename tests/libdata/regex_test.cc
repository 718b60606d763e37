// The regex translator and engine: each dialect's meaning where PCRE2's differs, Unicode 16.0
// classes on PCRE2's Unicode 14.0 tables, onig's find_iter, and refused constructs.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libdata/regex_engine.h"

namespace leantron::data {
namespace {

// Matched pieces (not gaps), as "piece|piece|...".
std::string Matches(const std::string& pattern, RegexDialect dialect, const std::string& text) {
  absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(pattern, dialect);
  if (!regex.ok()) return "error: " + std::string(regex.status().message());
  RegexMatcher m(**regex);
  std::string out;
  const absl::Status st = m.FindMatches(text, [&](size_t s, size_t e, bool is_match) {
    if (!is_match) return;
    if (!out.empty()) out += "|";
    out += "[" + text.substr(s, e - s) + "]";
  });
  return st.ok() ? out : "error: " + std::string(st.message());
}

constexpr RegexDialect kOnig = RegexDialect::kOniguruma;
constexpr RegexDialect kRust = RegexDialect::kRust;

TEST(Regex, AnchorsAreLinesInOnigurumaAndTextInRust) {
  EXPECT_EQ(Matches("a$", kOnig, "a\nba"), "[a]|[a]");
  EXPECT_EQ(Matches("a$", kRust, "a\nba"), "[a]");
  EXPECT_EQ(Matches("^b", kOnig, "b\nb"), "[b]|[b]");
  EXPECT_EQ(Matches("^b", kRust, "b\nb"), "[b]");
  EXPECT_EQ(Matches("a$", kRust, "a\n"), "");  // not before a final newline either
}

TEST(Regex, IntervalFollowedByPlus) {
  // Oniguruma (Ruby syntax) repeats the interval; Rust's fancy-regex makes it possessive.
  EXPECT_EQ(Matches(R"(\d{1,2}+)", kOnig, "12345"), "[12345]");
  EXPECT_EQ(Matches(R"(\d{1,2}+)", kRust, "12345"), "[12]|[34]|[5]");
  EXPECT_EQ(Matches(R"(x{,2})", kOnig, "xxx"), "[xx]|[x]");  // no empty match right after one
}

TEST(Regex, OnigurumaSpecifics) {
  EXPECT_EQ(Matches(R"(\h+)", kOnig, "zz 0fA9 g"), "[0fA9]");    // hex digits
  EXPECT_EQ(Matches(R"((?m:a.b))", kOnig, "a\nb"), "[a\nb]");    // Ruby's m is dot-all
  EXPECT_EQ(Matches(R"(x*)", kOnig, "abxxc"), "[]|[]|[xx]|[]");  // empty matches as onig
}

TEST(Regex, UnicodeClassesAreUnicode16) {
  // U+180E is not White_Space (PCRE2's \s holds it); U+0085 is.
  EXPECT_EQ(Matches(R"(\s+)", kOnig,
                    "a\xE1\xA0\x8E"
                    "b\xC2\x85"
                    "c"),
            "[\xC2\x85]");
  // U+1C89 became a letter in Unicode 16.0.
  EXPECT_EQ(Matches(R"(\p{L}+)", kRust, "\xE1\xB2\x89x"), "[\xE1\xB2\x89x]");
  EXPECT_EQ(Matches(R"([^\s\p{L}]+)", kRust, "\xE1\xB2\x89!"), "[!]");
  EXPECT_EQ(Matches(R"(\p{Lu}\p{Letter}\pL)", kOnig, "Abc"), "[Abc]");
  EXPECT_EQ(Matches(R"((?i:'s))", kOnig, "'S '\xC5\xBF"), "['S]|['\xC5\xBF]");
}

TEST(Regex, LiteralPatterns) {
  absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Literal("a\\E.b");
  ASSERT_TRUE(regex.ok()) << regex.status();
  RegexMatcher m(**regex);
  std::vector<std::string> got;
  const std::string text = "xa\\E.bya\\Ezb";
  ASSERT_TRUE(m.FindMatches(text, [&](size_t s, size_t e, bool is_match) {
                 if (is_match) got.push_back(text.substr(s, e - s));
               }).ok());
  EXPECT_EQ(got, std::vector<std::string>{"a\\E.b"});
}

TEST(Regex, UnimplementedConstructsAreRefusedByName) {
  for (const auto& [pattern, named] : std::vector<std::pair<std::string, std::string>>{
           {R"(\w+)", "\\w"},
           {R"(\bx)", "\\b"},
           {R"(\p{Han})", "Han"},
           {R"(\p{Mn})", "Mn"},
           {R"(\p{C})", "\\p{C}"},
           {R"([a-z&&[^x]])", "&&"},
           {R"((a)\1)", "\\1"},
           {R"([[:alpha:]])", "POSIX"},
           {R"([\S])", "\\S inside"},
       }) {
    absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(pattern, kOnig);
    ASSERT_FALSE(regex.ok()) << pattern;
    EXPECT_EQ(regex.status().code(), absl::StatusCode::kUnimplemented) << regex.status();
    EXPECT_NE(regex.status().message().find(named), std::string::npos) << regex.status();
  }
  absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile("(?U)a+", kRust);
  ASSERT_FALSE(regex.ok());
  EXPECT_NE(regex.status().message().find("'U'"), std::string::npos) << regex.status();
  EXPECT_FALSE(Regex::Compile("(a", kOnig).ok());
  EXPECT_FALSE(Regex::Compile("\xFF", kOnig).ok());
}

TEST(Regex, IsValidUtf8) {
  EXPECT_TRUE(IsValidUtf8("plain ascii text", 16));
  EXPECT_TRUE(IsValidUtf8("\xE6\x97\xA5\xF0\x9F\x99\x82", 7));
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80", 3));  // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF", 2));      // overlong
  EXPECT_FALSE(IsValidUtf8("abcdefgh\x80", 9));
}

}  // namespace
}  // namespace leantron::data
