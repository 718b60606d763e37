// tokenize: GPT-2 byte-level BPE from the command line, with exactly tiktoken's ids.
#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "libdata/gpt2_tokenizer.h"
#include "libdata/tokenize_stream.h"

namespace {

constexpr char kDescription[] =
    R"(tokenize: GPT-2 byte-level BPE, the same ids as tiktoken's gpt2 encoding.

  tokenize encode   text on stdin -> ids on stdout, decimal, separated by single spaces, one line
  tokenize decode   ids on stdin (any whitespace) -> the exact bytes they stand for
  tokenize count    text on stdin -> its number of tokens
  tokenize export-vocab --output-dir D
                    write the loaded vocabulary as encoder.json + vocab.bpe (byte-identical to
                    OpenAI's files for GPT-2) and gpt2.tiktoken

With --jsonl, encode reads one JSON object per line and writes one line of ids per input line
(an empty input line gives an empty output line); decode reads one line of ids per object and
writes {"<json-key>": "<text>"} lines (invalid UTF-8 shown as U+FFFD); count writes one count per
line. The vocabulary is Megatron's pair (--vocab-file encoder.json --merge-file vocab.bpe) or a
tiktoken rank file (--tiktoken-file gpt2.tiktoken); giving all three cross-checks them.

Without --allow-special, "<|endoftext|>" in the text is ordinary text (tiktoken's
encode_ordinary); with it, it becomes id 50256. Bytes that are not valid UTF-8 are kept: each is
pre-tokenized like the symbol U+FFFD and encoded as its own byte, so decode(encode(x)) == x for any
input. --threads N splits the work without changing the output.)";

}  // namespace

int main(int argc, char** argv) {
  using leantron::data::TokenizeStreamOptions;
  CLI::App app{kDescription, "tokenize"};
  app.require_subcommand(1);
  leantron::data::VocabFiles files;
  TokenizeStreamOptions options;
  auto add_common = [&](CLI::App* sub) {
    sub->add_option("--vocab-file", files.vocab_file, "encoder.json (Megatron's --vocab-file)");
    sub->add_option("--merge-file", files.merge_file, "vocab.bpe (Megatron's --merge-file)");
    sub->add_option("--tiktoken-file", files.tiktoken_file, "tiktoken rank file (gpt2.tiktoken)");
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
    sub->add_flag("--allow-special", options.allow_special,
                  "encode \"<|endoftext|>\" as the special token 50256");
  }
  CLI11_PARSE(app, argc, argv);
  if (decode->parsed()) options.mode = TokenizeStreamOptions::Mode::kDecode;
  if (count->parsed()) options.mode = TokenizeStreamOptions::Mode::kCount;

  auto tokenizer = leantron::data::Gpt2Tokenizer::Load(files);
  if (!tokenizer.ok()) {
    std::cerr << "tokenize: " << tokenizer.status().message() << "\n";
    return 2;
  }
  if (export_vocab->parsed()) {
    const absl::Status st = leantron::data::ExportVocabFiles((*tokenizer)->vocab(), output_dir);
    if (!st.ok()) {
      std::cerr << "tokenize: " << st.message() << "\n";
      return 1;
    }
    return 0;
  }
  const absl::Status st = leantron::data::RunTokenizeStream(**tokenizer, options, stdin, stdout);
  if (!st.ok()) {
    std::cerr << "tokenize: " << st.message() << "\n";
    return 1;
  }
  return 0;
}
