// The `preprocess_data` pipeline: JSONL in, one Megatron indexed dataset per JSON key out.
//
//   reader thread ──batches of lines──► N worker threads (parse, split, tokenize)
//        ──results, reordered by batch number──► writer (calling thread, streaming builders)
//
// At most a fixed number of batches is in flight, so memory is bounded whatever the corpus
// size, and results are written in input order, so the output is identical for any number of
// workers. Semantics (sentences, EOD, empty documents): ../shared/specs/data.md §2.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libdata/tokenizer.h"

namespace leantron::data {

struct PreprocessOptions {
  std::vector<std::string> inputs;  // files, globs, directories (see ExpandInputs)
  std::vector<std::string> json_keys = {"text"};
  bool split_sentences = false;
  bool keep_newlines = false;
  TokenizerOptions tokenizer;  // Megatron's --tokenizer-type and its files
  bool append_eod = false;     // the tokenizer's EOD after each non-empty document
  // How special tokens written in a document ("<|endoftext|>", "<|begin_of_text|>", ...) are
  // tokenized: false as text, true as their ids. Unset: what Megatron's tokenizer does for the
  // type (text for GPT2BPETokenizer, as tiktoken's encode_ordinary and Megatron's legacy GPT-2
  // tokenizer; ids for HuggingFaceTokenizer and TikTokenizer).
  std::optional<bool> eod_in_text_is_special;
  // HuggingFaceTokenizer: add the post-processor's tokens (BOS) to every sentence, as Megatron's
  // tokenize does unless --tokenizer-hf-no-include-special-tokens.
  bool include_special_tokens = true;
  std::string output_prefix;
  int workers = 1;
  int64_t log_interval = 1000;
  // Skip (and count) lines that are not valid JSON objects with string values for every key,
  // instead of stopping at the first one.
  bool skip_invalid = false;
  std::ostream* log = nullptr;  // progress lines (Megatron's format); null for none
  // Also redraw one status line (documents, MB, MB/s) with '\r' a few times a second: for a
  // terminal. Megatron's lines are still printed, each on a line of its own.
  bool progress_bar = false;
};

struct PreprocessStats {
  int64_t documents = 0;        // documents written (per key: the same count)
  int64_t invalid_skipped = 0;  // lines skipped with skip_invalid
  int64_t input_bytes = 0;      // JSONL bytes (decompressed), newlines included
  int64_t tokens = 0;           // over all keys
  double seconds = 0;
  std::vector<std::string> output_prefixes;  // one per key
  std::string first_invalid;                 // the first skipped line's error, for the report
};

// Megatron's output prefix for one key: `{prefix}_{key}_{document|sentence}`.
std::string PreprocessOutputPrefix(const std::string& output_prefix, const std::string& key,
                                   bool split_sentences);

absl::StatusOr<PreprocessStats> PreprocessData(const PreprocessOptions& options);

}  // namespace leantron::data
