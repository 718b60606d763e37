// Micro-benchmarks of the tokenizer's parts (Google Benchmark), to see where time goes:
// the vocabulary lookup, the pre-tokenizer on ASCII and CJK, and both merge algorithms.
// Needs LEANTRON_VOCAB_DIR (scripts/get_gpt2_vocab.sh).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "libdata/bpe_merge.h"
#include "libdata/gpt2_tokenizer.h"
#include "libdata/pretokenizer.h"

namespace {

using leantron::data::Gpt2Tokenizer;

const Gpt2Tokenizer& Tok() {
  static const std::unique_ptr<Gpt2Tokenizer> tok = [] {
    const char* dir = std::getenv("LEANTRON_VOCAB_DIR");
    const std::string d = dir ? dir : ".cache/gpt2";
    auto t = Gpt2Tokenizer::Load({"", "", d + "/gpt2.tiktoken"});
    if (!t.ok()) std::abort();
    return *std::move(t);
  }();
  return *tok;
}

std::string Repeat(const std::string& s, size_t bytes) {
  std::string out;
  while (out.size() < bytes) out += s;
  return out;
}

const std::string kEnglish = Repeat(
    "The quick brown fox jumps over the lazy dog; it's 1234 times faster, isn't it? ", 1 << 20);
const std::string kJapanese =
    Repeat("日本語の文章は空白で区切られないので、長い断片になります。", 1 << 20);

void BM_RankLookup(benchmark::State& state) {
  const auto& vocab = Tok().vocab();
  const std::vector<std::string> words = {" the", " quick",         " brown", " tokenization",
                                          "ing",  " international", "!",      " 2026"};
  size_t i = 0;
  for (auto _ : state) {
    const std::string& w = words[i++ % words.size()];
    benchmark::DoNotOptimize(vocab.Rank(w));
  }
}
BENCHMARK(BM_RankLookup);

void Pretokenize(benchmark::State& state, const std::string& text) {
  leantron::data::Pretokenizer pre;
  for (auto _ : state) {
    size_t pieces = 0;
    const auto* p = reinterpret_cast<const uint8_t*>(text.data());
    for (const uint8_t* end = p + text.size(); p < end; ++pieces) p += pre.PieceLength(p, end);
    benchmark::DoNotOptimize(pieces);
  }
  state.SetBytesProcessed(state.iterations() * text.size());
}
BENCHMARK_CAPTURE(Pretokenize, english, kEnglish);
BENCHMARK_CAPTURE(Pretokenize, japanese, kJapanese);

void Encode(benchmark::State& state, const std::string& text) {
  std::vector<int32_t> ids;
  for (auto _ : state) {
    leantron::data::Gpt2Encoder encoder(Tok());  // cold piece cache
    ids.clear();
    encoder.EncodeOrdinary(text, &ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * text.size());
}
BENCHMARK_CAPTURE(Encode, english, kEnglish);
BENCHMARK_CAPTURE(Encode, japanese, kJapanese);

void Merge(benchmark::State& state, bool heap) {
  const std::string piece = kJapanese.substr(0, state.range(0));
  const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
  std::vector<int32_t> out;
  for (auto _ : state) {
    out.clear();
    if (heap) {
      leantron::data::BytePairEncodeHeap(Tok().vocab(), p, piece.size(), &out, INT32_MAX);
    } else {
      leantron::data::BytePairEncodeScan(Tok().vocab(), p, piece.size(), &out, INT32_MAX);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * piece.size());
}
BENCHMARK_CAPTURE(Merge, scan, false)->Arg(30)->Arg(60)->Arg(120)->Arg(240);
BENCHMARK_CAPTURE(Merge, heap, true)->Arg(30)->Arg(60)->Arg(120)->Arg(240);

}  // namespace

BENCHMARK_MAIN();
