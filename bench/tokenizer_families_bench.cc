// Throughput of any tokenizer type on JSONL documents held in memory, one thread, best of
// --repeat runs with a fresh encoder each run (caches start cold).
// bench/tokenizer_families_bench.py runs it next to the reference libraries on the same documents
// and prints the table.
//
//   bench_tokenizer_families --tokenizer-type HuggingFaceTokenizer --tokenizer-model T.json
//       [--repeat R] [--allow-special] [--add-special] FILE.jsonl...
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "libfs/atomic_file.h"
#include "libdata/tokenizer_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"Tokenizer throughput on JSONL documents"};
  leantron::data::TokenizerOptions options;
  leantron::data::AddTokenizerFlags(&app, &options);
  int repeat = 3;
  leantron::data::EncodeOptions encode;
  std::vector<std::string> inputs;
  std::string key = "text";
  app.add_option("--repeat", repeat)->check(CLI::Range(1, 100));
  app.add_flag("--allow-special", encode.allow_special);
  app.add_flag("--add-special", encode.add_special);
  app.add_option("--json-key", key);
  app.add_option("inputs", inputs)->required();
  CLI11_PARSE(app, argc, argv);
  auto tokenizer = leantron::data::LoadTokenizer(options);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 2;
  }
  std::printf("file\tMB\tdocs\tencode_MBps\ttokens\n");
  for (const std::string& path : inputs) {
    auto text = leantron::fs::ReadFileToString(path);
    if (!text.ok()) {
      std::fprintf(stderr, "%s\n", std::string(text.status().message()).c_str());
      return 2;
    }
    std::vector<std::string> docs;
    simdjson::dom::parser parser;
    size_t pos = 0;
    while (pos < text->size()) {
      size_t nl = text->find('\n', pos);
      if (nl == std::string::npos) nl = text->size();
      if (nl > pos) {
        std::string_view doc;
        if (parser.parse(text->data() + pos, nl - pos)[key].get_string().get(doc)) {
          std::fprintf(stderr, "%s: bad JSON line\n", path.c_str());
          return 2;
        }
        docs.emplace_back(doc);
      }
      pos = nl + 1;
    }
    size_t bytes = 0;
    for (const std::string& d : docs) bytes += d.size();
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeat; ++r) {
      auto encoder = (*tokenizer)->NewEncoder(encode);
      std::vector<int32_t> ids;
      tokens = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (const std::string& d : docs) {
        ids.clear();
        if (absl::Status st = encoder->Encode(d, &ids); !st.ok()) {
          std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
          return 2;
        }
        tokens += ids.size();
      }
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("%s\t%.2f\t%zu\t%.1f\t%zu\n", path.c_str(), bytes / 1e6, docs.size(),
                bytes / 1e6 / best, tokens);
  }
  return 0;
}
