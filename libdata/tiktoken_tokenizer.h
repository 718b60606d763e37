// Megatron's TikTokenizer: tiktoken's merge rule (the lowest-ranked concatenation first) over a
// rank file, a named pre-tokenizer pattern and special tokens.
//
// Two schemes, chosen by --tiktoken-pattern:
//   v1, v2 (Megatron's, default v2): the special tokens (--tokenizer-special-tokens, by default
//     <unk> <s> </s> <mask> <pad> <cls> <sep>, padded with <SPECIAL_i> to
//     --tiktoken-num-special-tokens, 1000) take ids 0..999 and rank r takes id r + 1000; the
//     vocabulary is cut to --vocab-size (default 131072) ids; EOD is </s>.
//   gpt2 (r50k_base), cl100k_base, o200k_base, llama3: tiktoken's encodings and Meta's Llama 3
//     tokenizer: ids are ranks, the encoding's special tokens follow (<|endoftext|> 50256, ...;
//     Llama 3's 256 from 128000, named as in Llama 3.1); EOD is <|endoftext|> (<|end_of_text|>).
// The ranks come from Megatron's JSON list ([{"rank", "token_bytes", "token_str"}, ...]) or a
// tiktoken file (base64 token and rank per line, .tiktoken).
//
// Text between special tokens is encoded on its own, as tiktoken does; Megatron encodes with
// allowed_special="all". Invalid UTF-8 is encoded run by run, each invalid byte as its own byte.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "libdata/tokenizer.h"

namespace leantron::data {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTiktokenTokenizer(const TokenizerOptions& options);
// The same from the rank file's contents (options.model names it in errors).
absl::StatusOr<std::unique_ptr<Tokenizer>> TiktokenTokenizerFromText(
    std::string_view text, const TokenizerOptions& options);

// The regex of a named pattern (v1, v2, gpt2, cl100k_base, o200k_base, llama3), or "".
std::string TiktokenPattern(std::string_view name);

}  // namespace leantron::data
