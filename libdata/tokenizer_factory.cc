// LoadTokenizer: Megatron's --tokenizer-type to a family; the GPT-2 and Null tokenizers.
#include <cctype>
#include <charconv>

#include "absl/strings/str_format.h"
#include "libdata/gpt2_tokenizer.h"
#include "libdata/hf_tokenizer.h"
#include "libdata/sentencepiece_tokenizer.h"
#include "libdata/string_compat.h"
#include "libdata/tiktoken_tokenizer.h"
#include "libdata/tokenizer.h"

namespace leantron::data {
namespace {

class Gpt2TextEncoder : public TextEncoder {
 public:
  Gpt2TextEncoder(const Gpt2Tokenizer& t, bool allow_special)
      : encoder_(t), allow_special_(allow_special) {}
  absl::Status Encode(std::string_view text, std::vector<int32_t>* out) override {
    encoder_.Encode(text, allow_special_, out);
    return absl::OkStatus();
  }

 private:
  Gpt2Encoder encoder_;
  bool allow_special_;
};

// GPT2BPETokenizer: Leantron's GPT-2 tokenizer (gpt2_tokenizer.h) behind the interface.
class Gpt2BpeTokenizer : public Tokenizer {
 public:
  explicit Gpt2BpeTokenizer(std::unique_ptr<Gpt2Tokenizer> t, std::string source)
      : t_(std::move(t)), source_(std::move(source)) {}
  std::unique_ptr<TextEncoder> NewEncoder(const EncodeOptions& options) const override {
    return std::make_unique<Gpt2TextEncoder>(*t_, options.allow_special);
  }
  absl::Status Decode(absl::Span<const int32_t> ids, std::string* out) const override {
    return t_->Decode(ids, out);
  }
  int64_t vocab_size() const override { return t_->vocab_size(); }
  std::optional<int32_t> eod_id() const override { return t_->eod_id(); }
  EncodeOptions megatron_defaults() const override { return {false, false}; }
  std::string Describe() const override {
    return absl::StrFormat("GPT2BPETokenizer %s (vocab size %d, EOD %d)", source_, t_->vocab_size(),
                           t_->eod_id());
  }
  bool SplitsAtSpaces() const override { return true; }
  bool DecodesPartByPart() const override { return true; }
  const Gpt2Tokenizer& gpt2() const { return *t_; }

 private:
  std::unique_ptr<Gpt2Tokenizer> t_;
  std::string source_;
};

class NullEncoder : public TextEncoder {
 public:
  explicit NullEncoder(int64_t vocab_size) : vocab_size_(vocab_size) {}
  // Megatron's NullTokenizer: [int(x) for x in text.split(' ')].
  absl::Status Encode(std::string_view text, std::vector<int32_t>* out) override {
    size_t pos = 0;
    for (;;) {
      const size_t sp = text.find(' ', pos);
      std::string_view word = text.substr(pos, sp == std::string_view::npos ? sp : sp - pos);
      // Python's int() ignores white space around the number.
      while (!word.empty() && std::isspace(static_cast<unsigned char>(word.front())))
        word.remove_prefix(1);
      while (!word.empty() && std::isspace(static_cast<unsigned char>(word.back())))
        word.remove_suffix(1);
      int64_t v = -1;
      const auto r = std::from_chars(word.data(), word.data() + word.size(), v);
      if (r.ec != std::errc() || r.ptr != word.data() + word.size() || v < 0 || v > vocab_size_) {
        return absl::InvalidArgumentError(
            Cat("NullTokenizer: \"", word, "\" is not a token id in 0..", vocab_size_));
      }
      out->push_back(static_cast<int32_t>(v));
      if (sp == std::string_view::npos) return absl::OkStatus();
      pos = sp + 1;
    }
  }

 private:
  int64_t vocab_size_;
};

// NullTokenizer: ids written as text. As in Megatron's legacy _NullTokenizer (and Leantron's
// trainer), the vocabulary is --vocab-size ids plus the EOD id --vocab-size.
class NullTokenizer : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size) : vocab_size_(vocab_size) {}
  std::unique_ptr<TextEncoder> NewEncoder(const EncodeOptions&) const override {
    return std::make_unique<NullEncoder>(vocab_size_);
  }
  absl::Status Decode(absl::Span<const int32_t> ids, std::string* out) const override {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > vocab_size_)
        return absl::OutOfRangeError(
            absl::StrFormat("id %d at position %d is outside 0..%d", ids[i], i, vocab_size_));
      if (i > 0) out->push_back(' ');
      absl::StrAppend(out, ids[i]);
    }
    return absl::OkStatus();
  }
  int64_t vocab_size() const override { return vocab_size_ + 1; }
  std::optional<int32_t> eod_id() const override { return static_cast<int32_t>(vocab_size_); }
  EncodeOptions megatron_defaults() const override { return {false, false}; }
  std::string Describe() const override {
    return absl::StrFormat("NullTokenizer (vocab size %d, EOD %d)", vocab_size_ + 1, vocab_size_);
  }

 private:
  int64_t vocab_size_;
};

}  // namespace

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  if (absl::Status st = NewEncoder(options)->Encode(text, &ids); !st.ok()) return st;
  return ids;
}

const std::vector<std::string>& TokenizerTypes() {
  static const std::vector<std::string> types = {
      "GPT2BPETokenizer", "HuggingFaceTokenizer",      "TikTokenizer", "SentencePieceTokenizer",
      "Llama2Tokenizer",  "GPTSentencePieceTokenizer", "NullTokenizer"};
  return types;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const TokenizerOptions& o) {
  const std::string& type = o.type;
  const bool has_gpt2_files =
      !o.vocab_file.empty() || !o.merge_file.empty() || !o.tiktoken_file.empty();
  if (type != "GPT2BPETokenizer" && has_gpt2_files) {
    return absl::InvalidArgumentError(
        Cat("--vocab-file/--merge-file/--tiktoken-file are for GPT2BPETokenizer; ", type,
            " takes --tokenizer-model"));
  }
  if (type == "GPT2BPETokenizer") {
    absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> t =
        Gpt2Tokenizer::Load({o.vocab_file, o.merge_file, o.tiktoken_file});
    if (!t.ok()) return t.status();
    return std::unique_ptr<Tokenizer>(std::make_unique<Gpt2BpeTokenizer>(
        *std::move(t), o.tiktoken_file.empty() ? o.vocab_file : o.tiktoken_file));
  }
  if (type == "NullTokenizer") {
    if (o.vocab_size <= 0) return absl::InvalidArgumentError("NullTokenizer needs --vocab-size");
    if (o.vocab_size >= INT32_MAX) return absl::InvalidArgumentError("--vocab-size too large");
    return std::unique_ptr<Tokenizer>(std::make_unique<NullTokenizer>(o.vocab_size));
  }
  if (o.model.empty()) return absl::InvalidArgumentError(Cat(type, " needs --tokenizer-model"));
  if (type == "HuggingFaceTokenizer") return LoadHfTokenizer(o.model);
  if (type == "TikTokenizer") return LoadTiktokenTokenizer(o);
  if (type == "SentencePieceTokenizer" || type == "Llama2Tokenizer" ||
      type == "GPTSentencePieceTokenizer") {
    return LoadSentencePieceTokenizer(o.model, type);
  }
  std::string known;
  for (const std::string& t : TokenizerTypes())
    absl::StrAppend(&known, known.empty() ? "" : ", ", t);
  return absl::InvalidArgumentError(Cat("unknown --tokenizer-type ", type, " (", known, ")"));
}

}  // namespace leantron::data
