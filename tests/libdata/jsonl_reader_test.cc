#include "libdata/jsonl_reader.h"

#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "dataset_test_util.h"
#include "gtest/gtest.h"

namespace leantron::data {
namespace {

using testing::ScratchDir;
using testing::WriteAll;

// With a content checksum, as the zstd command line writes by default.
std::string Zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  const size_t n = ZSTD_compress2(cctx, out.data(), out.size(), text.data(), text.size());
  ZSTD_freeCCtx(cctx);
  out.resize(n);
  return out;
}

void WriteGzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
}

absl::StatusOr<std::vector<std::string>> ReadLines(const std::string& path,
                                                   std::vector<int64_t>* numbers = nullptr) {
  auto reader = LineReader::Open(path);
  if (!reader.ok()) return reader.status();
  std::vector<std::string> lines;
  for (;;) {
    std::string_view line;
    absl::StatusOr<bool> more = (*reader)->Next(&line);
    if (!more.ok()) return more.status();
    if (!*more) break;
    lines.emplace_back(line);
    if (numbers) numbers->push_back((*reader)->line_number());
  }
  return lines;
}

std::string Corpus() {
  std::string text;
  for (int i = 0; i < 5000; ++i) {
    text += "{\"text\": \"line " + std::to_string(i) +
            std::string(static_cast<size_t>(i % 300), 'x') + "\"}\n";
  }
  text += std::string(3 << 20, 'y');  // One line longer than the read buffer, no final newline.
  return text;
}

TEST(LineReader, PlainZstdAndGzipGiveTheSameLines) {
  ScratchDir dir;
  const std::string text = Corpus();
  WriteAll(dir / "a.jsonl", text);
  WriteAll(dir / "a.jsonl.zst", Zstd(text));
  WriteGzip(dir / "a.jsonl.gz", text);
  std::vector<int64_t> numbers;
  auto plain = ReadLines(dir / "a.jsonl", &numbers);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->size(), 5001u);
  EXPECT_EQ((*plain)[7], "{\"text\": \"line 7xxxxxxx\"}");
  EXPECT_EQ((*plain)[5000].size(), size_t{3} << 20);
  EXPECT_EQ(numbers.back(), 5001);
  auto zst = ReadLines(dir / "a.jsonl.zst");
  ASSERT_TRUE(zst.ok()) << zst.status();
  EXPECT_EQ(*zst, *plain);
  auto gz = ReadLines(dir / "a.jsonl.gz");
  ASSERT_TRUE(gz.ok()) << gz.status();
  EXPECT_EQ(*gz, *plain);
}

TEST(LineReader, EmptyLinesAndCarriageReturnsAreKept) {
  ScratchDir dir;
  WriteAll(dir / "b.jsonl", "a\n\nb\r\n");
  auto lines = ReadLines(dir / "b.jsonl");
  ASSERT_TRUE(lines.ok());
  EXPECT_EQ(*lines, (std::vector<std::string>{"a", "", "b\r"}));
}

TEST(LineReader, TruncatedOrCorruptZstdIsAnError) {
  ScratchDir dir;
  const std::string packed = Zstd(Corpus());
  WriteAll(dir / "cut.jsonl.zst", packed.substr(0, packed.size() / 2));
  auto cut = ReadLines(dir / "cut.jsonl.zst");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("cut.jsonl.zst"), std::string::npos) << cut.status();
  EXPECT_NE(cut.status().message().find("truncated"), std::string::npos) << cut.status();
  std::string corrupt = packed;
  for (size_t i = 100; i < 200; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
  WriteAll(dir / "bad.jsonl.zst", corrupt);
  auto bad = ReadLines(dir / "bad.jsonl.zst");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.jsonl.zst"), std::string::npos) << bad.status();
  WriteAll(dir / "junk.zst", "this is not zstd at all\n");
  EXPECT_FALSE(ReadLines(dir / "junk.zst").ok());
}

TEST(LineReader, TruncatedGzipIsAnError) {
  ScratchDir dir;
  WriteGzip(dir / "full.jsonl.gz", Corpus());
  const std::string packed = testing::ReadAll(dir / "full.jsonl.gz");
  WriteAll(dir / "cut.jsonl.gz", packed.substr(0, packed.size() / 2));
  auto cut = ReadLines(dir / "cut.jsonl.gz");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("cut.jsonl.gz"), std::string::npos) << cut.status();
}

TEST(ExpandInputs, FilesGlobsAndDirectoriesInOrder) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path() / "d/sub");
  for (const char* name :
       {"d/b.jsonl", "d/a.jsonl.zst", "d/sub/c.json.gz", "d/notes.txt", "x1.jsonl", "x2.jsonl"}) {
    WriteAll(dir / name, "");
  }
  auto files = ExpandInputs({dir / "x2.jsonl", dir / "d", dir / "x*.jsonl"});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{dir / "x2.jsonl", dir / "d/a.jsonl.zst",
                                              dir / "d/b.jsonl", dir / "d/sub/c.json.gz",
                                              dir / "x1.jsonl", dir / "x2.jsonl"}));
  EXPECT_FALSE(ExpandInputs({dir / "missing.jsonl"}).ok());
  EXPECT_FALSE(ExpandInputs({dir / "nomatch*.jsonl"}).ok());
}

}  // namespace
}  // namespace leantron::data
