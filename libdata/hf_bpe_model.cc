#include "libdata/hf_bpe_model.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "libdata/bpe_vocab.h"
#include "libdata/string_compat.h"
#include "libdata/unicode_class.h"

namespace leantron::data {
namespace {

constexpr int32_t kNone = INT32_MAX;
// Pieces with at least this many initial symbols merge with a tournament tree instead of scans.
constexpr size_t kHeapThreshold = 16;
// Largest id accepted in a vocabulary (ids index arrays).
constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Escaped(std::string_view s) { return absl::CHexEscape(ToAbsl(s)); }

}  // namespace

uint32_t ByteLevelChar(uint8_t b) { return ByteToUnicode(b); }

int ByteLevelByte(uint32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(0x144, -1);
    for (int b = 0; b < 256; ++b) inv[ByteToUnicode(static_cast<uint8_t>(b))] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

bool ByteLevelDecode(std::string_view s, std::string* bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t* end = p + s.size();
  while (p < end) {
    uint32_t cp;
    const int len = DecodeUtf8(p, end, &cp);
    if (len == 0) return false;
    const int b = ByteLevelByte(cp);
    if (b < 0) return false;
    bytes->push_back(static_cast<char>(b));
    p += len;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<HfBpeModel>> HfBpeModel::Create(
    const std::vector<std::pair<std::string, int64_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, HfBpeSettings settings) {
  auto m = std::unique_ptr<HfBpeModel>(new HfBpeModel());
  m->settings_ = std::move(settings);
  // The vocabulary as tokenizer.json spells it; a repeated key keeps its last id (serde's map).
  absl::flat_hash_map<std::string, int32_t> by_string;
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id > kMaxId) {
      return absl::InvalidArgumentError(
          Cat("model.vocab: token \"", Escaped(token), "\" has id ", id, ", outside 0..", kMaxId));
    }
    by_string[token] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  }
  m->vocab_entries_ = by_string.size();
  // Ids index arrays: refuse ids far sparser than any real vocabulary's.
  if (max_id >= 2 * static_cast<int64_t>(by_string.size()) + 65536) {
    return absl::InvalidArgumentError(
        Cat("model.vocab: ids up to ", max_id, " for ", by_string.size(), " tokens"));
  }
  m->strings_.resize(static_cast<size_t>(max_id + 1));
  m->has_string_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [token, id] : vocab) {
    if (m->has_string_[id] || by_string[token] != id) continue;  // first string of an id wins
    m->strings_[id] = token;
    m->has_string_[id] = 1;
  }
  // Model-space bytes of every token.
  m->bytes_offset_.assign(static_cast<size_t>(max_id + 2), 0);
  for (int32_t id = 0; id <= max_id; ++id) {
    m->bytes_offset_[id] = static_cast<uint32_t>(m->bytes_blob_.size());
    if (!m->has_string_[id]) continue;
    const std::string& s = m->strings_[id];
    if (m->settings_.byte_level) {
      std::string bytes;
      if (ByteLevelDecode(s, &bytes)) m->bytes_blob_ += bytes;  // else unreachable by merging
    } else {
      m->bytes_blob_ += s;
    }
  }
  m->bytes_offset_[max_id + 1] = static_cast<uint32_t>(m->bytes_blob_.size());
  for (const auto& [token, id] : by_string) {
    if (!m->settings_.byte_level) {
      m->table_.Set(token, id);
      continue;
    }
    std::string bytes;
    if (ByteLevelDecode(token, &bytes) && !bytes.empty()) m->table_.Set(bytes, id);
  }
  // Merges: (left id, right id) -> (rank, id of left+right); a repeated pair keeps the last rank.
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& left = merges[rank].first;
    const std::string& right = merges[rank].second;
    const auto a = by_string.find(left);
    const auto b = by_string.find(right);
    const auto c = by_string.find(left + right);
    const auto fail = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model.merges[%d] (\"%s\" \"%s\"): %s is not in the vocab", rank,
                          Escaped(left), Escaped(right), what));
    };
    if (a == by_string.end()) return fail(Cat("\"", Escaped(left), "\""));
    if (b == by_string.end()) return fail(Cat("\"", Escaped(right), "\""));
    if (c == by_string.end()) return fail(Cat("the merged token \"", Escaped(left + right), "\""));
    m->merges_.Set(a->second, b->second, {static_cast<int32_t>(rank), c->second});
  }
  m->by_string_ = by_string;
  if (!m->settings_.unk_token.empty()) {
    const auto it = by_string.find(m->settings_.unk_token);
    if (it == by_string.end()) {
      return absl::InvalidArgumentError(
          Cat("model.unk_token \"", Escaped(m->settings_.unk_token), "\" is not in the vocab"));
    }
    m->unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = by_string.find(absl::StrFormat("<0x%02X>", b));
    m->byte_fallback_id_[b] = it == by_string.end() ? -1 : it->second;
    const uint8_t byte = static_cast<uint8_t>(b);
    m->byte_symbol_id_[b] = m->table_.Find(&byte, 1);
  }
  if (m->settings_.byte_level) {
    m->can_cut_ = true;
    for (int b = 0; b < 256; ++b) m->can_cut_ = m->can_cut_ && m->byte_symbol_id_[b] >= 0;
    for (int32_t id = 0; id <= max_id; ++id) {
      const std::string_view t = m->TokenBytes(id);
      for (size_t i = 1; i < t.size(); ++i) {
        const uint32_t k =
            (uint32_t{static_cast<uint8_t>(t[i - 1])} << 8) | static_cast<uint8_t>(t[i]);
        m->pair_in_token_[k >> 6] |= uint64_t{1} << (k & 63);
      }
    }
  }
  m->self_encodes_ = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(max_id + 1));
  for (int64_t id = 0; id <= max_id; ++id) m->self_encodes_[id].store(0, std::memory_order_relaxed);
  return m;
}

std::string_view HfBpeModel::TokenBytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) + 1 >= bytes_offset_.size()) return {};
  return std::string_view(bytes_blob_.data() + bytes_offset_[id],
                          bytes_offset_[id + 1] - bytes_offset_[id]);
}

void HfBpeModel::InitialSymbols(const uint8_t* p, size_t n, std::vector<int32_t>* ids) const {
  // HF's merge_word: a pending unk is flushed before the next known character (or at the end),
  // fused with the following unknown ones under fuse_unk. Byte-fallback tokens do not flush it.
  bool pending_unk = false;
  const uint8_t* end = p + n;
  while (p < end) {
    int len = 1;
    int32_t id;
    if (settings_.byte_level) {
      id = byte_symbol_id_[*p];
    } else {
      uint32_t cp;
      len = DecodeUtf8(p, end, &cp);
      if (len == 0) len = 1;
      id = table_.Find(p, static_cast<size_t>(len));
    }
    if (id >= 0) {
      if (pending_unk) ids->push_back(unk_id_);
      pending_unk = false;
      ids->push_back(id);
      p += len;
      continue;
    }
    if (settings_.byte_fallback) {
      // The bytes of the character as the model sees it: for a byte-level model, the UTF-8 of
      // the byte's printable stand-in.
      std::string chars;
      if (settings_.byte_level) {
        AppendUtf8(ByteLevelChar(*p), &chars);
      } else {
        chars.assign(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
      }
      bool all = true;
      for (char c : chars) all = all && byte_fallback_id_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : chars) ids->push_back(byte_fallback_id_[static_cast<uint8_t>(c)]);
        p += len;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !settings_.fuse_unk) ids->push_back(unk_id_);
      pending_unk = true;
    }
    p += len;
  }
  if (pending_unk) ids->push_back(unk_id_);
}

void HfBpeModel::MergeScan(std::vector<int32_t>* ids) const {
  int32_t ranks[kHeapThreshold];
  int32_t merged[kHeapThreshold];
  ids->resize(ScanMerge(
      merges_, [](const PairTable::Merge& m) { return m.rank; }, kNone, ids->data(), ids->size(),
      ranks, merged));
}

void HfBpeModel::MergeHeap(std::vector<int32_t>* ids) const {
  // A tournament tree over the pair positions: each leaf holds (rank << 32 | position) of the
  // pair starting at a live symbol, each inner node the minimum of its children, so the root is
  // always the lowest rank, leftmost on ties (HF's order). A merge updates three leaves, each in
  // O(log n): the merged pair's, the one before it and the removed symbol's.
  const size_t n = ids->size();
  int32_t* id = ids->data();
  thread_local std::vector<uint32_t> next, prev;
  thread_local std::vector<int32_t> merged;
  thread_local std::vector<uint64_t> tree;
  constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t leaves = 1;
  while (leaves < n) leaves <<= 1;
  next.resize(n);
  prev.resize(n);
  merged.resize(n);
  tree.assign(2 * leaves, kEmpty);
  for (size_t i = 0; i < n; ++i) {
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i == 0 ? n : i - 1);
  }
  const auto leaf = [&](uint32_t i) -> uint64_t {
    const uint32_t j = next[i];
    if (j >= n) return kEmpty;
    const PairTable::Merge m = merges_.Find(id[i], id[j]);
    if (m.rank == kNone) return kEmpty;
    merged[i] = m.merged;
    return (uint64_t{static_cast<uint32_t>(m.rank)} << 32) | i;
  };
  const auto set = [&](size_t i, uint64_t value) {
    size_t k = leaves + i;
    tree[k] = value;
    for (k >>= 1; k >= 1; k >>= 1) {
      const uint64_t m = std::min(tree[2 * k], tree[2 * k + 1]);
      if (tree[k] == m) break;  // nothing above changes
      tree[k] = m;
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) tree[leaves + i] = leaf(static_cast<uint32_t>(i));
  for (size_t k = leaves - 1; k >= 1; --k) tree[k] = std::min(tree[2 * k], tree[2 * k + 1]);
  while (tree[1] != kEmpty) {
    const auto i = static_cast<uint32_t>(tree[1] & 0xFFFFFFFFu);
    const uint32_t j = next[i];
    id[i] = merged[i];
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    set(j, kEmpty);
    set(i, leaf(i));
    if (prev[i] < n) set(prev[i], leaf(prev[i]));
  }
  size_t w = 0;
  for (uint32_t i = 0; i < n; i = next[i]) id[w++] = id[i];
  ids->resize(w);
}

void HfBpeModel::MergeWord(const uint8_t* p, size_t n, std::vector<int32_t>* out) const {
  std::vector<int32_t> ids;
  ids.reserve(n);
  InitialSymbols(p, n, &ids);
  if (ids.size() >= 2) {
    if (ids.size() < kHeapThreshold) {
      MergeScan(&ids);
    } else {
      MergeHeap(&ids);
    }
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

bool HfBpeModel::SelfEncodes(int32_t id) const {
  std::atomic<uint8_t>& state = self_encodes_[id];
  const uint8_t known = state.load(std::memory_order_relaxed);
  if (known != 0) return known == 1;
  const std::string_view bytes = TokenBytes(id);
  std::vector<int32_t> ids;
  if (!bytes.empty()) MergeWord(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &ids);
  const bool yes = ids.size() == 1 && ids[0] == id;
  state.store(yes ? 1 : 2, std::memory_order_relaxed);
  return yes;
}

void HfBpeWorkspace::EncodePiece(const uint8_t* p, size_t n, std::vector<int32_t>* out) {
  const int32_t whole = model_.Find(p, n);
  if (whole >= 0 && (model_.settings().ignore_merges || model_.SelfEncodes(whole))) {
    out->push_back(whole);
    return;
  }
  if (n < 16 || !model_.CanCutPieces()) return EncodeSegment(p, n, out);
  // Long pieces (CJK runs) are merged and cached segment by segment, cut where no merge crosses.
  size_t start = 0;
  const auto segment = [&](size_t end) {
    const uint8_t* s = p + start;
    const size_t len = end - start;
    const int32_t id = len == n ? -1 : model_.Find(s, len);
    if (id >= 0 && model_.SelfEncodes(id)) {
      out->push_back(id);
    } else {
      EncodeSegment(s, len, out);
    }
    start = end;
  };
  for (size_t i = 1; i < n; ++i) {
    if (!model_.PairInSomeToken(p[i - 1], p[i])) segment(i);
  }
  segment(n);
}

void HfBpeWorkspace::EncodeSegment(const uint8_t* p, size_t n, std::vector<int32_t>* out) {
  if (n > kMaxCachedPiece) {
    model_.MergeWord(p, n, out);
    return;
  }
  if (cache_.Lookup(p, n, out)) return;
  const size_t before = out->size();
  model_.MergeWord(p, n, out);
  cache_.Insert(p, n, out->data() + before, out->size() - before);
}

}  // namespace leantron::data
