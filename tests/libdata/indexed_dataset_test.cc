#include "libdata/indexed_dataset.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dataset_test_util.h"
#include "gtest/gtest.h"
#include "libdata/indexed_dataset_builder.h"

namespace leantron::data {
namespace {

using testing::ReadAll;
using testing::ScratchDir;
using testing::WriteAll;

std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string I64(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string I32(int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

// The .idx Megatron writes, assembled field by field from the spec's table.
std::string ExpectedIdx(uint8_t code, const std::vector<int32_t>& lengths,
                        const std::vector<int64_t>& doc_index, int64_t item_size) {
  std::string idx("MMIDIDX\0\0", 9);
  idx += U64(1);
  idx.push_back(static_cast<char>(code));
  idx += U64(lengths.size());
  idx += U64(doc_index.size());
  for (int32_t n : lengths) idx += I32(n);
  int64_t ptr = 0;
  for (int32_t n : lengths) {
    idx += I64(ptr);
    ptr += n * item_size;
  }
  for (int64_t d : doc_index) idx += I64(d);
  return idx;
}

TEST(IndexedDatasetBuilder, WorkedExampleGoldenBytes) {
  ScratchDir dir;
  const std::string prefix = dir / "hello";
  auto builder = IndexedDatasetBuilder::Create(prefix, DType::kUInt16);
  ASSERT_TRUE(builder.ok()) << builder.status();
  const std::vector<int32_t> tokens = {15496, 995, 50256};
  const std::vector<int32_t> lengths = {3};
  ASSERT_TRUE((*builder)->AddDocument(tokens, lengths).ok());
  ASSERT_TRUE((*builder)->Finalize().ok());
  EXPECT_EQ(ReadAll(prefix + ".bin"), std::string("\x88\x3c\xe3\x03\x50\xc4", 6));
  const std::string idx = ReadAll(prefix + ".idx");
  // 34-byte header + 4 (length) + 8 (pointer) + 16 (document index 0 1).
  EXPECT_EQ(idx.size(), 62u);
  EXPECT_EQ(idx, ExpectedIdx(8, {3}, {0, 1}, 2));
  const std::string golden(
      "MMIDIDX\0\0"
      "\x01\0\0\0\0\0\0\0"
      "\x08"
      "\x01\0\0\0\0\0\0\0"
      "\x02\0\0\0\0\0\0\0"
      "\x03\0\0\0"
      "\0\0\0\0\0\0\0\0"
      "\0\0\0\0\0\0\0\0"
      "\x01\0\0\0\0\0\0\0",
      62);
  EXPECT_EQ(idx, golden);
}

TEST(IndexedDatasetBuilder, EveryDTypeRoundTrips) {
  ScratchDir dir;
  const std::vector<int64_t> values = {0, 1, 2, 100, 7, 127};
  for (uint8_t code = 1; code <= 8; ++code) {
    const DType dtype = *DTypeFromCode(code);
    const std::string prefix = dir / ("dtype" + std::to_string(code));
    auto builder = IndexedDatasetBuilder::Create(prefix, dtype);
    ASSERT_TRUE(builder.ok());
    ASSERT_TRUE((*builder)->AddItem(absl::MakeConstSpan(values.data(), 4)).ok());
    ASSERT_TRUE((*builder)->AddItem(absl::MakeConstSpan(values.data() + 4, 2)).ok());
    ASSERT_TRUE((*builder)->EndDocument().ok());
    ASSERT_TRUE((*builder)->Finalize().ok());
    const int64_t item = static_cast<int64_t>(DTypeSize(dtype));
    EXPECT_EQ(ReadAll(prefix + ".idx"), ExpectedIdx(code, {4, 2}, {0, 2}, item)) << int{code};
    EXPECT_EQ(ReadAll(prefix + ".bin").size(), static_cast<size_t>(6 * item));
    auto ds = IndexedDataset::Open(prefix);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ(ds->dtype(), dtype);
    std::vector<int64_t> got;
    ASSERT_TRUE(ds->ReadTokens(0, &got).ok());
    ASSERT_TRUE(ds->ReadTokens(1, &got).ok());
    EXPECT_EQ(got, values) << DTypeName(dtype);
  }
}

TEST(IndexedDatasetBuilder, EmptyDocumentsRepeatTheBoundary) {
  ScratchDir dir;
  const std::string prefix = dir / "empty";
  auto builder = IndexedDatasetBuilder::Create(prefix, DType::kUInt16);
  ASSERT_TRUE(builder.ok());
  const std::vector<int32_t> none;
  const std::vector<int32_t> a = {1, 2, 3}, a_len = {3};
  ASSERT_TRUE((*builder)->AddDocument(none, none).ok());
  ASSERT_TRUE((*builder)->AddDocument(a, a_len).ok());
  ASSERT_TRUE((*builder)->AddDocument(none, none).ok());
  ASSERT_TRUE((*builder)->Finalize().ok());
  EXPECT_EQ(ReadAll(prefix + ".idx"), ExpectedIdx(8, {3}, {0, 0, 1, 1}, 2));
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->num_documents(), 3);
  EXPECT_EQ(ds->num_sequences(), 1);
}

TEST(IndexedDatasetBuilder, SentenceLevelDocuments) {
  ScratchDir dir;
  const std::string prefix = dir / "sentences";
  auto builder = IndexedDatasetBuilder::Create(prefix, DType::kInt32);
  ASSERT_TRUE(builder.ok());
  const std::vector<int32_t> doc1 = {10, 11, 12, 13, 14, 15}, doc1_len = {2, 3, 1};
  const std::vector<int32_t> doc2 = {70000, 5}, doc2_len = {2};
  ASSERT_TRUE((*builder)->AddDocument(doc1, doc1_len).ok());
  ASSERT_TRUE((*builder)->AddDocument(doc2, doc2_len).ok());
  ASSERT_TRUE((*builder)->Finalize().ok());
  EXPECT_EQ(ReadAll(prefix + ".idx"), ExpectedIdx(4, {2, 3, 1, 2}, {0, 3, 4}, 4));
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok());
  std::vector<int64_t> got;
  ASSERT_TRUE(ds->ReadTokens(3, &got).ok());
  EXPECT_EQ(got, (std::vector<int64_t>{70000, 5}));
  EXPECT_EQ(ds->document_index(1), 3);
}

TEST(IndexedDatasetBuilder, RejectsValuesOutsideTheDType) {
  ScratchDir dir;
  auto builder = IndexedDatasetBuilder::Create(dir / "small", DType::kUInt16);
  ASSERT_TRUE(builder.ok());
  const std::vector<int32_t> bad = {1, 70000};
  const absl::Status s = (*builder)->AddItem(bad);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("70000"), std::string::npos) << s;
}

TEST(IndexedDatasetBuilder, AbandonedBuilderLeavesNoFiles) {
  ScratchDir dir;
  {
    auto builder = IndexedDatasetBuilder::Create(dir / "gone", DType::kUInt16);
    ASSERT_TRUE(builder.ok());
    const std::vector<int32_t> t = {1, 2};
    ASSERT_TRUE((*builder)->AddItem(t).ok());
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(IndexedDatasetBuilder, LargeDatasetSpoolsAndMatches) {
  ScratchDir dir;
  const std::string prefix = dir / "large";
  auto builder = IndexedDatasetBuilder::Create(prefix, DType::kUInt16);
  ASSERT_TRUE(builder.ok());
  std::vector<int32_t> lengths;
  std::vector<int64_t> docs = {0};
  std::vector<int32_t> tokens;
  for (int i = 0; i < 200000; ++i) {  // Spool buffers (1 MiB) overflow several times.
    tokens.assign(static_cast<size_t>(i % 7), i % 50000);
    const std::vector<int32_t> len = {static_cast<int32_t>(tokens.size())};
    ASSERT_TRUE((*builder)->AddItem(tokens).ok());
    lengths.push_back(len[0]);
    if (i % 3 == 2) {
      ASSERT_TRUE((*builder)->EndDocument().ok());
      docs.push_back(static_cast<int64_t>(lengths.size()));
    }
  }
  ASSERT_TRUE((*builder)->Finalize().ok());
  EXPECT_EQ(ReadAll(prefix + ".idx"), ExpectedIdx(8, lengths, docs, 2));
}

TEST(MergeDatasets, MatchesMegatronSemantics) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "parts");
  // b before a in creation order: the merge must use sorted prefix order.
  for (const std::string name : {"b", "a"}) {
    auto builder = IndexedDatasetBuilder::Create(dir / ("parts/" + name), DType::kUInt16);
    ASSERT_TRUE(builder.ok());
    const int32_t base = name == "a" ? 100 : 200;
    const std::vector<int32_t> t = {base, base + 1, base + 2}, len = {1, 2}, none;
    ASSERT_TRUE((*builder)->AddDocument(t, len).ok());
    ASSERT_TRUE((*builder)->AddDocument(none, none).ok());
    ASSERT_TRUE((*builder)->Finalize().ok());
  }
  auto merged = MergeDatasetDirectory(dir / "parts", dir / "merged");
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->size(), 2u);
  EXPECT_EQ(ReadAll(dir / "merged.idx"), ExpectedIdx(8, {1, 2, 1, 2}, {0, 2, 2, 4, 4}, 2));
  EXPECT_EQ(ReadAll(dir / "merged.bin"),
            ReadAll(dir / "parts/a.bin") + ReadAll(dir / "parts/b.bin"));
}

TEST(MergeDatasets, RejectsMixedDTypesAndLonelyFiles) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "parts");
  for (const auto& [name, dtype] :
       {std::pair{"a", DType::kUInt16}, std::pair{"b", DType::kInt32}}) {
    auto builder = IndexedDatasetBuilder::Create(dir / ("parts/" + std::string(name)), dtype);
    ASSERT_TRUE(builder.ok());
    ASSERT_TRUE((*builder)->Finalize().ok());
  }
  auto merged = MergeDatasetDirectory(dir / "parts", dir / "merged");
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("dtype"), std::string::npos) << merged.status();
  EXPECT_FALSE(std::filesystem::exists(dir / "merged.idx"));
  EXPECT_FALSE(std::filesystem::exists(dir / "merged.bin"));
  std::filesystem::remove(dir / "parts/b.idx");
  merged = MergeDatasetDirectory(dir / "parts", dir / "merged");
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("b.bin"), std::string::npos) << merged.status();
}

// A reader must reject every truncation and several corruptions with an error naming the file.
TEST(IndexedDataset, TruncatedOrCorruptFilesAreErrors) {
  ScratchDir dir;
  const std::string prefix = dir / "ok";
  {
    auto builder = IndexedDatasetBuilder::Create(prefix, DType::kUInt16);
    ASSERT_TRUE(builder.ok());
    const std::vector<int32_t> t = {1, 2, 3, 4, 5}, len = {2, 3}, none;
    ASSERT_TRUE((*builder)->AddDocument(t, len).ok());
    ASSERT_TRUE((*builder)->AddDocument(none, none).ok());
    ASSERT_TRUE((*builder)->Finalize().ok());
  }
  const std::string idx = ReadAll(prefix + ".idx");
  const std::string bin = ReadAll(prefix + ".bin");
  const std::string bad = dir / "bad";
  for (size_t cut = 0; cut < idx.size(); ++cut) {
    WriteAll(bad + ".idx", idx.substr(0, cut));
    WriteAll(bad + ".bin", bin);
    auto ds = IndexedDataset::Open(bad);
    ASSERT_FALSE(ds.ok()) << "idx cut at " << cut;
    EXPECT_NE(ds.status().message().find("bad.idx"), std::string::npos) << ds.status();
  }
  for (size_t cut = 0; cut < bin.size(); ++cut) {
    WriteAll(bad + ".idx", idx);
    WriteAll(bad + ".bin", bin.substr(0, cut));
    auto ds = IndexedDataset::Open(bad);
    ASSERT_FALSE(ds.ok()) << "bin cut at " << cut;
    EXPECT_NE(ds.status().message().find("bad.bin"), std::string::npos) << ds.status();
  }
  struct Corruption {
    size_t offset;
    std::string bytes;
    std::string expect;
  };
  const std::vector<Corruption> corruptions = {
      {0, "X", "magic"},
      {9, U64(2), "version"},
      {17, std::string(1, '\x09'), "dtype"},
      {18, U64(5), "implies"},
      {18, U64(~uint64_t{0}), "exceed"},
      {34, I32(-1), "negative"},
      {34 + 8, I64(1 << 20), "beyond"},
      {34 + 24, I64(1), "first document index"},
      {34 + 24 + 8, I64(3), "not a non-decreasing"},
      {34 + 24 + 16, I64(1), "document index entry 2"},
  };
  for (const Corruption& c : corruptions) {
    std::string corrupt = idx;
    corrupt.replace(c.offset, c.bytes.size(), c.bytes);
    WriteAll(bad + ".idx", corrupt);
    WriteAll(bad + ".bin", bin);
    auto ds = IndexedDataset::Open(bad);
    ASSERT_FALSE(ds.ok()) << c.expect;
    EXPECT_NE(ds.status().message().find(c.expect), std::string::npos) << ds.status();
  }
  std::filesystem::remove(bad + ".bin");
  auto missing = IndexedDataset::Open(bad);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("bad.bin"), std::string::npos);
}

TEST(IndexedDataset, ReadTokensChecksBounds) {
  ScratchDir dir;
  const std::string prefix = dir / "b";
  auto builder = IndexedDatasetBuilder::Create(prefix, DType::kUInt16);
  ASSERT_TRUE(builder.ok());
  const std::vector<int32_t> t = {1, 2, 3};
  ASSERT_TRUE((*builder)->AddItem(t).ok());
  ASSERT_TRUE((*builder)->EndDocument().ok());
  ASSERT_TRUE((*builder)->Finalize().ok());
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok());
  std::vector<int64_t> out;
  EXPECT_TRUE(ds->ReadTokens(0, 1, 2, &out).ok());
  EXPECT_EQ(out, (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(ds->ReadTokens(0, 2, 2, &out).ok());
  EXPECT_FALSE(ds->ReadTokens(1, 0, 1, &out).ok());
  EXPECT_FALSE(ds->ReadTokens(-1, 0, 1, &out).ok());
}

TEST(IndexedDataset, FloatingPointValuesThatAreNoTokensAreErrors) {
  // A .bin of f64 values written by something else: 3.0 is a token, 2.5 and 1e300 are not.
  ScratchDir dir;
  const std::string prefix = dir / "f";
  auto builder = IndexedDatasetBuilder::Create(prefix, DType::kFloat64);
  ASSERT_TRUE(builder.ok());
  const std::vector<int64_t> t = {3, 4, 5};
  ASSERT_TRUE((*builder)->AddItem(absl::MakeConstSpan(t)).ok());
  ASSERT_TRUE((*builder)->EndDocument().ok());
  ASSERT_TRUE((*builder)->Finalize().ok());
  std::string bin = ReadAll(prefix + ".bin");
  const double values[3] = {3.0, 2.5, 1e300};
  std::memcpy(bin.data(), values, sizeof(values));
  WriteAll(prefix + ".bin", bin);
  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  std::vector<int64_t> out;
  EXPECT_TRUE(ds->ReadTokens(0, 0, 1, &out).ok());
  EXPECT_EQ(out, (std::vector<int64_t>{3}));
  const absl::Status st = ds->ReadTokens(0, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sequence 0 token 1"), std::string::npos) << st;
  EXPECT_EQ(out, (std::vector<int64_t>{3})) << "nothing appended on error";
}

}  // namespace
}  // namespace leantron::data
