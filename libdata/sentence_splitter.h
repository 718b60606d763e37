// Sentence splitting for `preprocess_data --split-sentences`, with ICU's sentence BreakIterator.
//
// Megatron uses NLTK's punkt model. To stay close to it, a boundary is taken only where ICU
// breaks after a sentence terminator (. ? ! and the like): ICU's breaks at bare line or paragraph
// separators are ignored, because punkt never splits at a newline alone. As in punkt, the first
// sentence keeps its leading whitespace and the last loses its trailing whitespace; between
// sentences the whitespace is dropped, or kept at the end of the earlier sentence with
// keep_newlines (Megatron's CustomLanguageVars). Differences that remain are in docs/data.md.
//
// Not thread-safe: make one per thread.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace leantron::data {

class SentenceSplitter {
 public:
  static absl::StatusOr<std::unique_ptr<SentenceSplitter>> Create(bool keep_newlines);
  ~SentenceSplitter();

  // Appends the non-empty sentences of UTF-8 `text` to `out`, as views into `text`.
  absl::Status Split(std::string_view text, std::vector<std::string_view>* out);

 private:
  struct Impl;
  explicit SentenceSplitter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace leantron::data
