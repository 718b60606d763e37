// Fuzzes the vocabulary parsers: the first byte picks the format; for Megatron's pair the rest is
// split at the first NUL into encoder.json and vocab.bpe contents. Any input must give a vocabulary
// or an error, never a crash; a vocabulary that loads must encode and decode its own tokens.
#include <cstdint>
#include <string>
#include <string_view>

#include "libdata/bpe_vocab.h"
#include "libdata/gpt2_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<leantron::data::BpeVocab> vocab;
  if (data[0] & 1) {
    vocab = leantron::data::BpeVocab::FromTiktokenText(rest, "fuzz.tiktoken");
  } else {
    const size_t nul = rest.find('\0');
    const std::string_view json = rest.substr(0, nul);
    const std::string_view merges = nul == std::string_view::npos ? "" : rest.substr(nul + 1);
    vocab = leantron::data::BpeVocab::FromMegatronText(json, "fuzz.json", merges, "fuzz.bpe");
  }
  if (!vocab.ok()) return 0;
  leantron::data::Gpt2Tokenizer tokenizer(*std::move(vocab));
  // Round trip the input itself through the loaded vocabulary.
  const std::vector<int32_t> ids = tokenizer.EncodeOrdinary(rest);
  std::string back;
  if (!tokenizer.Decode(ids, &back).ok() || back != rest) __builtin_trap();
  return 0;
}
