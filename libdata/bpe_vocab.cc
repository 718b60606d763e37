#include "libdata/bpe_vocab.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "libdata/bpe_merge.h"
#include "libfs/atomic_file.h"

namespace leantron::data {
namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

// GPT-2's byte order for ranks 0..255: the 188 printable bytes, then the rest ascending.
bool IsPrintableByte(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

std::vector<uint8_t> RankToByte() {
  std::vector<uint8_t> order;
  for (int b = 0; b < 256; ++b)
    if (IsPrintableByte(b)) order.push_back(static_cast<uint8_t>(b));
  for (int b = 0; b < 256; ++b)
    if (!IsPrintableByte(b)) order.push_back(static_cast<uint8_t>(b));
  return order;
}

// Inverse of ByteToUnicode for one code point; -1 when it stands for no byte.
int UnicodeToByte(uint32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(0x144, -1);
    for (int b = 0; b < 256; ++b) inv[ByteToUnicode(static_cast<uint8_t>(b))] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

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

// Token string of encoder.json / vocab.bpe -> raw bytes.
absl::StatusOr<std::string> DecodeTokenString(std::string_view s) {
  std::string bytes;
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    uint32_t cp;
    size_t len;
    if (b0 < 0x80) {
      cp = b0, len = 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu), len = 2;
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("token \"%s\" has a character outside GPT-2's byte alphabet",
                          absl::CHexEscape(absl::string_view(s.data(), s.size()))));
    }
    const int byte = UnicodeToByte(cp);
    if (byte < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token \"%s\" has character U+%04X, which stands for no byte",
                          absl::CHexEscape(absl::string_view(s.data(), s.size())), cp));
    }
    bytes.push_back(static_cast<char>(byte));
    i += len;
  }
  return bytes;
}

std::string EncodeTokenString(std::string_view bytes) {
  std::string s;
  for (char c : bytes) AppendUtf8(ByteToUnicode(static_cast<uint8_t>(c)), &s);
  return s;
}

}  // namespace

uint32_t ByteToUnicode(uint8_t b) {
  // Printable bytes stand for themselves; the others, in order, for U+0100, U+0101, ...
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 0x100;
    for (int x = 0; x < 256; ++x) t[x] = IsPrintableByte(x) ? x : next++;
    return t;
  }();
  return table[b];
}

absl::StatusOr<BpeVocab> BpeVocab::FromTokens(std::vector<std::string> tokens) {
  BpeVocab v;
  v.token_offsets_.reserve(tokens.size() + 1);
  v.token_offsets_.push_back(0);
  for (const std::string& t : tokens) {
    if (t.empty()) return absl::InvalidArgumentError("empty token in vocabulary");
    v.blob_ += t;
    v.token_offsets_.push_back(static_cast<uint32_t>(v.blob_.size()));
  }
  v.BuildTable();
  for (int32_t r = 0; r < v.num_ranks(); ++r) {
    if (v.Rank(v.TokenBytes(r)) != r) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token \"%s\" appears twice (ranks %d and %d)",
          absl::CHexEscape(std::string(v.TokenBytes(r))), v.Rank(v.TokenBytes(r)), r));
    }
  }
  for (int b = 0; b < 256; ++b) {
    const uint8_t byte = static_cast<uint8_t>(b);
    v.byte_rank_[b] = v.Rank(&byte, 1);
    if (v.byte_rank_[b] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("vocabulary has no token for the single byte 0x%02X", b));
    }
  }
  return v;
}

void BpeVocab::BuildTable() {
  size_t cap = 16;
  while (cap < 2 * static_cast<size_t>(num_ranks()) + 16) cap <<= 1;
  slots_.assign(cap, Slot{0, 0, -1});
  shift_ = 64 - __builtin_ctzll(cap);
  for (int32_t r = 0; r < num_ranks(); ++r) {
    const std::string_view t = TokenBytes(r);
    const auto* p = reinterpret_cast<const uint8_t*>(t.data());
    const uint64_t head = Head(p, t.size());
    const uint64_t tail = t.size() > 8 ? Tail(p, t.size()) : 0;
    size_t i = SlotOf(head, tail, t.size());
    while (slots_[i].rank >= 0) {
      // A duplicate keeps the first rank; FromTokens reports it.
      if (slots_[i].head == head && slots_[i].len == t.size() && TokenBytes(slots_[i].rank) == t)
        break;
      i = (i + 1) & (cap - 1);
    }
    if (slots_[i].rank < 0) slots_[i] = Slot{head, static_cast<uint32_t>(t.size()), r};
  }
  std::fill(std::begin(pair_in_token_), std::end(pair_in_token_), 0);
  for (int32_t r = 0; r < num_ranks(); ++r) {
    const std::string_view t = TokenBytes(r);
    for (size_t i = 1; i < t.size(); ++i) {
      const uint32_t k =
          (uint32_t{static_cast<uint8_t>(t[i - 1])} << 8) | static_cast<uint8_t>(t[i]);
      pair_in_token_[k >> 6] |= uint64_t{1} << (k & 63);
    }
  }
  two_byte_rank_.assign(1 << 16, -1);
  for (int32_t r = num_ranks() - 1; r >= 0; --r) {  // the first rank wins, as in the table
    const std::string_view t = TokenBytes(r);
    if (t.size() == 2)
      two_byte_rank_[(static_cast<uint8_t>(t[0]) << 8) | static_cast<uint8_t>(t[1])] = r;
  }
}

absl::StatusOr<BpeVocab> BpeVocab::FromTiktokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = fs::ReadFileToString(path);
  if (!text.ok()) return text.status();
  return FromTiktokenText(*text, path);
}

absl::StatusOr<BpeVocab> BpeVocab::FromTiktokenText(std::string_view text_view,
                                                    const std::string& path) {
  const absl::string_view text(text_view.data(), text_view.size());
  std::vector<std::string> tokens;
  std::vector<bool> seen;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (line.empty()) continue;
    const auto fail = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: %s (expected \"<base64 token> <rank>\")", path, line_no, why));
    };
    const size_t sp = line.find(' ');
    if (sp == absl::string_view::npos) return fail("no space");
    std::string bytes;
    if (!absl::Base64Unescape(line.substr(0, sp), &bytes) || bytes.empty())
      return fail("bad base64 token");
    const absl::string_view rank_text = line.substr(sp + 1);
    int64_t rank = -1;
    const auto [ptr, ec] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || ptr != rank_text.data() + rank_text.size() || rank < 0 ||
        rank >= (1 << 24)) {
      return fail("bad rank");
    }
    if (static_cast<size_t>(rank) >= tokens.size()) {
      tokens.resize(rank + 1);
      seen.resize(rank + 1, false);
    }
    if (seen[rank]) return fail(absl::StrCat("rank ", rank, " appears twice"));
    seen[rank] = true;
    tokens[rank] = std::move(bytes);
  }
  for (size_t r = 0; r < seen.size(); ++r) {
    if (!seen[r])
      return absl::InvalidArgumentError(absl::StrCat(path, ": rank ", r, " is missing"));
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tokens"));
  absl::StatusOr<BpeVocab> v = FromTokens(std::move(tokens));
  if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", v.status().message()));
  return v;
}

absl::StatusOr<BpeVocab> BpeVocab::FromMegatronFiles(const std::string& vocab_json,
                                                     const std::string& merges_txt) {
  absl::StatusOr<std::string> merges = fs::ReadFileToString(merges_txt);
  if (!merges.ok()) return merges.status();
  absl::StatusOr<std::string> json_text = fs::ReadFileToString(vocab_json);
  if (!json_text.ok()) return json_text.status();
  return FromMegatronText(*json_text, vocab_json, *merges, merges_txt);
}

absl::StatusOr<BpeVocab> BpeVocab::FromMegatronText(std::string_view json_text,
                                                    const std::string& vocab_json,
                                                    std::string_view merges_view,
                                                    const std::string& merges_txt) {
  // Ranks from the merges, as tiktoken's data_gym loader derives them.
  const absl::string_view merges(merges_view.data(), merges_view.size());
  std::vector<std::string> tokens;
  for (uint8_t b : RankToByte()) tokens.emplace_back(1, static_cast<char>(b));
  absl::flat_hash_map<std::string, int32_t> rank_of;
  for (size_t r = 0; r < tokens.size(); ++r) rank_of[tokens[r]] = static_cast<int32_t>(r);
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(merges, '\n')) {
    ++line_no;
    if (line.empty() || (line_no == 1 && absl::StartsWith(line, "#"))) continue;
    const auto fail = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", merges_txt, line_no, why));
    };
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty())
      return fail("expected two tokens separated by one space");
    absl::StatusOr<std::string> left =
        DecodeTokenString(std::string_view(parts[0].data(), parts[0].size()));
    absl::StatusOr<std::string> right =
        DecodeTokenString(std::string_view(parts[1].data(), parts[1].size()));
    if (!left.ok()) return fail(std::string(left.status().message()));
    if (!right.ok()) return fail(std::string(right.status().message()));
    if (!rank_of.contains(*left) || !rank_of.contains(*right))
      return fail("merges a token that no earlier line made");
    std::string merged = *left + *right;
    if (rank_of.contains(merged)) return fail("repeats an earlier merge");
    rank_of[merged] = static_cast<int32_t>(tokens.size());
    tokens.push_back(std::move(merged));
  }

  // encoder.json must give every token exactly that rank.
  simdjson::ondemand::parser parser;
  simdjson::padded_string padded(json_text);
  simdjson::ondemand::document doc;
  simdjson::ondemand::object obj;
  const auto json_error = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(vocab_json, ": ", std::string(why)));
  };
  if (parser.iterate(padded).get(doc) || doc.get_object().get(obj))
    return json_error("not a JSON object");
  size_t entries = 0;
  bool has_eod = false;
  for (auto field : obj) {
    std::string_view key;
    int64_t id;
    if (field.unescaped_key().get(key) || field.value().get_int64().get(id))
      return json_error("every entry must be \"token\": integer id");
    ++entries;
    if (key == kEndOfText) {
      if (id != static_cast<int64_t>(tokens.size())) {
        return json_error(absl::StrCat("<|endoftext|> has id ", id, ", expected ", tokens.size(),
                                       " (one past the merges)"));
      }
      has_eod = true;
      continue;
    }
    absl::StatusOr<std::string> bytes = DecodeTokenString(key);
    if (!bytes.ok()) return json_error(std::string(bytes.status().message()));
    const auto it = rank_of.find(*bytes);
    if (it == rank_of.end()) {
      return json_error(absl::StrFormat("token \"%s\" (id %d) is not made by %s: mismatched files",
                                        absl::CHexEscape(std::string(key)), id, merges_txt));
    }
    if (it->second != id) {
      return json_error(
          absl::StrFormat("token \"%s\" has id %d but %s gives it rank %d: mismatched files",
                          absl::CHexEscape(std::string(key)), id, merges_txt, it->second));
    }
  }
  if (entries != tokens.size() + (has_eod ? 1 : 0)) {
    return json_error(absl::StrFormat("has %d tokens but %s makes %d: mismatched files", entries,
                                      merges_txt, tokens.size()));
  }
  return FromTokens(std::move(tokens));
}

std::string BpeVocab::ToEncoderJson() const {
  // Python's json.dumps(ensure_ascii=True) of {token: id}, in id order.
  std::string out = "{";
  const auto append_key = [&](std::string_view utf8) {
    out += '"';
    size_t i = 0;
    while (i < utf8.size()) {
      const uint8_t b0 = static_cast<uint8_t>(utf8[i]);
      uint32_t cp = b0;
      size_t len = 1;
      if (b0 >= 0xC0) {
        cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(utf8[i + 1]) & 0x3Fu);
        len = 2;
      }
      if (cp == '"') {
        out += "\\\"";
      } else if (cp == '\\') {
        out += "\\\\";
      } else if (cp < 0x20 || cp >= 0x7F) {
        out += absl::StrFormat("\\u%04x", cp);
      } else {
        out += static_cast<char>(cp);
      }
      i += len;
    }
    out += '"';
  };
  for (int32_t r = 0; r <= num_ranks(); ++r) {
    if (r > 0) out += ", ";
    append_key(r < num_ranks() ? EncodeTokenString(TokenBytes(r)) : std::string(kEndOfText));
    absl::StrAppend(&out, ": ", r);
  }
  out += "}";
  return out;
}

absl::StatusOr<std::string> BpeVocab::ToMergesText() const {
  // Token r (r >= 256) is the merge of the two parts that BPE with ranks below r leaves.
  std::string out = "#version: 0.2\n";
  std::vector<int32_t> parts;
  for (int32_t r = 256; r < num_ranks(); ++r) {
    const std::string_view t = TokenBytes(r);
    parts.clear();
    BytePairEncode(*this, reinterpret_cast<const uint8_t*>(t.data()), t.size(), &parts, r);
    if (parts.size() != 2) {
      return absl::FailedPreconditionError(
          absl::StrFormat("token %d (\"%s\") is not the merge of two earlier tokens", r,
                          absl::CHexEscape(std::string(t))));
    }
    absl::StrAppend(&out, EncodeTokenString(TokenBytes(parts[0])), " ",
                    EncodeTokenString(TokenBytes(parts[1])), "\n");
  }
  return out;
}

std::string BpeVocab::ToTiktokenText() const {
  std::string out;
  for (int32_t r = 0; r < num_ranks(); ++r)
    absl::StrAppend(&out, absl::Base64Escape(std::string(TokenBytes(r))), " ", r, "\n");
  return out;
}

absl::Status ExportVocabFiles(const BpeVocab& vocab, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create: ", ec.message()));
  absl::StatusOr<std::string> merges = vocab.ToMergesText();
  if (!merges.ok()) return merges.status();
  if (absl::Status st = fs::WriteFileAtomically(dir + "/vocab.bpe", *merges); !st.ok()) return st;
  if (absl::Status st = fs::WriteFileAtomically(dir + "/encoder.json", vocab.ToEncoderJson());
      !st.ok())
    return st;
  return fs::WriteFileAtomically(dir + "/gpt2.tiktoken", vocab.ToTiktokenText());
}

}  // namespace leantron::data
