#include "libdata/sentencepiece_tokenizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "libdata/added_tokens.h"
#include "libdata/piece_cache.h"
#include "libdata/sentencepiece_model.h"
#include "libdata/sentencepiece_normalizer.h"
#include "libdata/string_compat.h"
#include "libdata/token_table.h"
#include "libdata/unicode_class.h"
#include "libfs/atomic_file.h"

namespace leantron::data {
namespace {

using PieceType = SentencePieceModel::PieceType;
constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";

size_t OneCharLen(uint8_t lead) { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[lead >> 4]; }

// Higher scores first: the float's bits made to sort as unsigned, then inverted.
uint32_t ScoreOrder(float score) {
  uint32_t bits;
  std::memcpy(&bits, &score, 4);
  bits = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return ~bits;
}

static_assert(std::endian::native == std::endian::little);

class SpTokenizer;

class SpEncoder : public TextEncoder {
 public:
  explicit SpEncoder(const SpTokenizer& t) : t_(t) {}
  absl::Status Encode(std::string_view text, std::vector<int32_t>* out) override;

 private:
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids);
  // EncodeWord for a segment of 2 to kScanSymbols characters that are all pieces, in a model
  // without UNUSED pieces: the best pair found by a scan of a few ids instead of the tree.
  // Returns false (nothing appended) where a character is not a piece.
  bool MergeScan(std::string_view word, std::vector<int32_t>* ids);
  static constexpr size_t kScanSymbols = 16;
  // Appends the ids of the final symbol w, piece `id` (-1: none).
  void Resegment(std::string_view w, int32_t id, std::vector<int32_t>* ids);
  void Emit(const std::vector<int32_t>& ids, std::vector<int32_t>* out);

  const SpTokenizer& t_;
  std::string normalized_;
  bool prev_unk_ = false;
  PieceCache cache_;
  std::vector<int32_t> word_ids_;
  // Merge workspace.
  struct Symbol {
    uint32_t start, len;
    int32_t prev, next;
    int32_t id;  // the piece this symbol is, or -1 (an unknown character)
    bool freeze;
  };
  std::vector<Symbol> symbols_;
  std::vector<uint64_t> tree_;
  std::vector<int32_t> pair_id_;
  absl::flat_hash_map<std::string, std::pair<std::string, std::string>> rev_merge_;
};

class SpTokenizer : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SpTokenizer>> Create(SentencePieceModel model,
                                                             const std::string& name,
                                                             const std::string& type);

  std::unique_ptr<TextEncoder> NewEncoder(const EncodeOptions&) const override {
    return std::make_unique<SpEncoder>(*this);
  }
  absl::Status Decode(absl::Span<const int32_t> ids, std::string* out) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(model_.pieces.size()); }
  std::optional<int32_t> eod_id() const override { return eos_; }
  EncodeOptions megatron_defaults() const override { return {false, false}; }
  std::string Describe() const override {
    return absl::StrFormat("%s %s (SentencePiece BPE%s, %d pieces, EOD %s)", type_, name_,
                           model_.byte_fallback ? ", byte fallback" : "", model_.pieces.size(),
                           eos_ ? absl::StrCat(*eos_) : "none");
  }

  // The piece that the n bytes at p are, or -1: a direct table for a three-byte character of the
  // Basic Multilingual Plane (a lead byte 0xE0-0xEF and two continuation bytes, 16 bits), a hash
  // table for the rest.
  int32_t SymbolId(const uint8_t* p, size_t n) const {
    if (n == 3 && (p[0] & 0xF0) == 0xE0 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80)
      return three_byte_id_[((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu)];
    return pieces_.Find(p, n);
  }

  // sentencepiece's PieceToId: reserved pieces, then ordinary ones, else unk.
  int32_t PieceToId(std::string_view s) const {
    const int32_t r = reserved_.Find(s);
    if (r >= 0) return r;
    const int32_t p = pieces_.Find(s);
    return p >= 0 ? p : unk_id_;
  }

  SentencePieceModel model_;
  std::string name_, type_;
  std::unique_ptr<TokenMatcher> user_defined_;
  std::optional<SentencePieceNormalizer> normalizer_;
  TokenTable pieces_;    // NORMAL, USER_DEFINED, UNUSED
  TokenTable reserved_;  // CONTROL, UNKNOWN, BYTE
  std::vector<int32_t> three_byte_id_ = std::vector<int32_t>(0x10000, -1);  // see SymbolId
  // (left piece, right piece) -> the piece of their concatenation and its score order (rank:
  // ScoreOrder as int32), for every split of every piece into two pieces: merge candidates
  // without hashing strings or reading the pieces.
  PairTable merges_;
  // Per piece: the id that a final symbol of this piece emits (PieceToId of its text), or -1
  // where Resegment must look closer (UNUSED pieces, the unk id).
  std::vector<int32_t> emit_id_;
  std::vector<uint8_t> unused_;  // per piece: UNUSED
  bool has_user_defined_ = false;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256] = {};
  // Text can be cut between two symbols that no piece holds side by side (no merge crosses
  // there), unless the model has UNUSED pieces (their split-back depends on the whole text's
  // merge history). pair_filter_ is a one-hash Bloom filter over the pairs of adjacent
  // characters inside pieces: a pair not in it is in no piece; a false positive costs a cut.
  bool can_cut_ = false;
  std::vector<uint64_t> pair_filter_;
  int pair_filter_shift_ = 64;
  // A character's bytes (1 to 4), zero-padded: the filter's half key (Encode loads it as a
  // little-endian word).
  static uint32_t CharBits(const uint8_t* p, size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint32_t{p[i]} << (8 * i);
    return v;
  }
  size_t PairBit(uint32_t a, uint32_t b) const {
    return static_cast<size_t>((((uint64_t{a} << 32) | b) * 0x9E3779B97F4A7C15ull) >>
                               pair_filter_shift_);
  }
  bool PairInSomePiece(uint32_t a, uint32_t b) const {
    const size_t i = PairBit(a, b);
    return (pair_filter_[i >> 6] >> (i & 63)) & 1;
  }
  std::optional<int32_t> eos_;
};

absl::StatusOr<std::unique_ptr<SpTokenizer>> SpTokenizer::Create(SentencePieceModel model,
                                                                 const std::string& name,
                                                                 const std::string& type) {
  const auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(Cat(name, ": ", what));
  };
  if (model.model_type != SentencePieceModel::ModelType::kBpe) {
    const char* kind = model.model_type == SentencePieceModel::ModelType::kUnigram ? "unigram"
                       : model.model_type == SentencePieceModel::ModelType::kWord  ? "word"
                                                                                   : "char";
    return absl::UnimplementedError(
        Cat(name, ": the SentencePiece ", kind, " model is not implemented (only BPE is)"));
  }
  auto t = std::unique_ptr<SpTokenizer>(new SpTokenizer());
  t->name_ = name;
  t->type_ = type;
  t->user_defined_ = std::make_unique<TokenMatcher>();
  bool byte_found[256] = {};
  for (size_t i = 0; i < model.pieces.size(); ++i) {
    const auto& p = model.pieces[i];
    const int32_t id = static_cast<int32_t>(i);
    if (p.piece.empty()) return error(absl::StrFormat("piece %d is empty", i));
    if (std::isnan(p.score)) return error(absl::StrFormat("piece %d has a NaN score", i));
    const bool normal = p.type == PieceType::kNormal || p.type == PieceType::kUserDefined ||
                        p.type == PieceType::kUnused;
    TokenTable& table = normal ? t->pieces_ : t->reserved_;
    if (table.Find(p.piece) >= 0)
      return error(Cat("piece \"", absl::CHexEscape(p.piece), "\" is defined twice"));
    table.Set(p.piece, id);
    if (p.type == PieceType::kUserDefined) t->user_defined_->Add(p.piece, id);
    const auto* b = reinterpret_cast<const uint8_t*>(p.piece.data());
    if (normal && p.piece.size() == 3 && (b[0] & 0xF0) == 0xE0 && (b[1] & 0xC0) == 0x80 &&
        (b[2] & 0xC0) == 0x80) {
      t->three_byte_id_[((b[0] & 0x0Fu) << 12) | ((b[1] & 0x3Fu) << 6) | (b[2] & 0x3Fu)] = id;
    }
    if (p.type == PieceType::kUnknown) {
      if (t->unk_id_ >= 0) return error("the unk piece is defined twice");
      t->unk_id_ = id;
    }
    if (p.type == PieceType::kByte) {
      if (!model.byte_fallback) return error(Cat("byte piece ", p.piece, " without byte_fallback"));
      unsigned b = 256;
      if (p.piece.size() == 6 && std::sscanf(p.piece.c_str(), "<0x%2X>", &b) == 1 &&
          absl::StrFormat("<0x%02X>", b) == p.piece && b < 256) {
        byte_found[b] = true;
        t->byte_ids_[b] = id;
      } else {
        return error(Cat("byte piece ", p.piece, " is invalid"));
      }
    }
  }
  if (t->unk_id_ < 0) return error("no unk piece");
  if (model.byte_fallback) {
    for (bool f : byte_found)
      if (!f) return error("byte_fallback without all 256 byte pieces");
  }
  absl::StatusOr<SentencePieceNormalizer> normalizer = SentencePieceNormalizer::Create(
      model.normalizer, model.treat_whitespace_as_suffix, t->user_defined_.get());
  if (!normalizer.ok()) return error(std::string(normalizer.status().message()));
  t->normalizer_.emplace(*std::move(normalizer));
  for (size_t i = 0; i < model.pieces.size(); ++i) {
    const auto& p = model.pieces[i];
    if (p.type != PieceType::kNormal && p.type != PieceType::kUserDefined &&
        p.type != PieceType::kUnused)
      continue;
    const std::string_view s = p.piece;
    for (size_t k = 1; k < s.size(); ++k) {
      if ((static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) continue;  // split between characters
      const int32_t left = t->pieces_.Find(s.substr(0, k));
      const int32_t right = left < 0 ? -1 : t->pieces_.Find(s.substr(k));
      if (right >= 0) {
        t->merges_.Set(left, right,
                       {static_cast<int32_t>(ScoreOrder(p.score)), static_cast<int32_t>(i)});
      }
    }
  }
  t->has_user_defined_ = !t->user_defined_->empty();
  t->emit_id_.assign(model.pieces.size(), -1);
  t->unused_.assign(model.pieces.size(), 0);
  for (size_t i = 0; i < model.pieces.size(); ++i) {
    const auto& p = model.pieces[i];
    t->unused_[i] = p.type == PieceType::kUnused;
    const int32_t id = t->PieceToId(p.piece);
    if (p.type != PieceType::kUnused && id != t->unk_id_) t->emit_id_[i] = id;
  }
  // Characters as EncodeWord splits text (a merged symbol starts at a character, so its
  // characters are the piece's own split).
  t->can_cut_ = true;
  absl::flat_hash_set<uint64_t> char_pairs;  // (first << 32 | second)
  for (const auto& p : model.pieces) {
    if (p.type == PieceType::kUnused) t->can_cut_ = false;
    if (p.type != PieceType::kNormal && p.type != PieceType::kUserDefined &&
        p.type != PieceType::kUnused)
      continue;
    const auto* b = reinterpret_cast<const uint8_t*>(p.piece.data());
    uint32_t prev = 0;
    for (size_t i = 0; i < p.piece.size();) {
      const size_t n = std::min(p.piece.size() - i, OneCharLen(b[i]));
      const uint32_t cur = CharBits(b + i, n);
      if (i > 0) char_pairs.insert((uint64_t{prev} << 32) | cur);
      prev = cur;
      i += n;
    }
  }
  size_t bits = size_t{1} << 16;  // about 16 bits per pair: few false positives
  while (bits < 16 * char_pairs.size()) bits <<= 1;
  t->pair_filter_.assign(bits / 64, 0);
  t->pair_filter_shift_ = 64 - std::countr_zero(bits);
  for (const uint64_t ab : char_pairs) {
    const size_t i = t->PairBit(static_cast<uint32_t>(ab >> 32), static_cast<uint32_t>(ab));
    t->pair_filter_[i >> 6] |= uint64_t{1} << (i & 63);
  }
  const int32_t eos = t->PieceToId(model.eos_piece);
  if (model.pieces[eos].type == PieceType::kControl) t->eos_ = eos;
  t->model_ = std::move(model);
  return t;
}

absl::Status SpTokenizer::Decode(absl::Span<const int32_t> ids, std::string* out) const {
  if (model_.has_denormalizer && !model_.denormalizer.precompiled_charsmap.empty()) {
    return absl::UnimplementedError(
        Cat(name_, ": decoding with a denormalizer is not implemented"));
  }
  const auto type_of = [&](int32_t id) { return model_.pieces[id].type; };
  std::string text;
  std::string bytes;
  bool is_bos_ws = true, bos_ws_seen = false;
  const auto flush_bytes = [&] {
    // Byte pieces decode as UTF-8; a byte that starts no valid character is U+FFFD.
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
    const uint8_t* end = p + bytes.size();
    while (p < end) {
      uint32_t cp;
      const int len = DecodeUtf8(p, end, &cp);
      if (len == 0) {
        text += "\xEF\xBF\xBD";
        ++p;
      } else {
        text.append(reinterpret_cast<const char*>(p), len);
        p += len;
      }
    }
    bytes.clear();
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= model_.pieces.size()) {
      return absl::OutOfRangeError(
          absl::StrFormat("id %d at position %d is outside the %d pieces of %s", id, i,
                          model_.pieces.size(), name_));
    }
    const PieceType type = type_of(id);
    if (type == PieceType::kByte) {
      unsigned b;
      std::sscanf(model_.pieces[id].piece.c_str(), "<0x%2X>", &b);
      bytes.push_back(static_cast<char>(b));
      continue;
    }
    flush_bytes();
    if (bos_ws_seen || !text.empty()) is_bos_ws = false;
    std::string_view piece = model_.pieces[id].piece;
    if (type == PieceType::kControl) {
      bos_ws_seen = false;
      continue;
    }
    if (type == PieceType::kUnknown) {
      text += model_.unk_surface;
      bos_ws_seen = false;
      continue;
    }
    bool has_bos_ws = false;
    if (is_bos_ws &&
        (model_.normalizer.add_dummy_prefix || model_.normalizer.remove_extra_whitespaces)) {
      if (piece.substr(0, kSpaceSymbol.size()) == kSpaceSymbol) {
        piece.remove_prefix(kSpaceSymbol.size());
        has_bos_ws = true;
      }
      if (model_.normalizer.remove_extra_whitespaces) has_bos_ws = false;
    }
    for (size_t k = 0; k < piece.size();) {
      if (piece.substr(k, kSpaceSymbol.size()) == kSpaceSymbol) {
        text.push_back(' ');
        k += kSpaceSymbol.size();
      } else {
        text.push_back(piece[k++]);
      }
    }
    bos_ws_seen = has_bos_ws;
  }
  flush_bytes();
  out->append(text);
  return absl::OkStatus();
}

void SpEncoder::Resegment(std::string_view w, int32_t piece, std::vector<int32_t>* ids) {
  if (piece >= 0 && t_.emit_id_[piece] >= 0) {
    ids->push_back(t_.emit_id_[piece]);
    return;
  }
  const int32_t id = t_.PieceToId(w);
  if (t_.model_.pieces[id].type == PieceType::kUnused) {
    const auto it = rev_merge_.find(absl::string_view(w.data(), w.size()));
    if (it != rev_merge_.end()) {
      const auto parts = it->second;  // copy: the recursion may rehash the map
      Resegment(parts.first, -1, ids);
      Resegment(parts.second, -1, ids);
      return;
    }
  }
  if (id == t_.unk_id_ && t_.model_.byte_fallback) {
    for (char c : w) ids->push_back(t_.byte_ids_[static_cast<uint8_t>(c)]);
  } else {
    ids->push_back(id);
  }
}

void SpEncoder::EncodeWord(std::string_view word, std::vector<int32_t>* ids) {
  // Characters (user-defined symbols whole and frozen).
  symbols_.clear();
  if (!rev_merge_.empty()) rev_merge_.clear();
  const auto* w = reinterpret_cast<const uint8_t*>(word.data());
  for (size_t pos = 0; pos < word.size();) {
    size_t n = t_.has_user_defined_ ? t_.user_defined_->LongestPrefix(word.substr(pos)) : 0;
    const bool freeze = n > 0;
    if (!freeze) n = std::min(word.size() - pos, OneCharLen(w[pos]));
    const int32_t index = static_cast<int32_t>(symbols_.size());
    symbols_.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(n), index - 1,
                        pos + n < word.size() ? index + 1 : -1, t_.SymbolId(w + pos, n), freeze});
    pos += n;
  }
  // sentencepiece's agenda pops the highest score first, the leftmost on ties, and skips entries
  // whose symbols changed since. Here a tournament tree over the symbol positions holds only
  // the current pairs, keyed (score order, position), so its root is the agenda's next valid
  // entry; pairs are (re)computed in the agenda's order, which the UNUSED split-back records.
  const size_t n = symbols_.size();
  size_t leaves = 1;
  while (leaves < n) leaves <<= 1;
  constexpr uint64_t kEmpty = ~uint64_t{0};
  tree_.assign(2 * leaves, kEmpty);
  pair_id_.resize(n);
  const auto pair = [&](int32_t left) -> uint64_t {
    if (left < 0) return kEmpty;
    const int32_t right = symbols_[left].next;
    if (right < 0 || symbols_[left].freeze || symbols_[right].freeze) return kEmpty;
    // Pairs of pieces come from a table of ids; only unknown characters need the string.
    uint32_t order = 0;
    int32_t id;
    if (symbols_[left].id >= 0 && symbols_[right].id >= 0) {
      const PairTable::Merge m = t_.merges_.Find(symbols_[left].id, symbols_[right].id);
      id = m.merged;
      order = static_cast<uint32_t>(m.rank);
    } else {
      id = t_.pieces_.Find(
          word.substr(symbols_[left].start, symbols_[left].len + symbols_[right].len));
      if (id >= 0) order = ScoreOrder(t_.model_.pieces[id].score);
    }
    if (id < 0) return kEmpty;
    if (t_.unused_[id]) {
      const std::string_view piece =
          word.substr(symbols_[left].start, symbols_[left].len + symbols_[right].len);
      rev_merge_[absl::string_view(piece.data(), piece.size())] = {
          std::string(word.substr(symbols_[left].start, symbols_[left].len)),
          std::string(word.substr(symbols_[right].start, symbols_[right].len))};
    }
    pair_id_[left] = id;
    return (uint64_t{order} << 32) | static_cast<uint32_t>(left);
  };
  const auto set = [&](size_t i, uint64_t value) {
    size_t k = leaves + i;
    tree_[k] = value;
    for (k >>= 1; k >= 1; k >>= 1) {
      const uint64_t m = std::min(tree_[2 * k], tree_[2 * k + 1]);
      if (tree_[k] == m) break;
      tree_[k] = m;
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) tree_[leaves + i] = pair(static_cast<int32_t>(i));
  for (size_t k = leaves - 1; k >= 1; --k) tree_[k] = std::min(tree_[2 * k], tree_[2 * k + 1]);
  while (n > 0 && tree_[1] != kEmpty) {
    const auto left = static_cast<int32_t>(tree_[1] & 0xFFFFFFFFu);
    Symbol& l = symbols_[left];
    const int32_t right = l.next;
    Symbol& r = symbols_[right];
    l.len += r.len;
    l.id = pair_id_[left];
    l.next = r.next;
    if (r.next >= 0) symbols_[r.next].prev = left;
    r.len = 0;
    set(static_cast<size_t>(right), kEmpty);
    if (l.prev >= 0) set(static_cast<size_t>(l.prev), pair(l.prev));
    set(static_cast<size_t>(left), pair(left));
  }
  for (int32_t i = symbols_.empty() ? -1 : 0; i >= 0; i = symbols_[i].next) {
    Resegment(word.substr(symbols_[i].start, symbols_[i].len), symbols_[i].id, ids);
  }
}

bool SpEncoder::MergeScan(std::string_view word, std::vector<int32_t>* ids) {
  int32_t id[kScanSymbols];
  uint32_t order[kScanSymbols];  // of the pair (id[i], id[i + 1]); kNone: no merge
  int32_t merged[kScanSymbols];
  constexpr uint32_t kNone = ~uint32_t{0};  // above every ScoreOrder
  const auto* w = reinterpret_cast<const uint8_t*>(word.data());
  size_t count = 0;
  for (size_t pos = 0; pos < word.size();) {
    const size_t n = std::min(word.size() - pos, OneCharLen(w[pos]));
    const int32_t s = t_.SymbolId(w + pos, n);
    if (s < 0) return false;
    id[count++] = s;
    pos += n;
  }
  // the highest score, the leftmost on ties, as sentencepiece's agenda
  count = ScanMerge(
      t_.merges_,
      [](const PairTable::Merge& m) {
        return m.merged >= 0 ? static_cast<uint32_t>(m.rank) : kNone;
      },
      kNone, id, count, order, merged);
  for (size_t i = 0; i < count; ++i) {
    if (t_.emit_id_[id[i]] >= 0) {
      ids->push_back(t_.emit_id_[id[i]]);
    } else {
      Resegment(t_.model_.pieces[id[i]].piece, id[i], ids);
    }
  }
  return true;
}

void SpEncoder::Emit(const std::vector<int32_t>& ids, std::vector<int32_t>* out) {
  // Consecutive unknown pieces are one unknown (byte fallback expands them instead).
  for (int32_t id : ids) {
    const bool unk = id == t_.unk_id_;
    if (!(unk && prev_unk_)) out->push_back(id);
    prev_unk_ = unk;
  }
}

absl::Status SpEncoder::Encode(std::string_view text, std::vector<int32_t>* out) {
  t_.normalizer_->Normalize(text, &normalized_);
  prev_unk_ = false;
  const std::string_view norm = normalized_;
  if (!t_.can_cut_) {
    word_ids_.clear();
    EncodeWord(norm, &word_ids_);
    Emit(word_ids_, out);
    return absl::OkStatus();
  }
  // Cut between two characters that no piece holds side by side, and around user-defined
  // symbols (frozen: they never merge): before each U+2581 that follows a non-space, and in CJK
  // text between most characters. The segments merge on their own, exactly as inside the whole
  // text, and recur, so they are cached.
  // A segment of one symbol whose piece is known takes its id directly.
  const auto segment = [&](std::string_view word, size_t symbols) {
    const auto* w = reinterpret_cast<const uint8_t*>(word.data());
    if (symbols == 1) {
      const int32_t id = t_.SymbolId(w, word.size());
      if (id >= 0 && t_.emit_id_[id] >= 0) {  // never unk
        out->push_back(t_.emit_id_[id]);
        prev_unk_ = false;
        return;
      }
    }
    word_ids_.clear();
    if (!cache_.Lookup(w, word.size(), &word_ids_)) {
      if (symbols < 2 || symbols > kScanSymbols || !MergeScan(word, &word_ids_))
        EncodeWord(word, &word_ids_);
      if (word.size() <= 256) cache_.Insert(w, word.size(), word_ids_.data(), word_ids_.size());
    }
    Emit(word_ids_, out);
  };
  const auto* p = reinterpret_cast<const uint8_t*>(norm.data());
  const size_t size = norm.size();
  size_t start = 0, symbols = 0;  // the segment: its start, its symbols
  // The loop without user-defined symbols (as Llama 2's model) and with them.
  const auto scan = [&](auto with_user_defined) {
    uint32_t prev = 0;
    bool prev_frozen = false;
    for (size_t pos = 0; pos < size;) {
      size_t n = 0;
      if constexpr (with_user_defined) n = t_.user_defined_->LongestPrefix(norm.substr(pos));
      const bool frozen = n > 0;
      uint32_t cur = 0;
      if (!frozen) {
        n = OneCharLen(p[pos]);
        if (pos + 4 <= size) {  // the character's bytes from one load
          std::memcpy(&cur, p + pos, 4);
          cur &= 0xFFFFFFFFu >> (32 - 8 * n);
        } else {
          n = std::min(size - pos, n);
          cur = SpTokenizer::CharBits(p + pos, n);
        }
      }
      if (pos > start && (frozen || prev_frozen || !t_.PairInSomePiece(prev, cur))) {
        segment(norm.substr(start, pos - start), symbols);
        start = pos;
        symbols = 0;
      }
      ++symbols;
      prev = cur;
      prev_frozen = frozen;
      pos += n;
    }
  };
  if (t_.has_user_defined_) {
    scan(std::true_type());
  } else {
    scan(std::false_type());
  }
  if (start < size) segment(norm.substr(start), symbols);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> SentencePieceTokenizerFromBytes(
    std::string_view bytes, const std::string& name, const std::string& type) {
  absl::StatusOr<SentencePieceModel> model = ParseSentencePieceModel(bytes, name);
  if (!model.ok()) return model.status();
  absl::StatusOr<std::unique_ptr<SpTokenizer>> t =
      SpTokenizer::Create(*std::move(model), name, type);
  if (!t.ok()) return t.status();
  return std::unique_ptr<Tokenizer>(std::move(*t));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path,
                                                                      const std::string& type) {
  absl::StatusOr<std::string> bytes = fs::ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  return SentencePieceTokenizerFromBytes(*bytes, path, type);
}

}  // namespace leantron::data
