// tokenize: text <-> ids with any of Megatron's tokenizer types, exactly as their references.
#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "libdata/bpe_vocab.h"
#include "libdata/gpt2_tokenizer.h"
#include "libdata/tokenize_stream.h"
#include "libdata/tokenizer_flags.h"

namespace {

constexpr char kDescription[] =
    R"(tokenize: text <-> token ids with Megatron's tokenizer types, the same ids as the references
(tiktoken, HuggingFace tokenizers, sentencepiece).

  tokenize encode   text on stdin -> ids on stdout, decimal, separated by single spaces, one line
  tokenize decode   ids on stdin (any whitespace) -> the text they stand for
  tokenize count    text on stdin -> its number of tokens
  tokenize export-vocab --output-dir D
                    GPT2BPETokenizer: write the vocabulary as encoder.json + vocab.bpe
                    (byte-identical to OpenAI's files for GPT-2) and gpt2.tiktoken

The tokenizer: --tokenizer-type GPT2BPETokenizer (default; --vocab-file encoder.json
--merge-file vocab.bpe, or --tiktoken-file gpt2.tiktoken), HuggingFaceTokenizer
(--tokenizer-model tokenizer.json or its folder), TikTokenizer (--tokenizer-model ranks
--tiktoken-pattern NAME), SentencePieceTokenizer / Llama2Tokenizer / GPTSentencePieceTokenizer
(--tokenizer-model tokenizer.model), NullTokenizer (--vocab-size N).

With --jsonl, encode reads one JSON object per line and writes one line of ids per input line
(an empty input line gives an empty output line); decode reads one line of ids per object and
writes {"<json-key>": "<text>"} lines (invalid UTF-8 shown as U+FFFD); count writes one count per
line.

Defaults follow what Megatron's tokenizer.tokenize(text) does for the type: special tokens in the
text (<|endoftext|>, <|begin_of_text|>, ...) are text for GPT2BPETokenizer (tiktoken's
encode_ordinary) and become their ids for HuggingFaceTokenizer and TikTokenizer;
--allow-special / --no-allow-special override that. HuggingFaceTokenizer adds the
post-processor's tokens (Llama 3's <|begin_of_text|>) unless
--tokenizer-hf-no-include-special-tokens. GPT-2: bytes that are not valid UTF-8 are kept, each
pre-tokenized like the symbol U+FFFD and encoded as its own byte, so decode(encode(x)) == x.
--threads N splits the work without changing the output.)";

}  // namespace

int main(int argc, char** argv) {
  using leantron::data::TokenizeStreamOptions;
  CLI::App app{kDescription, "tokenize"};
  app.require_subcommand(1);
  leantron::data::TokenizerOptions tok;
  TokenizeStreamOptions options;
  bool allow_special = false, no_allow_special = false;
  bool no_include_special = false;
  auto add_common = [&](CLI::App* sub) {
    leantron::data::AddTokenizerFlags(sub, &tok);
    sub->add_flag("--jsonl", options.jsonl, "one JSON object per input line");
    sub->add_option("--json-key", options.json_key, "key of the text in each JSON object")
        ->capture_default_str();
    sub->add_option("--threads", options.threads, "worker threads (output does not change)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    sub->add_option("--block-bytes", options.block_bytes,
                    "bytes read per round and thread (memory/parallelism trade-off)")
        ->capture_default_str()
        ->check(CLI::Range(size_t{1}, size_t{1} << 32));
  };
  CLI::App* encode = app.add_subcommand("encode", "text -> ids");
  CLI::App* decode = app.add_subcommand("decode", "ids -> text");
  CLI::App* count = app.add_subcommand("count", "text -> number of tokens");
  CLI::App* export_vocab =
      app.add_subcommand("export-vocab", "write the vocabulary in both file formats");
  std::string output_dir;
  export_vocab->add_option("--output-dir", output_dir, "directory to write into")->required();
  for (CLI::App* sub : {encode, decode, count, export_vocab}) add_common(sub);
  for (CLI::App* sub : {encode, count}) {
    sub->add_flag("--allow-special", allow_special,
                  "special tokens written in the text become their ids (default: as Megatron "
                  "for the type)");
    sub->add_flag("--no-allow-special", no_allow_special,
                  "special tokens written in the text are ordinary text");
    sub->add_flag("--tokenizer-hf-no-include-special-tokens", no_include_special,
                  "HuggingFaceTokenizer: do not add the post-processor's tokens (BOS)");
  }
  CLI11_PARSE(app, argc, argv);
  if (decode->parsed()) options.mode = TokenizeStreamOptions::Mode::kDecode;
  if (count->parsed()) options.mode = TokenizeStreamOptions::Mode::kCount;

  if (export_vocab->parsed()) {
    if (tok.type != "GPT2BPETokenizer") {
      std::cerr << "tokenize: export-vocab is for GPT2BPETokenizer\n";
      return 2;
    }
    auto gpt2 =
        leantron::data::Gpt2Tokenizer::Load({tok.vocab_file, tok.merge_file, tok.tiktoken_file});
    if (!gpt2.ok()) {
      std::cerr << "tokenize: " << gpt2.status().message() << "\n";
      return 2;
    }
    const absl::Status st = leantron::data::ExportVocabFiles((*gpt2)->vocab(), output_dir);
    if (!st.ok()) {
      std::cerr << "tokenize: " << st.message() << "\n";
      return 1;
    }
    return 0;
  }
  auto tokenizer = leantron::data::LoadTokenizer(tok);
  if (!tokenizer.ok()) {
    std::cerr << "tokenize: " << tokenizer.status().message() << "\n";
    return 2;
  }
  options.encode = (*tokenizer)->megatron_defaults();
  if (allow_special && no_allow_special) {
    std::cerr << "tokenize: --allow-special and --no-allow-special contradict each other\n";
    return 2;
  }
  if (allow_special) options.encode.allow_special = true;
  if (no_allow_special) options.encode.allow_special = false;
  if (no_include_special) options.encode.add_special = false;
  const absl::Status st = leantron::data::RunTokenizeStream(**tokenizer, options, stdin, stdout);
  if (!st.ok()) {
    std::cerr << "tokenize: " << st.message() << "\n";
    return 1;
  }
  return 0;
}
