// Tokenizer throughput on files held in memory, best of --repeat runs, with a breakdown of where
// the time goes: pre-tokenization alone, plus whole-piece vocabulary lookups, and full encoding.
// bench/tokenizer_bench.py runs it next to tiktoken on the same text and prints the table.
//
//   bench_tokenizer --tiktoken-file gpt2.tiktoken [--threads N] [--repeat R] FILE...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "libdata/gpt2_tokenizer.h"
#include "libdata/pretokenizer.h"
#include "libfs/atomic_file.h"

namespace {

using leantron::data::Gpt2Encoder;
using leantron::data::Gpt2Tokenizer;
using leantron::data::IsSafeSplit;
using leantron::data::Pretokenizer;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Cuts text into `parts` ranges at safe split points (as `tokenize --threads` does).
std::vector<size_t> Cuts(const std::string& text, int parts) {
  std::vector<size_t> cuts{0};
  const auto* t = reinterpret_cast<const uint8_t*>(text.data());
  for (int k = 1; k < parts; ++k) {
    size_t i = std::max(text.size() * k / parts, cuts.back() + 1);
    while (i < text.size() && !IsSafeSplit(t, i)) ++i;
    if (i >= text.size()) break;
    cuts.push_back(i);
  }
  cuts.push_back(text.size());
  return cuts;
}

template <typename Fn>
double BestOf(int repeat, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, Seconds(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT-2 tokenizer throughput"};
  leantron::data::VocabFiles files;
  int threads = 1, repeat = 3;
  std::vector<std::string> inputs;
  app.add_option("--vocab-file", files.vocab_file);
  app.add_option("--merge-file", files.merge_file);
  app.add_option("--tiktoken-file", files.tiktoken_file);
  app.add_option("--threads", threads)->check(CLI::Range(1, 256));
  app.add_option("--repeat", repeat)->check(CLI::Range(1, 100));
  leantron::data::Gpt2Encoder::Options encoder_options;
  app.add_option("--cache-max-piece", encoder_options.max_cached_piece)->capture_default_str();
  app.add_option("--cache-entries", encoder_options.max_cache_entries)->capture_default_str();
  app.add_option("inputs", inputs)->required();
  CLI11_PARSE(app, argc, argv);
  auto tokenizer = Gpt2Tokenizer::Load(files);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tokenizer.status().message()).c_str());
    return 2;
  }
  const Gpt2Tokenizer& tok = **tokenizer;
  std::printf(
      "file\tMB\tthreads\tpretokenize_MBps\tlookup_MBps\tencode_MBps\ttokens\tpieces\t"
      "whole_token_pieces\n");
  for (const std::string& path : inputs) {
    auto text = leantron::fs::ReadFileToString(path);
    if (!text.ok()) {
      std::fprintf(stderr, "%s\n", std::string(text.status().message()).c_str());
      return 2;
    }
    const std::vector<size_t> cuts = Cuts(*text, threads);
    const size_t parts = cuts.size() - 1;
    std::vector<Gpt2Encoder> encoders;
    for (size_t k = 0; k < parts; ++k) encoders.emplace_back(tok);
    std::vector<std::vector<int32_t>> ids(parts);
    std::vector<size_t> sink(parts), pieces_of(parts);
    auto run = [&](auto&& body) {
      std::vector<std::thread> pool;
      for (size_t k = 0; k < parts; ++k) pool.emplace_back(body, k);
      for (auto& t : pool) t.join();
    };
    const auto* base = reinterpret_cast<const uint8_t*>(text->data());
    const double t_pre = BestOf(repeat, [&] {
      run([&](size_t k) {
        Pretokenizer pre;
        size_t pieces = 0;
        for (const uint8_t *p = base + cuts[k], *end = base + cuts[k + 1]; p < end; ++pieces)
          p += pre.PieceLength(p, end);
        pieces_of[k] = pieces;
      });
    });
    const double t_lookup = BestOf(repeat, [&] {
      run([&](size_t k) {
        Pretokenizer pre;
        size_t hits = 0;
        for (const uint8_t *p = base + cuts[k], *end = base + cuts[k + 1]; p < end;) {
          const size_t n = pre.PieceLength(p, end);
          hits += tok.vocab().Rank(p, n) >= 0;
          p += n;
        }
        sink[k] = hits;
      });
    });
    const double t_encode = BestOf(repeat, [&] {
      // Fresh encoders each run: the piece cache starts cold, as on new text.
      encoders.clear();
      for (size_t k = 0; k < parts; ++k) encoders.emplace_back(tok, encoder_options);
      run([&](size_t k) {
        ids[k].clear();
        encoders[k].EncodeOrdinary(std::string_view(*text).substr(cuts[k], cuts[k + 1] - cuts[k]),
                                   &ids[k]);
      });
    });
    size_t tokens = 0, pieces = 0, whole = 0;
    for (const auto& v : ids) tokens += v.size();
    for (size_t k = 0; k < parts; ++k) pieces += pieces_of[k], whole += sink[k];
    const double mb = text->size() / 1e6;
    std::printf("%s\t%.1f\t%d\t%.1f\t%.1f\t%.1f\t%zu\t%zu\t%zu\n", path.c_str(), mb, threads,
                mb / t_pre, mb / t_lookup, mb / t_encode, tokens, pieces, whole);
  }
  return 0;
}
