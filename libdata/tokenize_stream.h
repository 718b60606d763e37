// The `tokenize` tool's work: encode, decode or count a stream of text or JSON lines with a pool
// of threads, writing output in input order, identical for every thread count.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "libdata/gpt2_tokenizer.h"

namespace leantron::data {

struct TokenizeStreamOptions {
  enum class Mode { kEncode, kDecode, kCount };
  Mode mode = Mode::kEncode;
  // Plain: the whole input is one text (encode, count) or one id sequence (decode), written as one
  // line. JSONL: one JSON object per line in and one line per object out.
  bool jsonl = false;
  std::string json_key = "text";
  bool allow_special = false;  // "<|endoftext|>" -> eod id when encoding
  int threads = 1;
  std::string input_name = "<stdin>";  // for error messages
  size_t block_bytes = 8 << 20;        // input read per round, per thread
};

absl::Status RunTokenizeStream(const Gpt2Tokenizer& tokenizer, const TokenizeStreamOptions& options,
                               std::FILE* in, std::FILE* out);

}  // namespace leantron::data
