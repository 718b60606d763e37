// The `tokenize` tool's work: encode, decode or count a stream of text or JSON lines with a pool
// of threads, writing output in input order, identical for every thread count.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "libdata/tokenizer.h"

namespace leantron::data {

struct TokenizeStreamOptions {
  enum class Mode { kEncode, kDecode, kCount };
  Mode mode = Mode::kEncode;
  // Plain: the whole input is one text (encode, count) or one id sequence (decode), written as one
  // line. JSONL: one JSON object per line in and one line per object out.
  bool jsonl = false;
  std::string json_key = "text";
  // Special tokens in the text become their ids; the tokenizer's BOS/EOS are added around the
  // text (plain: once around the whole input; JSONL: around each document).
  EncodeOptions encode;
  int threads = 1;
  std::string input_name = "<stdin>";  // for error messages
  size_t block_bytes = 8 << 20;        // input read per round, per thread
};

// Plain text is cut into blocks (and spread over threads) only where the tokenizer guarantees
// the same ids (Tokenizer::SplitsAtSpaces); otherwise it is read whole and encoded once. Plain
// decoding is likewise cut only when Tokenizer::DecodesPartByPart.
absl::Status RunTokenizeStream(const Tokenizer& tokenizer, const TokenizeStreamOptions& options,
                               std::FILE* in, std::FILE* out);

}  // namespace leantron::data
