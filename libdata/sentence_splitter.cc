#include "libdata/sentence_splitter.h"

#include <unicode/brkiter.h>
#include <unicode/uchar.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

#include "absl/strings/str_cat.h"

namespace leantron::data {
namespace {

// Length of `s` without trailing Unicode whitespace (Python's str.rstrip()).
size_t RStripLength(std::string_view s) {
  int32_t end = static_cast<int32_t>(s.size());
  while (end > 0) {
    int32_t i = end;
    UChar32 c;
    U8_PREV(reinterpret_cast<const uint8_t*>(s.data()), 0, i, c);
    if (c < 0 || !u_isspace(c)) break;
    end = i;
  }
  return static_cast<size_t>(end);
}

}  // namespace

struct SentenceSplitter::Impl {
  std::unique_ptr<icu::BreakIterator> iterator;
  std::unique_ptr<icu::BreakIterator> filtered;
  bool keep_newlines = false;
};

SentenceSplitter::SentenceSplitter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentenceSplitter::~SentenceSplitter() = default;

absl::StatusOr<std::unique_ptr<SentenceSplitter>> SentenceSplitter::Create(bool keep_newlines) {
  UErrorCode status = U_ZERO_ERROR;
  auto impl = std::make_unique<Impl>();
  // English rules, as Megatron's default punkt model (--lang english). The plain iterator
  // tells why it broke (rule status); the filtered one ("ss=standard") drops breaks after ICU's
  // list of abbreviations ("Mr.", "e.g.", ...), as punkt learned its own. It reports no rule
  // status, hence the two.
  impl->iterator.reset(icu::BreakIterator::createSentenceInstance(icu::Locale("en"), status));
  impl->filtered.reset(
      icu::BreakIterator::createSentenceInstance(icu::Locale("en@ss=standard"), status));
  if (U_FAILURE(status) || !impl->iterator || !impl->filtered) {
    return absl::InternalError(
        absl::StrCat("cannot create ICU sentence break iterator: ", u_errorName(status)));
  }
  impl->keep_newlines = keep_newlines;
  return std::unique_ptr<SentenceSplitter>(new SentenceSplitter(std::move(impl)));
}

absl::Status SentenceSplitter::Split(std::string_view text, std::vector<std::string_view>* out) {
  // punkt ends the last sentence at len(text.rstrip()): trailing whitespace belongs to no one.
  text = text.substr(0, RStripLength(text));
  UErrorCode status = U_ZERO_ERROR;
  UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
  if (U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat("ICU utext_openUTF8: ", u_errorName(status)));
  }
  icu::BreakIterator& it = *impl_->iterator;
  icu::BreakIterator& filtered = *impl_->filtered;
  it.setText(ut, status);
  filtered.setText(ut, status);
  if (U_FAILURE(status)) {
    utext_close(ut);
    return absl::InternalError(absl::StrCat("ICU setText: ", u_errorName(status)));
  }
  filtered.first();
  const auto emit = [&](size_t begin, size_t end, bool last) {
    std::string_view sentence = text.substr(begin, end - begin);
    if (!last && !impl_->keep_newlines) sentence = sentence.substr(0, RStripLength(sentence));
    if (!sentence.empty()) out->push_back(sentence);
  };
  size_t start = 0;
  for (int32_t b = it.next(); b != icu::BreakIterator::DONE; b = it.next()) {
    const size_t boundary = static_cast<size_t>(b);  // UTF-8 UText: native byte offsets.
    if (boundary >= text.size()) break;
    const int32_t rule = it.getRuleStatus();
    // Only breaks after a terminator; UBRK_SENTENCE_SEP breaks (a bare newline) are skipped,
    // and so are breaks the abbreviation filter removed.
    if (rule >= UBRK_SENTENCE_TERM && rule < UBRK_SENTENCE_TERM_LIMIT && filtered.isBoundary(b)) {
      emit(start, boundary, false);
      start = boundary;
    }
  }
  emit(start, text.size(), true);
  utext_close(ut);
  return absl::OkStatus();
}

}  // namespace leantron::data
