// Byte-pair merging of one pre-tokenized piece, with tiktoken's rule: repeatedly merge the
// adjacent pair whose concatenated bytes have the lowest rank (leftmost on ties) until no adjacent
// concatenation is a token. Short pieces use tiktoken's array scan; long ones a heap, so a single
// 10 MB "word" costs O(n log n) instead of O(n^2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "libdata/bpe_vocab.h"

namespace leantron::data {

// Pieces at least this long take the heap path.
inline constexpr size_t kBpeHeapThreshold = 48;
// Pieces at least this long are first cut where no merge can cross (see BytePairEncode).
inline constexpr size_t kBpeCutThreshold = 16;

// Appends the ids of piece [p, p+n), n >= 1. Only tokens of rank < rank_limit take part in
// merges (used to recover the merge list from ranks); single bytes always do.
void BytePairEncode(const BpeVocab& vocab, const uint8_t* p, size_t n, std::vector<int32_t>* out,
                    int32_t rank_limit = std::numeric_limits<int32_t>::max());

// Calls fn(begin, length) for the segments of piece [p, p+n) between points where no token holds
// the bytes on both sides (BpeVocab::PairInSomeToken): byte-pair merging never crosses them, so
// the segments can be merged (and cached) on their own.
template <typename Fn>
void ForEachMergeSegment(const BpeVocab& vocab, const uint8_t* p, size_t n, Fn fn) {
  size_t start = 0;
  for (size_t i = 1; i < n; ++i) {
    if (!vocab.PairInSomeToken(p[i - 1], p[i])) {
      fn(p + start, i - start);
      start = i;
    }
  }
  fn(p + start, n - start);
}

// The two algorithms, exposed for tests that check they agree.
void BytePairEncodeScan(const BpeVocab& vocab, const uint8_t* p, size_t n,
                        std::vector<int32_t>* out, int32_t rank_limit);
void BytePairEncodeHeap(const BpeVocab& vocab, const uint8_t* p, size_t n,
                        std::vector<int32_t>* out, int32_t rank_limit);

}  // namespace leantron::data
