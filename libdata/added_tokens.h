// Finds special/added tokens written in text: the leftmost match, longest at that position (HF's
// AddedVocabulary uses Aho-Corasick with LeftmostLongest; tiktoken's special-token regex gives
// the same for token sets where no token is a prefix of another). A trie over bytes, with a
// table of the bytes that can start a token so most positions are skipped at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace leantron::data {

class TokenMatcher {
 public:
  // Adds `token` (non-empty) with a value reported on a match; a token added twice keeps the
  // last value.
  void Add(std::string_view token, int32_t value);
  bool empty() const { return nodes_.size() <= 1; }

  struct Match {
    size_t start, end;
    int32_t value;
  };
  // The leftmost-longest match starting at or after `from`; false when there is none.
  bool FindNext(std::string_view text, size_t from, Match* match) const;
  // Length of the longest token that starts text (0 for none).
  size_t LongestPrefix(std::string_view text) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // sorted by byte
    int32_t value = -1;
    bool terminal = false;
  };
  uint32_t Child(uint32_t node, uint8_t b) const;
  std::vector<Node> nodes_ = std::vector<Node>(1);
  bool first_byte_[256] = {};
};

}  // namespace leantron::data
