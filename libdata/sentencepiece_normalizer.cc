#include "libdata/sentencepiece_normalizer.h"

#include <simdjson.h>

#include <cstring>

#include "libdata/string_compat.h"
#include "libdata/unicode_class.h"

namespace leantron::data {
namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";  // U+2581
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Darts-clone's double-array unit.
bool HasLeaf(uint32_t u) { return (u >> 8) & 1; }
uint32_t Value(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t Label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
uint32_t Offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

}  // namespace

absl::StatusOr<SentencePieceNormalizer> SentencePieceNormalizer::Create(
    const SentencePieceModel::Normalizer& spec, bool treat_whitespace_as_suffix,
    const TokenMatcher* user_defined) {
  SentencePieceNormalizer n;
  n.spec_ = spec;
  n.treat_whitespace_as_suffix_ = treat_whitespace_as_suffix;
  n.user_defined_ = user_defined != nullptr && !user_defined->empty() ? user_defined : nullptr;
  const std::string& blob = spec.precompiled_charsmap;
  if (!blob.empty()) {
    // <trie size: uint32 little-endian><double-array trie><NUL-terminated replacements>
    uint32_t trie_size = 0;
    if (blob.size() <= 4) return absl::InvalidArgumentError("precompiled_charsmap is truncated");
    std::memcpy(&trie_size, blob.data(), 4);
    if (trie_size > blob.size() - 4)
      return absl::InvalidArgumentError("precompiled_charsmap: trie size exceeds the data");
    if (trie_size < 4) return absl::InvalidArgumentError("precompiled_charsmap: empty trie");
    n.trie_.resize(trie_size / 4);
    std::memcpy(n.trie_.data(), blob.data() + 4, n.trie_.size() * 4);
    n.normalized_ = blob.substr(4 + trie_size);
  }
  return n;
}

bool SentencePieceNormalizer::LongestRule(std::string_view input, size_t* length,
                                          uint32_t* value) const {
  *length = 0;
  const size_t units = trie_.size();
  size_t node = Offset(trie_[0]);
  for (size_t i = 0; i < input.size(); ++i) {
    const auto c = static_cast<uint8_t>(input[i]);
    node ^= c;
    if (node >= units) break;
    const uint32_t unit = trie_[node];
    if (Label(unit) != c) break;
    node ^= Offset(unit);
    if (node >= units) break;
    if (HasLeaf(unit)) {
      *length = i + 1;
      *value = Value(trie_[node]);
    }
  }
  return *length > 0;
}

std::pair<std::string_view, size_t> SentencePieceNormalizer::NormalizePrefix(
    std::string_view input) const {
  if (user_defined_ != nullptr) {
    if (const size_t n = user_defined_->LongestPrefix(input); n > 0) return {input.substr(0, n), n};
  }
  size_t length;
  uint32_t value;
  if (!trie_.empty() && LongestRule(input, &length, &value)) {
    if (value >= normalized_.size()) return {std::string_view(), length};
    const char* s = normalized_.data() + value;
    const size_t max = normalized_.size() - value;
    return {std::string_view(s, strnlen(s, max)), length};
  }
  uint32_t cp;
  const auto* p = reinterpret_cast<const uint8_t*>(input.data());
  const int len = DecodeUtf8(p, p + input.size(), &cp);
  if (len == 0) return {kReplacement, 1};
  return {input.substr(0, static_cast<size_t>(len)), static_cast<size_t>(len)};
}

void SentencePieceNormalizer::Normalize(std::string_view input, std::string* out) const {
  out->clear();
  if (input.empty()) return;
  if (trie_.empty() && user_defined_ == nullptr) return NormalizeIdentity(input, out);
  if (spec_.remove_extra_whitespaces) {  // leading white space
    while (!input.empty()) {
      const auto [piece, consumed] = NormalizePrefix(input);
      if (piece != " ") break;
      input.remove_prefix(consumed);
    }
  }
  if (input.empty()) return;
  const std::string_view space = spec_.escape_whitespaces ? kSpaceSymbol : " ";
  if (!treat_whitespace_as_suffix_ && spec_.add_dummy_prefix) out->append(space);
  bool is_prev_space = spec_.remove_extra_whitespaces;
  while (!input.empty()) {
    auto [piece, consumed] = NormalizePrefix(input);
    while (is_prev_space && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    if (!piece.empty()) {
      for (char c : piece) {
        if (spec_.escape_whitespaces && c == ' ') {
          out->append(kSpaceSymbol);
        } else {
          out->push_back(c);
        }
      }
      is_prev_space = piece.back() == ' ';
    }
    input.remove_prefix(consumed);
    if (!spec_.remove_extra_whitespaces) is_prev_space = false;
  }
  if (spec_.remove_extra_whitespaces) {  // trailing white space
    while (out->size() >= space.size() &&
           std::string_view(*out).substr(out->size() - space.size()) == space) {
      out->resize(out->size() - space.size());
    }
  }
  if (treat_whitespace_as_suffix_ && spec_.add_dummy_prefix) out->append(space);
}

void SentencePieceNormalizer::NormalizeIdentity(std::string_view input, std::string* out) const {
  // Normalize() without rules (identity, as Llama 2's model): each character stands for itself,
  // so the loop works on bytes instead of asking NormalizePrefix per character.
  const auto* p = reinterpret_cast<const uint8_t*>(input.data());
  const uint8_t* end = p + input.size();
  const bool collapse = spec_.remove_extra_whitespaces;
  if (collapse) {
    while (p < end && *p == ' ') ++p;
  }
  if (p == end) return;
  const std::string_view space = spec_.escape_whitespaces ? kSpaceSymbol : " ";
  out->reserve(input.size() + input.size() / 4 + 8);
  if (!treat_whitespace_as_suffix_ && spec_.add_dummy_prefix) out->append(space);
  bool is_prev_space = collapse;
  if (simdjson::validate_utf8(reinterpret_cast<const char*>(p), end - p)) {
    // Valid UTF-8 (the usual case, checked at SIMD speed): only spaces change.
    while (p < end) {
      const auto* q = static_cast<const uint8_t*>(std::memchr(p, ' ', end - p));
      if (q == nullptr) q = end;
      if (q > p) {
        out->append(reinterpret_cast<const char*>(p), q - p);
        is_prev_space = false;
      }
      if (q == end) break;
      if (!is_prev_space) out->append(space);
      is_prev_space = collapse;
      p = q + 1;
    }
    p = end;
  }
  while (p < end) {
    const uint8_t* q = p;
    while (q < end && *q < 0x80 && *q != ' ') ++q;  // a run of ASCII other than space
    if (q > p) {
      out->append(reinterpret_cast<const char*>(p), q - p);
      is_prev_space = false;
      p = q;
      continue;
    }
    if (*p == ' ') {
      if (!is_prev_space) out->append(space);
      is_prev_space = collapse;
      ++p;
      continue;
    }
    uint32_t cp;
    int len;
    while (q < end && *q >= 0x80 && (len = DecodeUtf8(q, end, &cp)) > 0) q += len;
    if (q > p) {  // a run of valid characters outside ASCII
      out->append(reinterpret_cast<const char*>(p), q - p);
      p = q;
    } else {
      out->append(kReplacement);
      ++p;
    }
    is_prev_space = false;
  }
  if (collapse) {
    while (out->size() >= space.size() &&
           std::string_view(*out).substr(out->size() - space.size()) == space) {
      out->resize(out->size() - space.size());
    }
  }
  if (treat_whitespace_as_suffix_ && spec_.add_dummy_prefix) out->append(space);
}

}  // namespace leantron::data
