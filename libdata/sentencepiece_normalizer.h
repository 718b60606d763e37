// SentencePiece's normalizer (normalizer.cc): the precompiled character map (a Darts-clone
// double-array trie of rules, longest match first), user-defined symbols kept as they are,
// invalid UTF-8 bytes turned into U+FFFD one byte at a time, then the white-space options:
// remove_extra_whitespaces (trim and collapse), add_dummy_prefix, escape_whitespaces (' ' ->
// U+2581).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "libdata/added_tokens.h"
#include "libdata/sentencepiece_model.h"

namespace leantron::data {

class SentencePieceNormalizer {
 public:
  // `user_defined` (may be empty) matches the user-defined symbols; it must outlive this.
  static absl::StatusOr<SentencePieceNormalizer> Create(const SentencePieceModel::Normalizer& spec,
                                                        bool treat_whitespace_as_suffix,
                                                        const TokenMatcher* user_defined);
  // Replaces *out with the normalized form of `input` (any bytes).
  void Normalize(std::string_view input, std::string* out) const;

 private:
  SentencePieceNormalizer() = default;
  // The normalized text for the longest rule matching a prefix of `input` (or the first
  // character as it is) and how many input bytes it consumes.
  std::pair<std::string_view, size_t> NormalizePrefix(std::string_view input) const;
  // Normalize() for a model without rules or user-defined symbols: valid UTF-8 copied between
  // spaces, invalid text byte by byte.
  void NormalizeIdentity(std::string_view input, std::string* out) const;
  // Darts-clone commonPrefixSearch: the longest key that prefixes `input` and its value.
  bool LongestRule(std::string_view input, size_t* length, uint32_t* value) const;

  SentencePieceModel::Normalizer spec_;
  bool treat_whitespace_as_suffix_ = false;
  const TokenMatcher* user_defined_ = nullptr;
  std::vector<uint32_t> trie_;
  std::string normalized_;  // NUL-terminated replacement strings
};

}  // namespace leantron::data
