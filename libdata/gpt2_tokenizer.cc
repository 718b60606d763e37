#include "libdata/gpt2_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "libdata/bpe_merge.h"
#include "libdata/pretokenizer.h"

namespace leantron::data {
namespace {}  // namespace

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Load(const VocabFiles& files) {
  const bool megatron = !files.vocab_file.empty() || !files.merge_file.empty();
  if (megatron && (files.vocab_file.empty() || files.merge_file.empty())) {
    return absl::InvalidArgumentError("--vocab-file and --merge-file must be given together");
  }
  if (!megatron && files.tiktoken_file.empty()) {
    return absl::InvalidArgumentError(
        "no vocabulary: give --vocab-file and --merge-file, or --tiktoken-file");
  }
  absl::StatusOr<BpeVocab> vocab;
  if (megatron) {
    vocab = BpeVocab::FromMegatronFiles(files.vocab_file, files.merge_file);
    if (vocab.ok() && !files.tiktoken_file.empty()) {
      absl::StatusOr<BpeVocab> other = BpeVocab::FromTiktokenFile(files.tiktoken_file);
      if (!other.ok()) return other.status();
      if (other->num_ranks() != vocab->num_ranks()) {
        return absl::InvalidArgumentError(
            absl::StrCat(files.tiktoken_file, " has ", other->num_ranks(), " tokens but ",
                         files.vocab_file, " has ", vocab->num_ranks()));
      }
      for (int32_t r = 0; r < vocab->num_ranks(); ++r) {
        if (other->TokenBytes(r) != vocab->TokenBytes(r)) {
          return absl::InvalidArgumentError(absl::StrCat(
              files.tiktoken_file, " and ", files.vocab_file, " disagree at rank ", r));
        }
      }
    }
  } else {
    vocab = BpeVocab::FromTiktokenFile(files.tiktoken_file);
  }
  if (!vocab.ok()) return vocab.status();
  return std::make_unique<Gpt2Tokenizer>(*std::move(vocab));
}

Gpt2Tokenizer::Gpt2Tokenizer(BpeVocab vocab) : vocab_(std::move(vocab)) {}

std::vector<int32_t> Gpt2Tokenizer::EncodeOrdinary(std::string_view text) const {
  std::vector<int32_t> ids;
  Gpt2Encoder(*this).EncodeOrdinary(text, &ids);
  return ids;
}

std::vector<int32_t> Gpt2Tokenizer::Encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  Gpt2Encoder(*this).Encode(text, allow_special, &ids);
  return ids;
}

absl::Status Gpt2Tokenizer::Decode(absl::Span<const int32_t> ids, std::string* out) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id >= 0 && id < vocab_.num_ranks()) {
      out->append(vocab_.TokenBytes(id));
    } else if (id == eod_id()) {
      out->append(kEndOfText.data(), kEndOfText.size());
    } else {
      return absl::OutOfRangeError(absl::StrCat("id ", id, " at position ", i,
                                                " is outside the vocabulary (0..", eod_id(), ")"));
    }
  }
  return absl::OkStatus();
}

Gpt2Encoder::Gpt2Encoder(const Gpt2Tokenizer& tokenizer, Options options)
    : tokenizer_(tokenizer),
      vocab_(tokenizer.vocab()),
      options_(options),
      cache_(options.max_cache_entries) {}

void Gpt2Encoder::EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) {
  static const Pretokenizer pretokenizer;
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* end = p + text.size();
  while (p < end) {
    const size_t n = pretokenizer.PieceLength(p, end);
    const int32_t rank = end - p >= 8 ? vocab_.RankPadded(p, n) : vocab_.Rank(p, n);
    if (rank >= 0) {
      out->push_back(rank);
    } else {
      EncodePiece(p, n, out);
    }
    p += n;
  }
}

void Gpt2Encoder::Encode(std::string_view text, bool allow_special, std::vector<int32_t>* out) {
  if (!allow_special) return EncodeOrdinary(text, out);
  // Text between special tokens is encoded on its own, as tiktoken does.
  for (;;) {
    const size_t at = text.find(Gpt2Tokenizer::kEndOfText);
    if (at == std::string_view::npos) break;
    EncodeOrdinary(text.substr(0, at), out);
    out->push_back(tokenizer_.eod_id());
    text.remove_prefix(at + Gpt2Tokenizer::kEndOfText.size());
  }
  EncodeOrdinary(text, out);
}

void Gpt2Encoder::EncodePiece(const uint8_t* p, size_t n, std::vector<int32_t>* out) {
  if (n < kBpeCutThreshold) return EncodeSegment(p, n, out);
  // Long pieces (CJK runs rarely recur whole) are cut where no merge can cross; the segments,
  // often single words or characters, recur and are cached.
  ForEachMergeSegment(vocab_, p, n, [&](const uint8_t* s, size_t len) {
    if (len == n) return EncodeSegment(s, len, out);
    const int32_t rank = vocab_.Rank(s, len);
    if (rank >= 0) {
      out->push_back(rank);
    } else {
      EncodeSegment(s, len, out);
    }
  });
}

void Gpt2Encoder::EncodeSegment(const uint8_t* p, size_t n, std::vector<int32_t>* out) {
  if (n == 1) {
    out->push_back(vocab_.ByteRank(p[0]));
    return;
  }
  if (n > options_.max_cached_piece) {
    BytePairEncode(vocab_, p, n, out);
    return;
  }
  if (cache_.Lookup(p, n, out)) return;
  const size_t before = out->size();
  BytePairEncode(vocab_, p, n, out);
  cache_.Insert(p, n, out->data() + before, out->size() - before);
}

}  // namespace leantron::data
