// Fuzzes the SentencePiece model reader (protobuf wire format), the normalizer's charsmap trie and
// BPE encoding: the input is a model, then the text after its last 0xFF 0xFE pair. Any model
// must load or be refused, never crash; a loaded one encodes the text and decodes its ids.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "libdata/sentencepiece_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.rfind("\xFF\xFE");
  const std::string_view model = input.substr(0, cut);
  const std::string_view text = cut == std::string_view::npos ? "" : input.substr(cut + 2);
  absl::StatusOr<std::unique_ptr<leantron::data::Tokenizer>> t =
      leantron::data::SentencePieceTokenizerFromBytes(model, "fuzz.model",
                                                      "SentencePieceTokenizer");
  if (!t.ok()) return 0;
  absl::StatusOr<std::vector<int32_t>> ids = (*t)->Encode(text, {});
  if (!ids.ok()) return 0;
  std::string back;
  const absl::Status st = (*t)->Decode(*ids, &back);
  if (!st.ok() && st.code() == absl::StatusCode::kOutOfRange) __builtin_trap();
  return 0;
}
