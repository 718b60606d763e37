// Finds GPT-2's vocabulary for tests: $LEANTRON_VOCAB_DIR (made by scripts/get_gpt2_vocab.sh),
// else the shared copy beside the checkout.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "libdata/gpt2_tokenizer.h"

namespace leantron::data::testing {

inline std::string VocabDir() {
  if (const char* dir = std::getenv("LEANTRON_VOCAB_DIR"); dir && *dir) return dir;
  const char* root = std::getenv("LEANTRON_ROOT");
  const std::filesystem::path base = root ? root : ".";
  for (const auto& candidate : {base / ".cache/gpt2", base / "../shared/gpt2"}) {
    if (std::filesystem::exists(candidate / "encoder.json")) return candidate.string();
  }
  return "";
}

// Loads GPT-2 from encoder.json + vocab.bpe once per test binary; fails the test if absent.
inline const Gpt2Tokenizer& Gpt2() {
  static const std::unique_ptr<Gpt2Tokenizer> tokenizer = [] {
    const std::string dir = VocabDir();
    auto t = Gpt2Tokenizer::Load({dir + "/encoder.json", dir + "/vocab.bpe", ""});
    return t.ok() ? *std::move(t) : nullptr;
  }();
  if (!tokenizer) {
    ADD_FAILURE() << "GPT-2 vocabulary not found: run scripts/get_gpt2_vocab.sh";
    std::abort();
  }
  return *tokenizer;
}

}  // namespace leantron::data::testing
