// Megatron's tokenizer flags on a CLI11 app, shared by `tokenize`, `preprocess_data` and
// `train` (header-only: libdata itself does not depend on CLI11).
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "libdata/tokenizer.h"

namespace leantron::data {

inline void AddTokenizerFlags(CLI::App* app, TokenizerOptions* o) {
  std::string types;
  for (const std::string& t : TokenizerTypes()) types += (types.empty() ? "" : ", ") + t;
  app->add_option("--tokenizer-type", o->type, types)->capture_default_str();
  app->add_option("--tokenizer-model", o->model,
                  "HuggingFaceTokenizer: tokenizer.json or its folder; TikTokenizer: rank file "
                  "(Megatron's JSON list or .tiktoken); SentencePiece types: tokenizer.model");
  app->add_option("--vocab-file", o->vocab_file, "GPT2BPETokenizer: encoder.json");
  app->add_option("--merge-file", o->merge_file, "GPT2BPETokenizer: vocab.bpe");
  app->add_option("--tiktoken-file", o->tiktoken_file,
                  "GPT2BPETokenizer: gpt2.tiktoken (instead of --vocab-file/--merge-file)");
  app->add_option("--tiktoken-pattern", o->tiktoken_pattern,
                  "TikTokenizer: v1, v2 (Megatron's, default for its JSON), gpt2, cl100k_base, "
                  "o200k_base, llama3");
  app->add_option("--tiktoken-num-special-tokens", o->tiktoken_num_special_tokens,
                  "TikTokenizer with v1/v2: ids reserved for special tokens")
      ->capture_default_str();
  app->add_option("--tokenizer-special-tokens", o->special_tokens,
                  "TikTokenizer with v1/v2: the special tokens (must hold Megatron's seven)");
  app->add_option("--vocab-size", o->vocab_size,
                  "NullTokenizer: ids (EOD is this number); TikTokenizer with v1/v2: vocabulary "
                  "size (default 131072)");
}

}  // namespace leantron::data
