// Unicode normalization forms as HuggingFace tokenizers computes them. Its normalizers use the
// unicode-normalization-alignments crate, whose tables are Unicode 9.0: code points assigned
// later have no decomposition there, combine with nothing and have combining class 0. ICU's
// normalizer, restricted to the code points Unicode 9.0 assigned (later ones pass through as
// boundaries), gives exactly that; Unicode's stability policy keeps the older data unchanged.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace leantron::data {

enum class UnicodeForm { kNFC, kNFD, kNFKC, kNFKD };

// Appends the normalized form of `text` (valid UTF-8) to `out`.
absl::Status NormalizeUnicodeLikeHf(UnicodeForm form, std::string_view text, std::string* out);

}  // namespace leantron::data
