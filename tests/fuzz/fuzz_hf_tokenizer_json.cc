// Fuzzes the tokenizer.json parser and the HF pipeline: the input is tokenizer.json, then a NUL,
// then text. Any file must load or be refused with an error, never crash; a tokenizer that loads
// must encode the text (or refuse it with an error) and decode its own ids.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "libdata/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view json = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  absl::StatusOr<leantron::data::HfTokenizerSpec> spec =
      leantron::data::ParseHfTokenizerJson(json, "fuzz.json", "");
  if (!spec.ok()) return 0;
  absl::StatusOr<std::unique_ptr<leantron::data::Tokenizer>> t =
      leantron::data::MakeHfTokenizer(*std::move(spec));
  if (!t.ok()) return 0;
  for (bool special : {false, true}) {
    absl::StatusOr<std::vector<int32_t>> ids = (*t)->Encode(text, {special, special});
    if (!ids.ok()) continue;
    std::string back;
    // Every id the encoder produced is in the vocabulary, so decoding cannot fail on range.
    const absl::Status st = (*t)->Decode(*ids, &back);
    if (!st.ok() && st.code() == absl::StatusCode::kOutOfRange) __builtin_trap();
  }
  return 0;
}
