#include "libdata/added_tokens.h"

#include <algorithm>

namespace leantron::data {

uint32_t TokenMatcher::Child(uint32_t node, uint8_t b) const {
  const auto& c = nodes_[node].children;
  const auto it = std::lower_bound(c.begin(), c.end(), std::make_pair(b, uint32_t{0}),
                                   [](const auto& x, const auto& y) { return x.first < y.first; });
  return it != c.end() && it->first == b ? it->second : 0;
}

void TokenMatcher::Add(std::string_view token, int32_t value) {
  if (token.empty()) return;
  uint32_t node = 0;
  for (char ch : token) {
    const auto b = static_cast<uint8_t>(ch);
    uint32_t next = Child(node, b);
    if (next == 0) {
      next = static_cast<uint32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& c = nodes_[node].children;
      c.insert(std::lower_bound(c.begin(), c.end(), std::make_pair(b, uint32_t{0}),
                                [](const auto& x, const auto& y) { return x.first < y.first; }),
               {b, next});
    }
    node = next;
  }
  nodes_[node].terminal = true;
  nodes_[node].value = value;
  first_byte_[static_cast<uint8_t>(token[0])] = true;
}

bool TokenMatcher::FindNext(std::string_view text, size_t from, Match* match) const {
  if (empty()) return false;
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  for (size_t i = from; i < n; ++i) {
    if (!first_byte_[p[i]]) continue;
    uint32_t node = 0;
    size_t best_end = 0;
    int32_t best_value = -1;
    for (size_t j = i; j < n; ++j) {
      node = Child(node, p[j]);
      if (node == 0) break;
      if (nodes_[node].terminal) {
        best_end = j + 1;
        best_value = nodes_[node].value;
      }
    }
    if (best_end > 0) {
      *match = Match{i, best_end, best_value};
      return true;
    }
  }
  return false;
}

size_t TokenMatcher::LongestPrefix(std::string_view text) const {
  if (text.empty() || !first_byte_[static_cast<uint8_t>(text[0])]) return 0;
  uint32_t node = 0;
  size_t best = 0;
  for (size_t j = 0; j < text.size(); ++j) {
    node = Child(node, static_cast<uint8_t>(text[j]));
    if (node == 0) break;
    if (nodes_[node].terminal) best = j + 1;
  }
  return best;
}

}  // namespace leantron::data
