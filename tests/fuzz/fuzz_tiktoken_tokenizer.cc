// Fuzzes TikTokenizer's rank files (Megatron's JSON list and .tiktoken) with every pattern: the
// first byte picks the pattern, then the file, a NUL, and text. Any file must load or be refused;
// a loaded tokenizer encodes the text and decodes the ids back to it (tiktoken's merge rule and
// every named pattern are lossless).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "libdata/tiktoken_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const kPatterns[] = {"v1",          "v2",         "gpt2",
                                          "cl100k_base", "o200k_base", "llama3"};
  leantron::data::TokenizerOptions options;
  options.type = "TikTokenizer";
  options.model = "fuzz.tiktoken";
  options.tiktoken_pattern = kPatterns[data[0] % 6];
  options.vocab_size = 1256 + (data[0] >> 3);  // Megatron's scheme: 1000 specials, then ranks
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = input.find('\0');
  const std::string_view file = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  absl::StatusOr<std::unique_ptr<leantron::data::Tokenizer>> t =
      leantron::data::TiktokenTokenizerFromText(file, options);
  if (!t.ok()) return 0;
  absl::StatusOr<std::vector<int32_t>> ids = (*t)->Encode(text, {false, false});
  if (!ids.ok()) return 0;
  std::string back;
  if (!(*t)->Decode(*ids, &back).ok() || back != text) __builtin_trap();
  return 0;
}
