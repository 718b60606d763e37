// Pre-tokenizer regexes run by PCRE2 with its JIT: the general engine behind every regex a
// tokenizer file names (hand-written pre-tokenizers exist only for well-known patterns and are
// tested against this one). Patterns are translated from their library's dialect first
// (regex_translate.h), and matches are iterated as Oniguruma's and Rust's find_iter do.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libdata/regex_translate.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_jit_stack_8;
struct pcre2_real_match_context_8;

namespace leantron::data {

// Compiled once, shared by threads.
class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern,
                                                        RegexDialect dialect);
  // A pattern that matches `literal` exactly (HF's Split/Replace with a String pattern).
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(std::string_view literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& source() const { return source_; }

 private:
  friend class RegexMatcher;
  Regex() = default;
  pcre2_real_code_8* code_ = nullptr;
  std::string source_;
};

// One thread's matching state for a Regex.
class RegexMatcher {
 public:
  explicit RegexMatcher(const Regex& regex);
  ~RegexMatcher();
  RegexMatcher(const RegexMatcher&) = delete;
  RegexMatcher& operator=(const RegexMatcher&) = delete;

  // Reports [0, text.size()) as consecutive ranges in order: emit(start, end, is_match) for each
  // match and for the text between matches, as HuggingFace's find_matches lists them. Empty
  // matches are reported as empty ranges. `text` must be valid UTF-8 (not checked again here).
  absl::Status FindMatches(std::string_view text,
                           absl::FunctionRef<void(size_t, size_t, bool)> emit);

 private:
  // Leftmost match starting at or after `from`; false when there is none.
  absl::StatusOr<bool> Search(std::string_view text, size_t from, size_t* start, size_t* end);

  const Regex& regex_;
  pcre2_real_match_data_8* match_data_ = nullptr;
  pcre2_real_jit_stack_8* jit_stack_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;
};

// True when [p, p+n) is valid UTF-8 (no surrogates, overlongs or values past U+10FFFF).
bool IsValidUtf8(const char* p, size_t n);

}  // namespace leantron::data
