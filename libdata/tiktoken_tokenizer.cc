#include "libdata/tiktoken_tokenizer.h"

#include <simdjson.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "libdata/added_tokens.h"
#include "libdata/bpe_merge.h"
#include "libdata/bpe_vocab.h"
#include "libfs/atomic_file.h"
#include "libdata/pretokenize_fast.h"
#include "libdata/regex_engine.h"
#include "libdata/string_compat.h"

namespace leantron::data {
namespace {

constexpr char kV1[] =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr char kV2[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kR50k[] =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
constexpr char kCl100k[] =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";
constexpr char kO200k[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kLlama3[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* const kMegatronSpecials[] = {"<unk>", "<s>",   "</s>", "<mask>",
                                         "<pad>", "<cls>", "<sep>"};

std::string Canonical(std::string_view name) {
  if (name == "r50k_base") return "gpt2";
  if (name == "cl100k") return "cl100k_base";
  if (name == "o200k") return "o200k_base";
  return std::string(name);
}

// Megatron's tokenizer JSON: [{"rank": i, "token_bytes": base64, "token_str": ...}, ...].
absl::StatusOr<std::vector<std::string>> ReadMegatronJson(const std::string& path,
                                                          std::string_view text) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::array items;
  if (parser.parse(simdjson::padded_string(text)).get(doc) || doc.get_array().get(items))
    return absl::InvalidArgumentError(Cat(path, ": not a JSON list of tokens"));
  std::vector<std::string> tokens;
  tokens.reserve(items.size());
  for (simdjson::dom::element item : items) {
    const size_t i = tokens.size();
    simdjson::dom::object obj;
    int64_t rank;
    std::string_view b64, str;
    if (item.get_object().get(obj) || obj.size() != 3 || obj["rank"].get_int64().get(rank) ||
        obj["token_bytes"].get_string().get(b64) || obj["token_str"].get_string().get(str)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: entry %d: expected {\"rank\", \"token_bytes\", \"token_str\"}", path, i));
    }
    if (rank != static_cast<int64_t>(i))
      return absl::InvalidArgumentError(absl::StrFormat("%s: entry %d has rank %d", path, i, rank));
    std::string bytes;
    if (!absl::Base64Unescape(ToAbsl(b64), &bytes) || bytes.empty())
      return absl::InvalidArgumentError(absl::StrFormat("%s: entry %d: bad token_bytes", path, i));
    if (i < 256 && bytes != std::string(1, static_cast<char>(i))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: entry %d must be the single byte %d", path, i, i));
    }
    tokens.push_back(std::move(bytes));
  }
  return tokens;
}

struct Scheme {
  std::string pattern_name;
  bool megatron = false;
  std::vector<std::pair<std::string, int32_t>> specials;  // text, id
  int32_t rank_offset = 0;
  int64_t vocab_size = 0;
  int32_t eod = -1;
};

class TiktokenTokenizer;

class TiktokenEncoder : public TextEncoder {
 public:
  TiktokenEncoder(const TiktokenTokenizer& t, const EncodeOptions& options);
  absl::Status Encode(std::string_view text, std::vector<int32_t>* out) override;

 private:
  absl::Status EncodeOrdinary(std::string_view text, std::vector<int32_t>* out);
  void EncodePiece(const uint8_t* p, size_t n, std::vector<int32_t>* out);
  void EncodeSegment(const uint8_t* p, size_t n, std::vector<int32_t>* out);

  const TiktokenTokenizer& t_;
  const EncodeOptions options_;
  std::unique_ptr<FastPreTokenizer> fast_;
  std::unique_ptr<RegexMatcher> matcher_;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;
  std::vector<int32_t> scratch_;
};

class TiktokenTokenizer : public Tokenizer {
 public:
  TiktokenTokenizer(BpeVocab vocab, Scheme scheme, std::unique_ptr<Regex> regex, FastPattern fast,
                    std::string source)
      : vocab_(std::move(vocab)),
        scheme_(std::move(scheme)),
        regex_(std::move(regex)),
        fast_(fast),
        source_(std::move(source)) {
    for (const auto& [text, id] : scheme_.specials) {
      matcher_.Add(text, id);
      special_text_[id] = text;
    }
  }

  std::unique_ptr<TextEncoder> NewEncoder(const EncodeOptions& options) const override {
    return std::make_unique<TiktokenEncoder>(*this, options);
  }
  absl::Status Decode(absl::Span<const int32_t> ids, std::string* out) const override {
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t rank = int64_t{ids[i]} - scheme_.rank_offset;
      if (const auto it = special_text_.find(ids[i]); it != special_text_.end()) {
        out->append(it->second);
      } else if (rank >= 0 && rank < vocab_.num_ranks()) {
        out->append(vocab_.TokenBytes(static_cast<int32_t>(rank)));
      } else {
        return absl::OutOfRangeError(absl::StrFormat(
            "id %d at position %d is outside the vocabulary of %s", ids[i], i, source_));
      }
    }
    return absl::OkStatus();
  }
  int64_t vocab_size() const override { return scheme_.vocab_size; }
  std::optional<int32_t> eod_id() const override { return scheme_.eod; }
  EncodeOptions megatron_defaults() const override { return {true, false}; }
  std::string Describe() const override {
    return absl::StrFormat("TikTokenizer %s (pattern %s, %d ranks, vocab size %d, EOD %d)", source_,
                           scheme_.pattern_name, vocab_.num_ranks(), scheme_.vocab_size,
                           scheme_.eod);
  }

  // Every named pattern starts a piece at a space after a non-space; special tokens must not
  // hold such a space themselves.
  bool SplitsAtSpaces() const override {
    for (const auto& [text, id] : scheme_.specials) {
      if (text.find(' ', 1) != std::string::npos) return false;
    }
    return true;
  }
  bool DecodesPartByPart() const override { return true; }

  const BpeVocab& vocab() const { return vocab_; }
  const Scheme& scheme() const { return scheme_; }
  const Regex& regex() const { return *regex_; }
  FastPattern fast() const { return fast_; }
  const TokenMatcher& matcher() const { return matcher_; }

 private:
  BpeVocab vocab_;
  Scheme scheme_;
  std::unique_ptr<Regex> regex_;
  FastPattern fast_;
  std::string source_;
  TokenMatcher matcher_;
  absl::flat_hash_map<int32_t, std::string> special_text_;
};

TiktokenEncoder::TiktokenEncoder(const TiktokenTokenizer& t, const EncodeOptions& options)
    : t_(t), options_(options) {
  if (t.fast() != FastPattern::kNone) {
    fast_ = std::make_unique<FastPreTokenizer>(t.fast());
  } else {
    matcher_ = std::make_unique<RegexMatcher>(t.regex());
  }
}

void TiktokenEncoder::EncodePiece(const uint8_t* p, size_t n, std::vector<int32_t>* out) {
  const BpeVocab& vocab = t_.vocab();
  const int32_t rank = vocab.Rank(p, n);
  if (rank >= 0) {
    out->push_back(rank + t_.scheme().rank_offset);
    return;
  }
  if (n < kBpeCutThreshold) return EncodeSegment(p, n, out);
  // As Gpt2Encoder: long pieces are merged (and cached) segment by segment.
  ForEachMergeSegment(vocab, p, n, [&](const uint8_t* s, size_t len) {
    const int32_t r = len == n ? -1 : vocab.Rank(s, len);
    if (r >= 0) {
      out->push_back(r + t_.scheme().rank_offset);
    } else {
      EncodeSegment(s, len, out);
    }
  });
}

void TiktokenEncoder::EncodeSegment(const uint8_t* p, size_t n, std::vector<int32_t>* out) {
  const int32_t offset = t_.scheme().rank_offset;
  if (n == 1) {
    out->push_back(t_.vocab().ByteRank(p[0]) + offset);
    return;
  }
  const bool cacheable = n <= 128;
  const absl::string_view key(reinterpret_cast<const char*>(p), n);
  if (cacheable) {
    if (auto it = cache_.find(key); it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  scratch_.clear();
  BytePairEncode(t_.vocab(), p, n, &scratch_);
  for (int32_t& id : scratch_) id += offset;
  out->insert(out->end(), scratch_.begin(), scratch_.end());
  if (cacheable) {
    if (cache_.size() >= (1 << 17)) cache_.clear();
    cache_.emplace(key, scratch_);
  }
}

absl::Status TiktokenEncoder::EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) {
  // Valid UTF-8 runs through the pattern; an invalid byte is its own piece.
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* end = p + text.size();
  while (p < end) {
    const uint8_t* q = p;
    uint32_t cp;
    while (q < end) {
      if (*q < 0x80) {
        ++q;
        continue;
      }
      const int len = DecodeUtf8(q, end, &cp);
      if (len == 0) break;
      q += len;
    }
    if (fast_) {
      for (const uint8_t* r = p; r < q;) {
        const size_t n = fast_->PieceLength(r, q);
        EncodePiece(r, n, out);
        r += n;
      }
    } else if (q > p) {
      // tiktoken encodes the matches only (the named patterns match every character).
      absl::Status st =
          matcher_->FindMatches(std::string_view(reinterpret_cast<const char*>(p), q - p),
                                [&](size_t s, size_t e, bool is_match) {
                                  if (is_match && e > s) EncodePiece(p + s, e - s, out);
                                });
      if (!st.ok()) return st;
    }
    if (q < end) {
      out->push_back(t_.vocab().ByteRank(*q) + t_.scheme().rank_offset);
      ++q;
    }
    p = q;
  }
  return absl::OkStatus();
}

absl::Status TiktokenEncoder::Encode(std::string_view text, std::vector<int32_t>* out) {
  if (!options_.allow_special || t_.matcher().empty()) return EncodeOrdinary(text, out);
  size_t from = 0;
  TokenMatcher::Match m;
  while (t_.matcher().FindNext(text, from, &m)) {
    if (absl::Status st = EncodeOrdinary(text.substr(from, m.start - from), out); !st.ok())
      return st;
    out->push_back(m.value);
    from = m.end;
  }
  return EncodeOrdinary(text.substr(from), out);
}

absl::StatusOr<Scheme> MakeScheme(const TokenizerOptions& o, const std::string& pattern_name,
                                  bool json_file, int32_t num_ranks) {
  Scheme s;
  s.pattern_name = pattern_name;
  if (pattern_name == "v1" || pattern_name == "v2") {
    s.megatron = true;
    std::vector<std::string> specials = o.special_tokens;
    if (specials.empty())
      specials.assign(std::begin(kMegatronSpecials), std::end(kMegatronSpecials));
    const int64_t num_special = o.tiktoken_num_special_tokens;
    s.vocab_size = o.vocab_size > 0 ? o.vocab_size : 131072;
    if (static_cast<int64_t>(specials.size()) > num_special || num_special >= s.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "TikTokenizer needs %d special tokens <= --tiktoken-num-special-tokens %d < "
          "--vocab-size %d",
          specials.size(), num_special, s.vocab_size));
    }
    for (const char* required : kMegatronSpecials) {
      if (std::find(specials.begin(), specials.end(), required) == specials.end())
        return absl::InvalidArgumentError(
            Cat("--tokenizer-special-tokens must include ", required, " (Megatron's rule)"));
    }
    for (int64_t i = static_cast<int64_t>(specials.size()); i < num_special; ++i)
      specials.push_back(absl::StrFormat("<SPECIAL_%d>", i));
    absl::flat_hash_map<std::string, int32_t> seen;
    for (size_t i = 0; i < specials.size(); ++i) {
      if (!seen.emplace(specials[i], static_cast<int32_t>(i)).second)
        return absl::InvalidArgumentError(Cat("special token ", specials[i], " is repeated"));
      s.specials.emplace_back(specials[i], static_cast<int32_t>(i));
    }
    s.rank_offset = static_cast<int32_t>(num_special);
    s.eod = seen["</s>"];
    if (num_ranks < s.vocab_size - num_special) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the rank file has %d tokens but --vocab-size %d leaves room for %d",
                          num_ranks, s.vocab_size, s.vocab_size - num_special));
    }
    return s;
  }
  if (json_file) {
    return absl::InvalidArgumentError(Cat("--tiktoken-pattern ", pattern_name,
                                          " is for .tiktoken rank files; Megatron's JSON list "
                                          "takes v1 or v2"));
  }
  // tiktoken's named encodings put their special tokens at fixed ids; a rank file of another size
  // works as tiktoken.Encoding(mergeable_ranks=..., special_tokens=...) would, unless the ids
  // collide.
  const auto fixed = [&](std::vector<std::pair<std::string, int32_t>> specials,
                         const std::string& eod) -> absl::StatusOr<Scheme> {
    s.specials = std::move(specials);
    int32_t max_id = num_ranks - 1;
    for (const auto& [text, id] : s.specials) {
      if (id < num_ranks) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the %s special token %s has id %d, which the file's %d ranks already use",
            pattern_name, text, id, num_ranks));
      }
      max_id = std::max(max_id, id);
      if (text == eod) s.eod = id;
    }
    s.vocab_size = max_id + 1;
    return s;
  };
  if (pattern_name == "gpt2") return fixed({{"<|endoftext|>", 50256}}, "<|endoftext|>");
  if (pattern_name == "cl100k_base") {
    return fixed({{"<|endoftext|>", 100257},
                  {"<|fim_prefix|>", 100258},
                  {"<|fim_middle|>", 100259},
                  {"<|fim_suffix|>", 100260},
                  {"<|endofprompt|>", 100276}},
                 "<|endoftext|>");
  }
  if (pattern_name == "o200k_base") {
    return fixed({{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}, "<|endoftext|>");
  }
  // Llama 3.1's tokenizer.py: 11 named tokens, then reserved ones, 256 in all after the ranks.
  std::vector<std::string> names = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>",
                                    "<|finetune_right_pad_id|>",
                                    "<|step_id|>",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|eom_id|>",
                                    "<|eot_id|>",
                                    "<|python_tag|>"};
  for (int i = 0; names.size() < 256; ++i)
    names.push_back(absl::StrFormat("<|reserved_special_token_%d|>", 2 + i));
  std::vector<std::pair<std::string, int32_t>> specials;
  for (size_t i = 0; i < names.size(); ++i)
    specials.emplace_back(names[i], num_ranks + static_cast<int32_t>(i));
  return fixed(std::move(specials), "<|end_of_text|>");
}

}  // namespace

std::string TiktokenPattern(std::string_view name) {
  const std::string n = Canonical(name);
  if (n == "v1") return kV1;
  if (n == "v2") return kV2;
  if (n == "gpt2") return kR50k;
  if (n == "cl100k_base") return kCl100k;
  if (n == "o200k_base") return kO200k;
  if (n == "llama3") return kLlama3;
  return "";
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTiktokenTokenizer(const TokenizerOptions& o) {
  if (o.model.empty()) return absl::InvalidArgumentError("TikTokenizer needs --tokenizer-model");
  absl::StatusOr<std::string> text = fs::ReadFileToString(o.model);
  if (!text.ok()) return text.status();
  return TiktokenTokenizerFromText(*text, o);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TiktokenTokenizerFromText(std::string_view file_text,
                                                                     const TokenizerOptions& o) {
  const size_t first = file_text.find_first_not_of(" \t\r\n");
  const bool json_file = first != std::string::npos && file_text[first] == '[';
  const std::string pattern_name =
      Canonical(o.tiktoken_pattern.empty() ? (json_file ? "v2" : "") : o.tiktoken_pattern);
  if (pattern_name.empty()) {
    return absl::InvalidArgumentError(
        "a .tiktoken rank file needs --tiktoken-pattern (gpt2, cl100k_base, o200k_base, llama3, "
        "or Megatron's v1/v2)");
  }
  const std::string pattern = TiktokenPattern(pattern_name);
  if (pattern.empty()) {
    return absl::InvalidArgumentError(Cat("unknown --tiktoken-pattern ", o.tiktoken_pattern,
                                          " (v1, v2, gpt2, cl100k_base, o200k_base or llama3)"));
  }
  absl::StatusOr<BpeVocab> vocab;
  if (json_file) {
    absl::StatusOr<std::vector<std::string>> tokens = ReadMegatronJson(o.model, file_text);
    if (!tokens.ok()) return tokens.status();
    // Megatron keeps the first vocab_size - num_special ranks.
    const int64_t vocab_size = o.vocab_size > 0 ? o.vocab_size : 131072;
    const int64_t keep = vocab_size - o.tiktoken_num_special_tokens;
    if (keep > 0 && static_cast<int64_t>(tokens->size()) > keep) tokens->resize(keep);
    vocab = BpeVocab::FromTokens(*std::move(tokens));
    if (!vocab.ok())
      return absl::InvalidArgumentError(Cat(o.model, ": ", vocab.status().message()));
  } else {
    vocab = BpeVocab::FromTiktokenText(file_text, o.model);
  }
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<Scheme> scheme = MakeScheme(o, pattern_name, json_file, vocab->num_ranks());
  if (!scheme.ok())
    return absl::Status(scheme.status().code(), Cat(o.model, ": ", scheme.status().message()));
  if (scheme->megatron && vocab->num_ranks() > scheme->vocab_size - scheme->rank_offset) {
    // A .tiktoken file with Megatron's scheme is cut like its JSON list.
    std::vector<std::string> tokens;
    for (int64_t r = 0; r < scheme->vocab_size - scheme->rank_offset; ++r)
      tokens.emplace_back(vocab->TokenBytes(static_cast<int32_t>(r)));
    vocab = BpeVocab::FromTokens(std::move(tokens));
    if (!vocab.ok()) return vocab.status();
  }
  absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(pattern, RegexDialect::kRust);
  if (!regex.ok()) return regex.status();
  return std::unique_ptr<Tokenizer>(
      new TiktokenTokenizer(*std::move(vocab), *std::move(scheme), *std::move(regex),
                            RecognizeFastPattern(pattern, RegexDialect::kRust), o.model));
}

}  // namespace leantron::data
