// Text operations of the HF pipeline (hf_tokenizer.cc): a split's matches folded by HF's
// SplitDelimiterBehavior, the normalizers applied to a string, and the character tests added
// tokens use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "libdata/hf_tokenizer.h"
#include "libdata/regex_engine.h"

namespace leantron::data {

// A match of a pre-tokenizer's pattern, or the text between two.
struct Range {
  size_t start, end;
  bool is_match;
};

// HF's NormalizedString::split: the matches and gaps of a pattern, folded by the behavior.
template <typename Emit>
void ApplyBehavior(SplitBehavior behavior, std::vector<Range>& ranges, Emit emit) {
  std::vector<Range> out;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Range& r : ranges) emit(r.start, r.end);
      return;
    case SplitBehavior::kRemoved:
      for (const Range& r : ranges)
        if (!r.is_match) emit(r.start, r.end);
      return;
    case SplitBehavior::kContiguous: {
      bool previous = false;
      for (const Range& r : ranges) {
        if (r.is_match == previous && !out.empty()) {
          out.back().end = r.end;
        } else {
          out.push_back(r);
        }
        previous = r.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Range& r : ranges) {
        if (r.is_match && !previous && !out.empty()) {
          out.back().end = r.end;
        } else {
          out.push_back(r);
        }
        previous = r.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->is_match && !previous && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back(*it);
        }
        previous = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  for (const Range& r : out) emit(r.start, r.end);
}

// Rust regex's Unicode \w, as HF's single_word added tokens test it.
bool IsWordChar(uint32_t cp);
// The last / first code point of valid UTF-8 text (first: and its length).
uint32_t LastChar(std::string_view s);
uint32_t FirstChar(std::string_view s, int* len);

// Applies the normalizers in order. `matchers` holds a RegexMatcher per Replace normalizer (null:
// made here). at_start turns false when text at the start is removed (Strip).
absl::Status ApplyNormalizers(const std::vector<HfNormalizer>& normalizers,
                              std::vector<std::unique_ptr<RegexMatcher>>* matchers,
                              std::string_view in, std::string* out, bool* at_start);

}  // namespace leantron::data
