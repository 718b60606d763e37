// preprocess_data: JSONL corpus -> Megatron indexed datasets, with Megatron's flags and names.
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "libdata/preprocess.h"
#include "libdata/tokenizer_flags.h"
#include "libfs/atomic_file.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Tokenize a JSONL corpus into Megatron .bin/.idx files (Megatron's preprocess_data.py)"};
  leantron::data::PreprocessOptions options;
  std::string eod_in_text;
  std::string lang = "english";
  int partitions = 1;
  bool keep_sequential_samples = false;
  app.add_option(
         "--input", options.inputs,
         "JSONL input(s): files (.jsonl, .jsonl.zst, .jsonl.gz), globs, directories, - for stdin")
      ->required();
  app.add_option("--json-keys", options.json_keys, "Keys to extract from each JSON line")
      ->capture_default_str();
  app.add_flag("--split-sentences", options.split_sentences, "Split documents into sentences");
  app.add_flag("--keep-newlines", options.keep_newlines,
               "Keep whitespace and newlines between sentences when splitting");
  leantron::data::AddTokenizerFlags(&app, &options.tokenizer);
  app.add_flag("--append-eod", options.append_eod,
               "Append the tokenizer's EOD (<|endoftext|>, </s>, ...) to every document");
  app.add_option("--eod-in-text", eod_in_text,
                 "Special tokens written in a document (<|endoftext|>, <|begin_of_text|>, ...): "
                 "'text' or 'special' (their ids). Default: as Megatron's tokenizer for the type "
                 "(text for GPT2BPETokenizer, special for HuggingFaceTokenizer and TikTokenizer)")
      ->check(CLI::IsMember({"text", "special"}));
  bool no_include_special = false;
  app.add_flag("--tokenizer-hf-no-include-special-tokens", no_include_special,
               "HuggingFaceTokenizer: do not add the post-processor's tokens (BOS) to each "
               "sentence");
  app.add_option("--lang", lang,
                 "Accepted for compatibility (ICU English sentence rules are used)");
  app.add_option("--output-prefix", options.output_prefix,
                 "Output files are {prefix}_{key}_{document|sentence}.bin/.idx")
      ->required();
  app.add_option("--workers", options.workers, "Tokenizing threads")->capture_default_str();
  app.add_option(
      "--partitions", partitions,
      "Accepted for compatibility: output is always one dataset per key, in input order");
  app.add_flag("--keep-sequential-samples", keep_sequential_samples,
               "Accepted for compatibility: input order is always kept");
  app.add_option("--log-interval", options.log_interval, "Progress line every N documents")
      ->capture_default_str();
  app.add_flag("--skip-invalid", options.skip_invalid,
               "Skip and count malformed lines instead of stopping at the first");
  CLI11_PARSE(app, argc, argv);
  leantron::fs::InstallTempFileCleanupOnSignals();
  if (!eod_in_text.empty()) options.eod_in_text_is_special = eod_in_text == "special";
  options.include_special_tokens = !no_include_special;
  options.log = &std::cerr;
  options.progress_bar = ::isatty(STDERR_FILENO) != 0;

  absl::StatusOr<leantron::data::PreprocessStats> stats = leantron::data::PreprocessData(options);
  if (!stats.ok()) {
    std::cerr << "preprocess_data: " << stats.status().message() << "\n";
    return 1;
  }
  std::cerr << "Done: " << stats->documents << " documents, " << stats->tokens << " tokens, "
            << stats->input_bytes << " bytes of JSONL in " << stats->seconds << " s.\n";
  if (stats->invalid_skipped > 0) {
    std::cerr << "Skipped " << stats->invalid_skipped
              << " invalid lines (first: " << stats->first_invalid << ").\n";
  }
  for (const std::string& prefix : stats->output_prefixes) {
    std::cerr << "Wrote " << prefix << ".bin and " << prefix << ".idx\n";
  }
  return 0;
}
