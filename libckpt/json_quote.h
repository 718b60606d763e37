// JSON string quoting for the headers and indexes libckpt writes.
#pragma once

#include <string>
#include <string_view>

namespace leantron::ckpt {

// Quotes and escapes `text` as a JSON string the way serde_json does (so our safetensors headers
// are byte-identical to the reference writer's).
std::string JsonQuote(std::string_view text);

}  // namespace leantron::ckpt
