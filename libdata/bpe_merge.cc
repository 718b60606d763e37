#include "libdata/bpe_merge.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "absl/container/inlined_vector.h"

namespace leantron::data {
namespace {

constexpr int32_t kNone = std::numeric_limits<int32_t>::max();

inline int32_t PairRank(const BpeVocab& vocab, const uint8_t* p, size_t begin, size_t end,
                        int32_t rank_limit) {
  const int32_t r = vocab.Rank(p + begin, end - begin);
  return (r < 0 || r >= rank_limit) ? kNone : r;
}

}  // namespace

void BytePairEncodeScan(const BpeVocab& vocab, const uint8_t* p, size_t n,
                        std::vector<int32_t>* out, int32_t rank_limit) {
  // bounds[i] is where part i starts; bounds[count] == n. ranks[i] is the rank of parts i and i+1
  // merged (kNone when that is no token).
  absl::InlinedVector<uint32_t, kBpeHeapThreshold + 1> bounds(n + 1);
  absl::InlinedVector<int32_t, kBpeHeapThreshold + 1> ranks(n + 1, kNone);
  for (size_t i = 0; i <= n; ++i) bounds[i] = static_cast<uint32_t>(i);
  size_t count = n;
  for (size_t i = 0; i + 1 < count; ++i) ranks[i] = PairRank(vocab, p, i, i + 2, rank_limit);
  for (;;) {
    int32_t best = kNone;
    size_t at = 0;
    for (size_t i = 0; i + 1 < count; ++i) {
      if (ranks[i] < best) {
        best = ranks[i];
        at = i;
      }
    }
    if (best == kNone) break;
    // Merge parts `at` and `at+1`: drop boundary at+1.
    bounds.erase(bounds.begin() + static_cast<ptrdiff_t>(at + 1));
    ranks.erase(ranks.begin() + static_cast<ptrdiff_t>(at + 1));
    --count;
    ranks[at] = at + 1 < count ? PairRank(vocab, p, bounds[at], bounds[at + 2], rank_limit) : kNone;
    if (at > 0) ranks[at - 1] = PairRank(vocab, p, bounds[at - 1], bounds[at + 1], rank_limit);
  }
  for (size_t i = 0; i < count; ++i) {
    out->push_back(vocab.Rank(p + bounds[i], bounds[i + 1] - bounds[i]));
  }
}

void BytePairEncodeHeap(const BpeVocab& vocab, const uint8_t* p, size_t n,
                        std::vector<int32_t>* out, int32_t rank_limit) {
  // Parts are named by their start byte; next[i] is the start of the following part (n at the
  // end), prev[i] the previous one. pair[i] is the current rank of part i merged with its next.
  // Heap entries (rank, start) go stale when a part changes; they are skipped when popped. A
  // part's pair only ever grows, so a stale entry can never match its part's current rank again.
  std::vector<uint32_t> next(n), prev(n);
  std::vector<int32_t> pair(n, kNone);
  using Entry = uint64_t;  // rank << 32 | start: orders by rank, then leftmost
  std::vector<Entry> heap_storage;
  heap_storage.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i == 0 ? 0 : i - 1);
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    pair[i] = PairRank(vocab, p, i, i + 2, rank_limit);
    if (pair[i] != kNone) heap_storage.push_back((uint64_t(uint32_t(pair[i])) << 32) | i);
  }
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap(std::greater<Entry>(),
                                                                           std::move(heap_storage));
  std::vector<uint8_t> alive(n, 1);
  auto update = [&](uint32_t i) {
    const uint32_t j = next[i];
    const uint32_t k = j < n ? next[j] : static_cast<uint32_t>(n);
    pair[i] = j < n ? PairRank(vocab, p, i, k, rank_limit) : kNone;
    if (pair[i] != kNone) heap.push((uint64_t(uint32_t(pair[i])) << 32) | i);
  };
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    const uint32_t i = static_cast<uint32_t>(e & 0xFFFFFFFFu);
    const int32_t r = static_cast<int32_t>(e >> 32);
    if (!alive[i] || pair[i] != r) continue;
    const uint32_t j = next[i];  // merge part j into part i
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    update(i);
    if (i > 0) update(prev[i]);
  }
  for (uint32_t i = 0; i < n; i = next[i]) out->push_back(vocab.Rank(p + i, next[i] - i));
}

void BytePairEncode(const BpeVocab& vocab, const uint8_t* p, size_t n, std::vector<int32_t>* out,
                    int32_t rank_limit) {
  if (n == 1) {
    out->push_back(vocab.ByteRank(p[0]));
  } else if (n < kBpeHeapThreshold) {
    BytePairEncodeScan(vocab, p, n, out, rank_limit);
  } else {
    BytePairEncodeHeap(vocab, p, n, out, rank_limit);
  }
}

}  // namespace leantron::data
