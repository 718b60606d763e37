#include "libdata/regex_engine.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "libdata/string_compat.h"
#include "libdata/unicode_class.h"

namespace leantron::data {
namespace {

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? Cat("PCRE2 error ", code)
               : std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

}  // namespace

bool IsValidUtf8(const char* s, size_t n) {
  const auto* p = reinterpret_cast<const uint8_t*>(s);
  const uint8_t* end = p + n;
  while (p < end) {
    // Eight ASCII bytes at a time.
    if (end - p >= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        p += 8;
        continue;
      }
    }
    uint32_t cp;
    const int len = DecodeUtf8(p, end, &cp);
    if (len == 0) return false;
    p += len;
  }
  return true;
}

Regex::~Regex() {
  if (code_ != nullptr) pcre2_code_free(code_);
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern,
                                                      RegexDialect dialect) {
  if (!IsValidUtf8(pattern.data(), pattern.size())) {
    return absl::InvalidArgumentError("regex is not valid UTF-8");
  }
  absl::StatusOr<TranslatedRegex> translated = TranslateRegex(pattern, dialect);
  if (!translated.ok()) return translated.status();
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(ctx, PCRE2_NEWLINE_LF);
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(translated->pattern.data()), translated->pattern.size(),
      PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | translated->options, &error, &offset, ctx);
  pcre2_compile_context_free(ctx);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        Cat("regex \"", pattern, "\" does not compile: ", Pcre2Message(error)));
  }
  // Without a JIT (not every platform has one) the interpreter finds the same matches, slower.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto regex = std::unique_ptr<Regex>(new Regex());
  regex->code_ = code;
  regex->source_ = std::string(pattern);
  return regex;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(std::string_view literal) {
  // \Q...\E quotes everything but "\E"; split the literal around any "\E" it holds.
  std::string quoted;
  size_t pos = 0;
  for (;;) {
    const size_t e = literal.find("\\E", pos);
    quoted += Cat(
        "\\Q", literal.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos),
        "\\E");
    if (e == std::string_view::npos) break;
    quoted += "\\\\E";
    pos = e + 2;
  }
  if (!IsValidUtf8(literal.data(), literal.size())) {
    return absl::InvalidArgumentError("pattern is not valid UTF-8");
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(quoted.data()), quoted.size(),
                                   PCRE2_UTF | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(Cat("pattern \"", literal, "\": ", Pcre2Message(error)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto regex = std::unique_ptr<Regex>(new Regex());
  regex->code_ = code;
  regex->source_ = std::string(literal);
  return regex;
}

RegexMatcher::RegexMatcher(const Regex& regex) : regex_(regex) {
  match_data_ = pcre2_match_data_create_from_pattern(regex.code_, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
  pcre2_set_match_limit(context_, 100'000'000);
}

RegexMatcher::~RegexMatcher() {
  pcre2_match_data_free(match_data_);
  pcre2_match_context_free(context_);
  pcre2_jit_stack_free(jit_stack_);
}

absl::StatusOr<bool> RegexMatcher::Search(std::string_view text, size_t from, size_t* start,
                                          size_t* end) {
  const int rc = pcre2_match(regex_.code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             from, PCRE2_NO_UTF_CHECK, match_data_, context_);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    return absl::ResourceExhaustedError(
        Cat("regex \"", regex_.source(), "\" at byte ", from, ": ", Pcre2Message(rc)));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_data_);
  *start = ov[0];
  *end = ov[1];
  return true;
}

absl::Status RegexMatcher::FindMatches(std::string_view text,
                                       absl::FunctionRef<void(size_t, size_t, bool)> emit) {
  if (text.empty()) {
    emit(0, 0, false);
    return absl::OkStatus();
  }
  // find_iter of Oniguruma's Rust binding (and Rust's regex): an empty match right where the
  // previous match ended is skipped by moving on one character.
  size_t last_end = 0, prev = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    size_t s, e;
    absl::StatusOr<bool> found = Search(text, last_end, &s, &e);
    if (!found.ok()) return found.status();
    if (!*found) break;
    if (s == e && have_last && last_match_end == e) {
      if (last_end >= text.size()) break;
      uint32_t cp;
      const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + last_end;
      const int len = DecodeUtf8(p, p + (text.size() - last_end), &cp);
      last_end += len > 0 ? len : 1;
      continue;
    }
    if (prev != s) emit(prev, s, false);
    emit(s, e, true);
    prev = e;
    last_end = e;
    last_match_end = e;
    have_last = true;
  }
  if (prev != text.size()) emit(prev, text.size(), false);
  return absl::OkStatus();
}

}  // namespace leantron::data
