// Fuzzes the pre-tokenizer and both merge algorithms on arbitrary bytes with a small vocabulary
// built here (the 256 bytes plus merges of frequent ASCII and UTF-8 pairs): encoding must never
// crash, must decode back to the input, must not depend on where safe splits cut the text, and
// the scan and heap merges must agree on every piece.
#include <cstdint>
#include <string>
#include <vector>

#include "libdata/bpe_merge.h"
#include "libdata/bpe_vocab.h"
#include "libdata/gpt2_tokenizer.h"
#include "libdata/pretokenizer.h"

namespace {

const leantron::data::Gpt2Tokenizer& Tokenizer() {
  static const leantron::data::Gpt2Tokenizer* tokenizer = [] {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    const char* pairs[] = {" t", "he", "in", " a", "er", "an", "\xE3\x81", "\xF0\x9F", "  "};
    for (const char* p : pairs) tokens.emplace_back(p);
    for (const char* p : {" the", "ing", "  the", "\xE3\x81\x82", " \xF0\x9F"})
      tokens.emplace_back(p);
    auto vocab = leantron::data::BpeVocab::FromTokens(tokens);
    if (!vocab.ok()) __builtin_trap();
    return new leantron::data::Gpt2Tokenizer(*std::move(vocab));
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& tok = Tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok.EncodeOrdinary(text);
  std::string back;
  if (!tok.Decode(ids, &back).ok() || back != text) __builtin_trap();
  // Encoding the parts between safe split points gives the same ids.
  std::vector<int32_t> parts;
  leantron::data::Gpt2Encoder encoder(tok);
  size_t start = 0;
  for (size_t i = 1; i < size; ++i) {
    if (leantron::data::IsSafeSplit(data, i)) {
      encoder.EncodeOrdinary(text.substr(start, i - start), &parts);
      start = i;
    }
  }
  encoder.EncodeOrdinary(text.substr(start), &parts);
  if (parts != ids) __builtin_trap();
  // Scan and heap merges agree on every piece.
  leantron::data::Pretokenizer pre;
  for (const uint8_t *p = data, *end = data + size; p < end;) {
    const size_t n = pre.PieceLength(p, end);
    std::vector<int32_t> scan, heap;
    leantron::data::BytePairEncodeScan(tok.vocab(), p, n, &scan, INT32_MAX);
    leantron::data::BytePairEncodeHeap(tok.vocab(), p, n, &heap, INT32_MAX);
    if (scan != heap) __builtin_trap();
    p += n;
  }
  return 0;
}
