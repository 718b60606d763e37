#include "libdata/preprocess.h"

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dataset_test_util.h"
#include "gtest/gtest.h"
#include "libdata/indexed_dataset.h"
#include "vocab_fixture.h"

namespace leantron::data {
namespace {

using testing::ReadAll;
using testing::ScratchDir;
using testing::WriteAll;

PreprocessOptions Options(const ScratchDir& dir, const std::string& input) {
  const std::string vocab = testing::VocabDir();
  PreprocessOptions o;
  o.inputs = {input};
  o.tokenizer.vocab_file = vocab + "/encoder.json";
  o.tokenizer.merge_file = vocab + "/vocab.bpe";
  o.output_prefix = dir / "out";
  o.append_eod = true;
  return o;
}

// A corpus with the awkward cases: empty documents, lists of sentences, two keys, non-ASCII,
// blank lines, a literal <|endoftext|>.
std::string Corpus(int documents) {
  std::mt19937 gen(11);
  const std::vector<std::string> words = {
      "the",           "data", "Grüße", "日本語", "tokens", "é",
      "<|endoftext|>", "\\n",  "12345", "  ",     "!",      "?"};
  std::string out;
  for (int d = 0; d < documents; ++d) {
    std::string text;
    const int n = static_cast<int>(gen() % 40);
    for (int w = 0; w < n; ++w) text += words[gen() % words.size()] + (gen() % 5 ? " " : ". ");
    if (d % 17 == 3) {
      out += "{\"title\": \"t" + std::to_string(d) + "\", \"text\": [\"" + text + "\", \"\", \"" +
             text + "\"]}\n";
    } else {
      out += "{\"text\": \"" + text + "\", \"title\": \"" + std::to_string(d) + "\"}\n";
    }
    if (d % 101 == 7) out += "\n";
  }
  return out;
}

TEST(PreprocessData, WorkedExample) {
  ScratchDir dir;
  WriteAll(dir / "in.jsonl", "{\"text\": \"Hello world\"}\n");
  auto stats = PreprocessData(Options(dir, dir / "in.jsonl"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 1);
  EXPECT_EQ(ReadAll(dir / "out_text_document.bin"), std::string("\x88\x3c\xe3\x03\x50\xc4", 6));
  EXPECT_EQ(ReadAll(dir / "out_text_document.idx").size(), 62u);
}

TEST(PreprocessData, OutputIsIdenticalForAnyWorkerCount) {
  ScratchDir dir;
  WriteAll(dir / "in.jsonl", Corpus(3000));
  std::string reference_bin, reference_idx;
  for (const int workers : {1, 2, 5}) {
    PreprocessOptions o = Options(dir, dir / "in.jsonl");
    o.workers = workers;
    o.json_keys = {"text", "title"};
    auto stats = PreprocessData(o);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->documents, 3000);
    const std::string bin = ReadAll(dir / "out_text_document.bin");
    const std::string idx = ReadAll(dir / "out_text_document.idx");
    if (workers == 1) {
      reference_bin = bin;
      reference_idx = idx;
      auto ds = IndexedDataset::Open(dir / "out_title_document");
      ASSERT_TRUE(ds.ok()) << ds.status();
      EXPECT_EQ(ds->num_documents(), 3000);
    } else {
      EXPECT_EQ(bin, reference_bin) << workers;
      EXPECT_EQ(idx, reference_idx) << workers;
    }
  }
}

TEST(PreprocessData, SentenceLevelWritesOneSequencePerSentence) {
  ScratchDir dir;
  WriteAll(
      dir / "in.jsonl",
      "{\"text\": \"First one. Second one! Third?\"}\n{\"text\": \"\"}\n{\"text\": \"Solo\"}\n");
  PreprocessOptions o = Options(dir, dir / "in.jsonl");
  o.split_sentences = true;
  auto stats = PreprocessData(o);
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto ds = IndexedDataset::Open(dir / "out_text_sentence");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->num_documents(), 3);
  EXPECT_EQ(ds->num_sequences(), 4);
  EXPECT_EQ(ds->document_index(1), 3);
  EXPECT_EQ(ds->document_index(2), 3);  // the empty document: a repeated boundary, no EOD
  std::vector<int64_t> last;
  ASSERT_TRUE(ds->ReadTokens(2, &last).ok());
  EXPECT_EQ(last.back(), 50256);  // EOD counted in the last sentence of the document
}

TEST(PreprocessData, EndOfTextInsideADocument) {
  ScratchDir dir;
  WriteAll(dir / "in.jsonl", "{\"text\": \"a<|endoftext|>b\"}\n");
  PreprocessOptions o = Options(dir, dir / "in.jsonl");
  o.append_eod = false;
  ASSERT_TRUE(PreprocessData(o).ok());
  auto text = IndexedDataset::Open(dir / "out_text_document");
  ASSERT_TRUE(text.ok());
  std::vector<int64_t> as_text;
  ASSERT_TRUE(text->ReadTokens(0, &as_text).ok());
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 50256), 0);
  o.eod_in_text_is_special = true;
  o.output_prefix = dir / "special";
  ASSERT_TRUE(PreprocessData(o).ok());
  auto special = IndexedDataset::Open(dir / "special_text_document");
  ASSERT_TRUE(special.ok());
  std::vector<int64_t> as_special;
  ASSERT_TRUE(special->ReadTokens(0, &as_special).ok());
  EXPECT_EQ(as_special, (std::vector<int64_t>{64, 50256, 65}));
}

struct BadInput {
  std::string line;
  std::string message;
};

TEST(PreprocessData, BadInputNamesFileAndLineAndLeavesNoOutput) {
  const std::vector<BadInput> cases = {
      {"{\"text\": \"unterminated}", "malformed JSON"},
      {"{\"body\": \"no text key\"}", "missing key \"text\""},
      {"{\"text\": 42}", "not a string"},
      {"{\"text\": [\"ok\", 7]}", "non-string"},
      {"[\"not\", \"an object\"]", "not a JSON object"},
      {"{\"text\": \"bad \xff byte\"}", "invalid UTF-8"},
      {"{\"text\": \"x\"} trailing", "malformed JSON"},
  };
  for (const BadInput& c : cases) {
    ScratchDir dir;
    WriteAll(dir / "in.jsonl", "{\"text\": \"fine\"}\n\n" + c.line + "\n{\"text\": \"fine\"}\n");
    auto stats = PreprocessData(Options(dir, dir / "in.jsonl"));
    ASSERT_FALSE(stats.ok()) << c.line;
    const std::string message(stats.status().message());
    EXPECT_NE(message.find("in.jsonl:3:"), std::string::npos) << message;
    EXPECT_NE(message.find(c.message), std::string::npos) << message;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      EXPECT_EQ(entry.path().filename(), "in.jsonl") << "left behind: " << entry.path();
    }
    PreprocessOptions skip = Options(dir, dir / "in.jsonl");
    skip.skip_invalid = true;
    auto skipped = PreprocessData(skip);
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(skipped->invalid_skipped, 1);
    EXPECT_EQ(skipped->documents, 2);
    EXPECT_NE(skipped->first_invalid.find("in.jsonl:3:"), std::string::npos);
  }
}

TEST(PreprocessData, CorruptZstdInputIsAnError) {
  ScratchDir dir;
  WriteAll(dir / "in.jsonl.zst", "\x28\xb5\x2f\xfd garbage that is not a zstd frame");
  auto stats = PreprocessData(Options(dir, dir / "in.jsonl.zst"));
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("in.jsonl.zst"), std::string::npos) << stats.status();
  EXPECT_FALSE(std::filesystem::exists(dir / "out_text_document.idx"));
}

}  // namespace
}  // namespace leantron::data
