#include "libdata/hf_tokenizer.h"

#include <filesystem>
#include <functional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "libfs/atomic_file.h"
#include "libdata/hf_decode.h"
#include "libdata/hf_text_ops.h"
#include "libdata/string_compat.h"
#include "libdata/unicode_class.h"

namespace leantron::data {
namespace {

class HfTokenizer;

class HfEncoder : public TextEncoder {
 public:
  HfEncoder(const HfTokenizer& tokenizer, const EncodeOptions& options);
  absl::Status Encode(std::string_view text, std::vector<int32_t>* out) override;

 private:
  absl::Status EncodeRun(std::string_view run, bool at_text_start);
  absl::Status EncodeSegment(std::string_view segment, bool at_start);
  // Extracts added tokens found by `matcher` from text; calls on_text for the text between them.
  absl::Status SplitAddedTokens(
      std::string_view text, const TokenMatcher& matcher,
      const std::function<absl::Status(std::string_view, size_t)>& on_text);
  absl::Status RunStep(size_t k, std::string_view piece, bool at_start);
  absl::Status SplitRanges(size_t k, std::string_view piece, std::vector<Range>* ranges);

  const HfTokenizer& t_;
  const EncodeOptions options_;
  HfBpeWorkspace bpe_;
  std::vector<std::unique_ptr<RegexMatcher>> step_matchers_, normalizer_matchers_;
  std::vector<std::unique_ptr<FastPreTokenizer>> step_fast_;
  std::vector<std::string> step_buffers_;
  std::vector<std::vector<Range>> step_ranges_;
  std::string normalized_[2];
  std::vector<int32_t>* out_ = nullptr;
};

class HfTokenizer : public Tokenizer {
 public:
  // Computes the added tokens' normalized forms, their matchers, the vocabulary size and EOD.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Create(HfTokenizerSpec spec);

  std::unique_ptr<TextEncoder> NewEncoder(const EncodeOptions& options) const override {
    return std::make_unique<HfEncoder>(*this, options);
  }
  absl::Status Decode(absl::Span<const int32_t> ids, std::string* out) const override {
    return HfDecode(s_, added_strings_, ids, out);
  }
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eod_id() const override { return eod_; }
  EncodeOptions megatron_defaults() const override { return {true, true}; }
  std::string Describe() const override {
    return absl::StrFormat("HuggingFaceTokenizer %s (BPE%s, vocab size %d, EOD %s)", s_.source,
                           s_.model->settings().byte_level ? ", byte-level" : "", vocab_size_,
                           eod_ ? absl::StrCat(*eod_) : "none");
  }

  void SpecialTokensAround(std::vector<int32_t>* prefix,
                           std::vector<int32_t>* suffix) const override {
    *prefix = s_.prefix;
    *suffix = s_.suffix;
  }
  bool SplitsAtSpaces() const override {
    // Normalizers that add or remove text at the start of each part, pre-tokenizers other than
    // the hand-written ones (isolated pieces) and Digits, and added tokens holding a space
    // after other text all break the rule.
    for (const HfNormalizer& n : s_.normalizers) {
      if (n.kind != HfNormalizer::Kind::kUnicode) return false;
    }
    for (const HfPreTokenizer& p : s_.pre_tokenizers) {
      switch (p.kind) {
        case HfPreTokenizer::Kind::kDigits:
          break;
        case HfPreTokenizer::Kind::kByteLevel:
          if (p.regex == nullptr) break;
          [[fallthrough]];
        case HfPreTokenizer::Kind::kSplit:
          if (p.fast == FastPattern::kNone || p.invert || p.behavior != SplitBehavior::kIsolated)
            return false;
          break;
        case HfPreTokenizer::Kind::kMetaspace:
          return false;
      }
    }
    if (s_.pre_tokenizers.empty()) return false;
    for (const HfAddedToken& a : s_.added) {
      if (a.content.find(' ', 1) != std::string::npos || a.lstrip || a.rstrip || a.single_word)
        return false;
    }
    return true;
  }
  bool DecodesPartByPart() const override {
    if (!s_.has_decoder) return false;
    for (const HfDecoder& d : s_.decoders) {
      if (d.kind == HfDecoder::Kind::kStrip || d.kind == HfDecoder::Kind::kMetaspace) return false;
    }
    return true;
  }

  const HfTokenizerSpec& spec() const { return s_; }
  const TokenMatcher& raw_matcher() const { return raw_; }
  const TokenMatcher& normalized_matcher() const { return normalized_; }

 private:
  HfTokenizer() = default;
  HfTokenizerSpec s_;
  std::vector<std::string> normalized_content_;
  std::vector<std::string> added_strings_;  // what decoding shows for each added token
  TokenMatcher raw_, normalized_;
  int64_t vocab_size_ = 0;
  std::optional<int32_t> eod_;
};

HfEncoder::HfEncoder(const HfTokenizer& tokenizer, const EncodeOptions& options)
    : t_(tokenizer), options_(options), bpe_(*tokenizer.spec().model) {
  const HfTokenizerSpec& s = t_.spec();
  for (const HfPreTokenizer& step : s.pre_tokenizers) {
    step_fast_.push_back(
        step.fast != FastPattern::kNone ? std::make_unique<FastPreTokenizer>(step.fast) : nullptr);
    step_matchers_.push_back(step.regex && step.fast == FastPattern::kNone
                                 ? std::make_unique<RegexMatcher>(*step.regex)
                                 : nullptr);
  }
  for (const HfNormalizer& n : s.normalizers) {
    normalizer_matchers_.push_back(n.regex ? std::make_unique<RegexMatcher>(*n.regex) : nullptr);
  }
  step_buffers_.resize(s.pre_tokenizers.size());
  step_ranges_.resize(s.pre_tokenizers.size());
}

absl::Status HfEncoder::Encode(std::string_view text, std::vector<int32_t>* out) {
  out_ = out;
  const HfTokenizerSpec& s = t_.spec();
  if (options_.add_special) out->insert(out->end(), s.prefix.begin(), s.prefix.end());
  // Valid UTF-8 runs are encoded as texts of their own; each invalid byte as a byte token.
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* end = p + text.size();
  const uint8_t* run = p;
  while (run < end) {
    const uint8_t* q = run;
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
    if (q > run) {
      if (absl::Status st =
              EncodeRun(std::string_view(reinterpret_cast<const char*>(run), q - run), run == p);
          !st.ok())
        return st;
    }
    if (q < end) {
      const HfBpeModel& m = *s.model;
      int32_t id = m.settings().byte_level ? m.Find(q, 1) : -1;
      if (id < 0 && m.settings().byte_fallback) id = m.FindString(absl::StrFormat("<0x%02X>", *q));
      if (id < 0 && !m.settings().unk_token.empty()) id = m.FindString(m.settings().unk_token);
      if (id < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "byte %d of the text (0x%02X) is not valid UTF-8 and %s has no token for it", q - p, *q,
            s.source));
      }
      out->push_back(id);
      ++q;
    }
    run = q;
  }
  if (options_.add_special) out->insert(out->end(), s.suffix.begin(), s.suffix.end());
  return absl::OkStatus();
}

absl::Status HfEncoder::SplitAddedTokens(
    std::string_view text, const TokenMatcher& matcher,
    const std::function<absl::Status(std::string_view, size_t)>& on_text) {
  // HF's AddedVocabulary::find_matches: non-overlapping leftmost-longest matches; a special
  // token is skipped when special tokens are not allowed, a single_word token that touches a
  // word character is skipped, lstrip/rstrip take the white space beside the token.
  const std::vector<HfAddedToken>& added = t_.spec().added;
  size_t from = 0, start_offset = 0;
  TokenMatcher::Match m;
  while (matcher.FindNext(text, from, &m)) {
    from = m.end;
    const HfAddedToken& tok = added[m.value];
    size_t start = m.start, stop = m.end;
    if (tok.special && !options_.allow_special) continue;
    if (tok.single_word) {
      int len;
      const bool start_space = start == 0 || !IsWordChar(LastChar(text.substr(0, start)));
      const bool stop_space =
          stop == text.size() || !IsWordChar(FirstChar(text.substr(stop), &len));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        const std::string_view before = text.substr(0, s);
        const uint32_t cp = LastChar(before);
        if (!IsUnicodeWhiteSpace(cp)) break;
        s -= cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        int len;
        if (!IsUnicodeWhiteSpace(FirstChar(text.substr(stop), &len))) break;
        stop += static_cast<size_t>(len);
      }
    }
    if (start_offset < start) {
      if (absl::Status st = on_text(text.substr(start_offset, start - start_offset), start_offset);
          !st.ok())
        return st;
    }
    out_->push_back(tok.id);
    start_offset = stop;
    from = std::max(from, stop);
  }
  if (start_offset < text.size()) return on_text(text.substr(start_offset), start_offset);
  return absl::OkStatus();
}

absl::Status HfEncoder::EncodeRun(std::string_view run, bool at_text_start) {
  if (t_.raw_matcher().empty()) return EncodeSegment(run, at_text_start);
  return SplitAddedTokens(run, t_.raw_matcher(), [&](std::string_view seg, size_t offset) {
    return EncodeSegment(seg, at_text_start && offset == 0);
  });
}

absl::Status HfEncoder::EncodeSegment(std::string_view segment, bool at_start) {
  std::string_view text = segment;
  if (!t_.spec().normalizers.empty()) {
    if (absl::Status st = ApplyNormalizers(t_.spec().normalizers, &normalizer_matchers_, segment,
                                           &normalized_[0], &at_start);
        !st.ok())
      return st;
    text = normalized_[0];
  }
  if (t_.normalized_matcher().empty()) return RunStep(0, text, at_start);
  // The normalized text outlives this call's uses: normalized_[0] is rewritten only by the next
  // segment.
  return SplitAddedTokens(text, t_.normalized_matcher(), [&](std::string_view seg, size_t offset) {
    return RunStep(0, seg, at_start && offset == 0);
  });
}

absl::Status HfEncoder::SplitRanges(size_t k, std::string_view piece, std::vector<Range>* ranges) {
  ranges->clear();
  const HfPreTokenizer& step = t_.spec().pre_tokenizers[k];
  if (step_fast_[k]) {
    const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
    const uint8_t* end = p + piece.size();
    if (piece.empty()) ranges->push_back({0, 0, false});
    for (const uint8_t* q = p; q < end;) {
      const size_t n = step_fast_[k]->PieceLength(q, end);
      ranges->push_back({static_cast<size_t>(q - p), static_cast<size_t>(q - p) + n, true});
      q += n;
    }
  } else {
    absl::Status st = step_matchers_[k]->FindMatches(piece, [&](size_t s, size_t e, bool m) {
      ranges->push_back({s, e, m});
    });
    if (!st.ok()) return st;
  }
  if (step.invert) {
    for (Range& r : *ranges) r.is_match = !r.is_match;
  }
  return absl::OkStatus();
}

absl::Status HfEncoder::RunStep(size_t k, std::string_view piece, bool at_start) {
  const std::vector<HfPreTokenizer>& steps = t_.spec().pre_tokenizers;
  if (k == steps.size()) {
    if (!piece.empty()) {
      bpe_.EncodePiece(reinterpret_cast<const uint8_t*>(piece.data()), piece.size(), out_);
    }
    return absl::OkStatus();
  }
  const HfPreTokenizer& step = steps[k];
  std::string& buffer = step_buffers_[k];
  std::vector<Range>& ranges = step_ranges_[k];
  absl::Status status;
  // Sub-pieces of `text` that are not empty go to the next step.
  const auto emit_from = [&](std::string_view text) {
    return [&, text](size_t s, size_t e) {
      if (status.ok() && e > s) status = RunStep(k + 1, text.substr(s, e - s), at_start && s == 0);
    };
  };
  switch (step.kind) {
    case HfPreTokenizer::Kind::kSplit: {
      if (step_fast_[k] && !step.invert && step.behavior == SplitBehavior::kIsolated) {
        // The common case (Llama 3, Qwen2): pieces straight from the state machine.
        const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
        const uint8_t* end = p + piece.size();
        for (const uint8_t* q = p; q < end;) {
          const size_t n = step_fast_[k]->PieceLength(q, end);
          if (absl::Status st = RunStep(k + 1, piece.substr(q - p, n), at_start && q == p);
              !st.ok())
            return st;
          q += n;
        }
        return absl::OkStatus();
      }
      if (absl::Status st = SplitRanges(k, piece, &ranges); !st.ok()) return st;
      ApplyBehavior(step.behavior, ranges, emit_from(piece));
      return status;
    }
    case HfPreTokenizer::Kind::kByteLevel: {
      std::string_view text = piece;
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        buffer.assign(" ");
        buffer.append(piece);
        text = buffer;
      }
      if (!step.regex) return RunStep(k + 1, text, at_start);
      if (step_fast_[k]) {
        const auto* p = reinterpret_cast<const uint8_t*>(text.data());
        const uint8_t* end = p + text.size();
        for (const uint8_t* q = p; q < end;) {
          const size_t n = step_fast_[k]->PieceLength(q, end);
          if (absl::Status st = RunStep(k + 1, text.substr(q - p, n), at_start && q == p); !st.ok())
            return st;
          q += n;
        }
        return absl::OkStatus();
      }
      if (absl::Status st = SplitRanges(k, text, &ranges); !st.ok()) return st;
      ApplyBehavior(SplitBehavior::kIsolated, ranges, emit_from(text));
      return status;
    }
    case HfPreTokenizer::Kind::kDigits: {
      ranges.clear();
      const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
      const uint8_t* end = p + piece.size();
      const CharClass* table = CodePointClassTable();
      size_t last = 0;
      for (const uint8_t* q = p; q < end;) {
        uint32_t cp;
        int len = DecodeUtf8(q, end, &cp);
        if (len == 0) len = 1, cp = 0xFFFD;
        const size_t at = static_cast<size_t>(q - p);
        if (table[cp] == CharClass::kNumber) {
          if (last < at) ranges.push_back({last, at, false});
          ranges.push_back({at, at + len, true});
          last = at + len;
        }
        q += len;
      }
      if (last < piece.size()) ranges.push_back({last, piece.size(), false});
      ApplyBehavior(step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                    ranges, emit_from(piece));
      return status;
    }
    case HfPreTokenizer::Kind::kMetaspace: {
      buffer.clear();
      for (char c : piece) {
        if (c == ' ') {
          buffer += step.replacement;
        } else {
          buffer.push_back(c);
        }
      }
      const bool starts = buffer.compare(0, step.replacement.size(), step.replacement) == 0;
      if (!starts && (step.prepend == HfPreTokenizer::Prepend::kAlways ||
                      (step.prepend == HfPreTokenizer::Prepend::kFirst && at_start))) {
        buffer.insert(0, step.replacement);
      }
      const std::string_view text = buffer;
      if (!step.split) return RunStep(k + 1, text, at_start);
      ranges.clear();
      size_t last = 0;
      for (size_t at = text.find(step.replacement); at != std::string_view::npos;
           at = text.find(step.replacement, at + step.replacement.size())) {
        if (last < at) ranges.push_back({last, at, false});
        ranges.push_back({at, at + step.replacement.size(), true});
        last = at + step.replacement.size();
      }
      if (last < text.size()) ranges.push_back({last, text.size(), false});
      ApplyBehavior(SplitBehavior::kMergedWithNext, ranges, emit_from(text));
      return status;
    }
  }
  return status;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Create(HfTokenizerSpec spec) {
  // Normalized added tokens are matched in normalized text, by their normalized form.
  std::vector<std::string> normalized(spec.added.size());
  for (size_t i = 0; i < spec.added.size(); ++i) {
    const HfAddedToken& a = spec.added[i];
    normalized[i] = a.content;
    if (!a.normalized || spec.normalizers.empty()) continue;
    bool ignored = true;
    std::string out;
    if (absl::Status st = ApplyNormalizers(spec.normalizers, nullptr, a.content, &out, &ignored);
        !st.ok())
      return st;
    normalized[i] = out;
  }
  // The post-processor's ids must be tokens (HF would emit ids that decode to nothing).
  for (const std::vector<int32_t>* ids : {&spec.prefix, &spec.suffix}) {
    for (int32_t id : *ids) {
      bool known = spec.model->TokenString(id) != nullptr;
      for (const HfAddedToken& a : spec.added) known = known || a.id == id;
      if (!known) {
        return absl::InvalidArgumentError(
            Cat(spec.source, ": post_processor: id ", id, " is not in the vocabulary"));
      }
    }
  }
  std::optional<int32_t> eod;
  if (spec.eos_token) {
    int32_t id = -1;
    for (const HfAddedToken& a : spec.added)
      if (a.content == *spec.eos_token) id = a.id;
    if (id < 0) id = spec.model->FindString(*spec.eos_token);
    if (id < 0) {
      return absl::InvalidArgumentError(Cat(spec.source, ": tokenizer_config.json's eos_token \"",
                                            *spec.eos_token, "\" is not a token"));
    }
    eod = id;
  }
  auto t = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  t->s_ = std::move(spec);
  t->normalized_content_ = std::move(normalized);
  for (size_t i = 0; i < t->s_.added.size(); ++i) {
    const bool use_normalized = t->s_.added[i].normalized && !t->s_.normalizers.empty();
    t->added_strings_.push_back(use_normalized ? t->normalized_content_[i]
                                               : t->s_.added[i].content);
  }
  t->eod_ = eod;
  absl::flat_hash_set<std::string> extra;
  for (size_t i = 0; i < t->s_.added.size(); ++i) {
    const HfAddedToken& a = t->s_.added[i];
    // Two passes, as HF: non-normalized tokens in the raw text first, then normalized ones in
    // what is left (after normalizing it, when there is a normalizer).
    (a.normalized ? t->normalized_ : t->raw_)
        .Add(a.normalized ? t->normalized_content_[i] : a.content, static_cast<int32_t>(i));
    if (t->s_.model->FindString(a.content) < 0) extra.insert(a.content);
  }
  t->vocab_size_ = static_cast<int64_t>(t->s_.model->vocab_entries() + extra.size());
  return t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeHfTokenizer(HfTokenizerSpec spec) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> t = HfTokenizer::Create(std::move(spec));
  if (!t.ok()) return t.status();
  return std::unique_ptr<Tokenizer>(std::move(*t));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path) {
  std::error_code ec;
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file, ec)) file /= "tokenizer.json";
  absl::StatusOr<std::string> json = fs::ReadFileToString(file.string());
  if (!json.ok()) return json.status();
  std::string config;
  const std::filesystem::path config_path = file.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path, ec)) {
    absl::StatusOr<std::string> c = fs::ReadFileToString(config_path.string());
    if (!c.ok()) return c.status();
    config = *std::move(c);
  }
  absl::StatusOr<HfTokenizerSpec> spec = ParseHfTokenizerJson(*json, file.string(), config);
  if (!spec.ok()) return spec.status();
  return MakeHfTokenizer(*std::move(spec));
}

}  // namespace leantron::data
