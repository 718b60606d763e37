#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "libdata/bpe_merge.h"
#include "libdata/bpe_vocab.h"
#include "libdata/gpt2_tokenizer.h"
#include "libfs/atomic_file.h"
#include "tests/libdata/vocab_fixture.h"

namespace leantron::data {
namespace {

using testing::Gpt2;
using testing::VocabDir;
using Ids = std::vector<int32_t>;

// tiktoken's own test vectors (tests/test_encoding.py).
TEST(Gpt2Tokenizer, TiktokenVectors) {
  EXPECT_EQ(Gpt2().EncodeOrdinary("hello world"), (Ids{31373, 995}));
  EXPECT_EQ(Gpt2().EncodeOrdinary(std::string(8, '0')), (Ids{8269}));
  EXPECT_EQ(Gpt2().EncodeOrdinary(std::string(16, '0')), (Ids{25645}));
  EXPECT_EQ(Gpt2().EncodeOrdinary(std::string(17, '0')), (Ids{8269, 10535, 830}));
  EXPECT_EQ(Gpt2().vocab_size(), 50257);
  EXPECT_EQ(Gpt2().eod_id(), 50256);
}

TEST(Gpt2Tokenizer, SpecialTokens) {
  EXPECT_EQ(Gpt2().Encode("hello <|endoftext|>", true), (Ids{31373, 220, 50256}));
  const Ids ordinary = Gpt2().EncodeOrdinary("hello <|endoftext|>");
  EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), 50256), 0);
  std::string text;
  ASSERT_TRUE(Gpt2().Decode(ordinary, &text).ok());
  EXPECT_EQ(text, "hello <|endoftext|>");
  EXPECT_EQ(Gpt2().Encode("<|endoftext|><|endoftext|>a", true), (Ids{50256, 50256, 64}));
}

TEST(Gpt2Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  std::string out;
  const absl::Status st = Gpt2().Decode(Ids{31373, 50257}, &out);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("id 50257 at position 1"), std::string::npos) << st;
  EXPECT_FALSE(Gpt2().Decode(Ids{-1}, &out).ok());
}

TEST(Gpt2Tokenizer, InvalidUtf8RoundTripsByteForByte) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    std::string back;
    ASSERT_TRUE(Gpt2().Decode(Gpt2().EncodeOrdinary(bytes), &back).ok());
    ASSERT_EQ(back, bytes);
  }
}

TEST(Gpt2Tokenizer, ScanAndHeapMergesAgree) {
  const BpeVocab& vocab = Gpt2().vocab();
  std::mt19937 rng(11);
  const std::string alphabet = "aeiou nrstlthe";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string piece(1 + rng() % 300, ' ');
    for (char& c : piece) c = alphabet[rng() % alphabet.size()];
    const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
    Ids scan, heap;
    BytePairEncodeScan(vocab, p, piece.size(), &scan, INT32_MAX);
    BytePairEncodeHeap(vocab, p, piece.size(), &heap, INT32_MAX);
    ASSERT_EQ(scan, heap) << piece;
  }
}

TEST(Gpt2Tokenizer, PathologicalInputsRoundTrip) {
  // A 1 MB word, run of spaces and run of one emoji: one piece each, merged on the heap path.
  const std::string emoji = "\xF0\x9F\x98\x80";
  std::string many_emoji;
  for (int i = 0; i < (1 << 18); ++i) many_emoji += emoji;
  for (const std::string& text :
       {std::string(1 << 20, 'a'), std::string(1 << 20, ' '), many_emoji}) {
    const Ids ids = Gpt2().EncodeOrdinary(text);
    std::string back;
    ASSERT_TRUE(Gpt2().Decode(ids, &back).ok());
    EXPECT_EQ(back, text);
  }
  // GPT-2 has no token for two spaces: a run of n spaces is n times " " (220).
  const Ids spaces = Gpt2().EncodeOrdinary(std::string(1000, ' '));
  EXPECT_EQ(spaces, Ids(1000, 220));
}

// The two file formats describe the same ranks, and writing them back gives the files' bytes.
TEST(BpeVocab, BothFormatsAgreeAndExportIsByteExact) {
  const std::string dir = VocabDir();
  auto megatron = BpeVocab::FromMegatronFiles(dir + "/encoder.json", dir + "/vocab.bpe");
  ASSERT_TRUE(megatron.ok()) << megatron.status();
  EXPECT_EQ(megatron->num_ranks(), 50256);
  auto json = fs::ReadFileToString(dir + "/encoder.json");
  auto merges = fs::ReadFileToString(dir + "/vocab.bpe");
  ASSERT_TRUE(json.ok() && merges.ok());
  EXPECT_EQ(megatron->ToEncoderJson(), *json);
  auto merges_text = megatron->ToMergesText();
  ASSERT_TRUE(merges_text.ok()) << merges_text.status();
  EXPECT_EQ(*merges_text, *merges);
  auto tiktoken = BpeVocab::FromTiktokenText(megatron->ToTiktokenText(), "x.tiktoken");
  ASSERT_TRUE(tiktoken.ok()) << tiktoken.status();
  for (int32_t r = 0; r < megatron->num_ranks(); ++r)
    ASSERT_EQ(tiktoken->TokenBytes(r), megatron->TokenBytes(r));
}

std::string ErrorOf(const absl::StatusOr<BpeVocab>& v) {
  EXPECT_FALSE(v.ok());
  return v.ok() ? "" : std::string(v.status().message());
}

TEST(BpeVocab, CorruptTiktokenFilesAreReportedWithTheirLine) {
  std::string good;
  for (int b = 0; b < 256; ++b) {
    std::string one(1, static_cast<char>(b));
    good += absl::StrCat(absl::Base64Escape(one), " ", b, "\n");
  }
  ASSERT_TRUE(BpeVocab::FromTiktokenText(good, "v.tiktoken").ok());
  EXPECT_NE(ErrorOf(BpeVocab::FromTiktokenText(good + "!!!! 256\n", "v.tiktoken"))
                .find("v.tiktoken:257: bad base64"),
            std::string::npos);
  EXPECT_NE(ErrorOf(BpeVocab::FromTiktokenText(good + "YWI= 255\n", "v.tiktoken"))
                .find("rank 255 appears twice"),
            std::string::npos);
  EXPECT_NE(ErrorOf(BpeVocab::FromTiktokenText(good + "YWI= 300\n", "v.tiktoken"))
                .find("rank 256 is missing"),
            std::string::npos);
  EXPECT_NE(ErrorOf(BpeVocab::FromTiktokenText(good + "YWI=\n", "v.tiktoken")).find("no space"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(BpeVocab::FromTiktokenText(good + "YQ== 256\n", "v.tiktoken")).find("appears twice"),
      std::string::npos);
  // Without all 256 single bytes some text could not be encoded.
  EXPECT_NE(ErrorOf(BpeVocab::FromTiktokenText("YQ== 0\n", "v.tiktoken")).find("single byte"),
            std::string::npos);
}

TEST(BpeVocab, MismatchedMegatronFilesAreReported) {
  const std::string dir = VocabDir();
  auto json = fs::ReadFileToString(dir + "/encoder.json");
  auto merges = fs::ReadFileToString(dir + "/vocab.bpe");
  ASSERT_TRUE(json.ok() && merges.ok());
  // Swap two merge lines: the ranks no longer match encoder.json.
  std::string swapped = *merges;
  const size_t l2 = swapped.find('\n') + 1, l3 = swapped.find('\n', l2) + 1,
               l4 = swapped.find('\n', l3) + 1;
  swapped = swapped.substr(0, l2) + swapped.substr(l3, l4 - l3) + swapped.substr(l2, l3 - l2) +
            swapped.substr(l4);
  EXPECT_NE(ErrorOf(BpeVocab::FromMegatronText(*json, "e.json", swapped, "v.bpe"))
                .find("mismatched files"),
            std::string::npos);
  // A merge of a token nobody made names its line.
  EXPECT_NE(ErrorOf(BpeVocab::FromMegatronText(*json, "e.json", "#version: 0.2\nzzzq \xC4\xA0\n",
                                               "v.bpe"))
                .find("v.bpe:2: merges a token that no earlier line made"),
            std::string::npos);
  EXPECT_NE(ErrorOf(BpeVocab::FromMegatronText("[1,2]", "e.json", *merges, "v.bpe"))
                .find("e.json: not a JSON object"),
            std::string::npos);
  EXPECT_NE(ErrorOf(BpeVocab::FromMegatronText(*json, "e.json", "#version\nab\n", "v.bpe"))
                .find("v.bpe:2: expected two tokens"),
            std::string::npos);
  // Truncated encoder.json.
  EXPECT_FALSE(
      BpeVocab::FromMegatronText(json->substr(0, json->size() / 2), "e.json", *merges, "v.bpe")
          .ok());
}

TEST(Gpt2Tokenizer, LoadNamesMissingFiles) {
  auto t = Gpt2Tokenizer::Load({"/nonexistent/encoder.json", "/nonexistent/vocab.bpe", ""});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("/nonexistent/"), std::string::npos);
  EXPECT_FALSE(Gpt2Tokenizer::Load({"only-one.json", "", ""}).ok());
  EXPECT_FALSE(Gpt2Tokenizer::Load({}).ok());
}

}  // namespace
}  // namespace leantron::data
