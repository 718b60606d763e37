// Rewrites a pre-tokenizer regex, written for the engine of the library that defined it, into a
// PCRE2 pattern that matches the same text.
//
//   Oniguruma (HuggingFace tokenizers' onig): `^`/`$` are line anchors, (?m) means dot-all,
//     `X{n,m}+` is (X{n,m})+ rather than possessive, `{,n}` is {0,n}, \h is a hex digit.
//   Rust regex / fancy-regex (tiktoken): `^`/`$` anchor the whole text, `{n,m}+` is possessive.
//
// Both engines use Unicode 16.0 and define \s as White_Space; Debian 12's PCRE2 10.42 has Unicode
// 14.0 tables and counts U+180E as \s. So \s becomes the explicit White_Space set and every
// general-category class \p{..} gets the code points assigned since 14.0 added (unicode_class.h).
// Constructs whose meaning differs in ways not handled here (\w, \b, scripts, class set
// operations, backreferences, \p{Mn}/\p{Mc}/\p{C}, ...) are refused with an error naming them, so
// a tokenizer never silently splits text differently from its reference.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace leantron::data {

enum class RegexDialect { kOniguruma, kRust };

struct TranslatedRegex {
  std::string pattern;   // for pcre2_compile with PCRE2_UTF | PCRE2_UCP | `options`
  uint32_t options = 0;  // PCRE2_MULTILINE or PCRE2_DOLLAR_ENDONLY
};

absl::StatusOr<TranslatedRegex> TranslateRegex(std::string_view pattern, RegexDialect dialect);

}  // namespace leantron::data
