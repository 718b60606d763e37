// Decoding for HuggingFace tokenizers: ids to token strings (added tokens first, then the
// model's vocab), then the decoder chain, as the `tokenizers` library's decode. Where HF would
// show U+FFFD for bytes that are not valid UTF-8 (ByteLevel, ByteFallback), the bytes themselves
// are written, so decode(encode(x)) == x also for such input.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "libdata/hf_tokenizer.h"

namespace leantron::data {

// `added_strings[i]` is what decoding shows for spec.added[i].
absl::Status HfDecode(const HfTokenizerSpec& spec, const std::vector<std::string>& added_strings,
                      absl::Span<const int32_t> ids, std::string* out);

}  // namespace leantron::data
