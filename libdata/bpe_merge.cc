#include "libdata/bpe_merge.h"

#include <algorithm>
#include <cstring>
#include <functional>

namespace leantron::data {
namespace {

constexpr int32_t kNone = std::numeric_limits<int32_t>::max();

// p must have 8 readable bytes past its end (see RankPadded).
inline int32_t PairRank(const BpeVocab& vocab, const uint8_t* p, size_t begin, size_t end,
                        int32_t rank_limit) {
  const int32_t r = vocab.RankPadded(p + begin, end - begin);
  return (r < 0 || r >= rank_limit) ? kNone : r;
}

}  // namespace

// A copy of the piece with 8 zero bytes after it, so every lookup can load 8 bytes at once.
const uint8_t* PaddedCopy(const uint8_t* p, size_t n, std::vector<uint8_t>* storage) {
  storage->assign(p, p + n);
  storage->resize(n + 8, 0);
  return storage->data();
}

void BytePairEncodeScan(const BpeVocab& vocab, const uint8_t* piece, size_t n,
                        std::vector<int32_t>* out, int32_t rank_limit) {
  uint8_t local[kBpeHeapThreshold + 8] = {};
  std::vector<uint8_t> storage;
  const uint8_t* p = local;
  if (n <= kBpeHeapThreshold) {
    std::memcpy(local, piece, n);
  } else {
    p = PaddedCopy(piece, n, &storage);
  }
  // bounds[i] is where part i starts; bounds[count] == n. ranks[i] is the rank of parts i and i+1
  // merged (kNone when that is no token).
  uint32_t local_bounds[kBpeHeapThreshold + 1];
  int32_t local_ranks[kBpeHeapThreshold + 1];
  std::vector<uint32_t> big_bounds;
  std::vector<int32_t> big_ranks;
  uint32_t* bounds = local_bounds;
  int32_t* ranks = local_ranks;
  if (n > kBpeHeapThreshold) {
    big_bounds.resize(n + 1);
    big_ranks.resize(n + 1);
    bounds = big_bounds.data();
    ranks = big_ranks.data();
  }
  for (size_t i = 0; i <= n; ++i) bounds[i] = static_cast<uint32_t>(i);
  size_t count = n;
  for (size_t i = 0; i + 1 < count; ++i) ranks[i] = PairRank(vocab, p, i, i + 2, rank_limit);
  ranks[count - 1] = kNone;
  for (;;) {
    // Lowest rank, then its leftmost position: two simple passes the compiler vectorizes.
    int32_t best = kNone;
    for (size_t i = 0; i + 1 < count; ++i) best = std::min(best, ranks[i]);
    if (best == kNone) break;
    size_t at = 0;
    while (ranks[at] != best) ++at;
    // Merge parts `at` and `at+1`: drop boundary at+1 and the pair rank that started there.
    std::memmove(bounds + at + 1, bounds + at + 2, (count - at - 1) * sizeof(uint32_t));
    std::memmove(ranks + at + 1, ranks + at + 2, (count - at - 2) * sizeof(int32_t));
    --count;
    ranks[at] = at + 1 < count ? PairRank(vocab, p, bounds[at], bounds[at + 2], rank_limit) : kNone;
    if (at > 0) ranks[at - 1] = PairRank(vocab, p, bounds[at - 1], bounds[at + 1], rank_limit);
  }
  for (size_t i = 0; i < count; ++i) {
    out->push_back(vocab.RankPadded(p + bounds[i], bounds[i + 1] - bounds[i]));
  }
}

void BytePairEncodeHeap(const BpeVocab& vocab, const uint8_t* piece, size_t n,
                        std::vector<int32_t>* out, int32_t rank_limit) {
  // Scratch space is kept per thread: long pieces are common in text without spaces (CJK).
  thread_local std::vector<uint8_t> storage;
  const uint8_t* p = PaddedCopy(piece, n, &storage);
  // Parts are named by their start byte; next[i] is the start of the following part (n at the
  // end), prev[i] the previous one. pair[i] is the current rank of part i merged with its next.
  // Heap entries (rank, start) go stale when a part changes; they are skipped when popped. A
  // part's pair only ever grows, so a stale entry can never match its part's current rank again.
  thread_local std::vector<uint32_t> next, prev;
  thread_local std::vector<int32_t> pair;
  thread_local std::vector<uint8_t> alive;
  next.resize(n);
  prev.resize(n);
  pair.assign(n, kNone);
  alive.assign(n, 1);
  using Entry = uint64_t;  // rank << 32 | start: orders by rank, then leftmost
  thread_local std::vector<Entry> heap;
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i == 0 ? 0 : i - 1);
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    pair[i] = PairRank(vocab, p, i, i + 2, rank_limit);
    if (pair[i] != kNone) heap.push_back((uint64_t(uint32_t(pair[i])) << 32) | i);
  }
  const auto later = std::greater<Entry>();
  std::make_heap(heap.begin(), heap.end(), later);
  auto update = [&](uint32_t i) {
    const uint32_t j = next[i];
    const uint32_t k = j < n ? next[j] : static_cast<uint32_t>(n);
    pair[i] = j < n ? PairRank(vocab, p, i, k, rank_limit) : kNone;
    if (pair[i] != kNone) {
      heap.push_back((uint64_t(uint32_t(pair[i])) << 32) | i);
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Entry e = heap.back();
    heap.pop_back();
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
  for (uint32_t i = 0; i < n; i = next[i]) out->push_back(vocab.RankPadded(p + i, next[i] - i));
}

namespace {

void EncodeSegment(const BpeVocab& vocab, const uint8_t* p, size_t n, std::vector<int32_t>* out,
                   int32_t rank_limit) {
  if (n == 1) {
    out->push_back(vocab.ByteRank(p[0]));
  } else if (n < kBpeHeapThreshold) {
    BytePairEncodeScan(vocab, p, n, out, rank_limit);
  } else {
    BytePairEncodeHeap(vocab, p, n, out, rank_limit);
  }
}

}  // namespace

void BytePairEncode(const BpeVocab& vocab, const uint8_t* p, size_t n, std::vector<int32_t>* out,
                    int32_t rank_limit) {
  if (n < kBpeCutThreshold || rank_limit != std::numeric_limits<int32_t>::max()) {
    EncodeSegment(vocab, p, n, out, rank_limit);
    return;
  }
  // A long piece (CJK text has no spaces) is cut where no token holds the two bytes on either
  // side: no merge can cross such a point, so the segments merge on their own, with the same
  // result and far fewer candidate pairs each.
  ForEachMergeSegment(vocab, p, n, [&](const uint8_t* s, size_t len) {
    EncodeSegment(vocab, s, len, out, rank_limit);
  });
}

}  // namespace leantron::data
