// safetensors reader/writer: round trips, byte layout, and every rejection rule of the reference
// reader (the interop tests check the same files against the Python package).
#include "libckpt/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "libckpt/safetensors_writer.h"
#include "libfs/atomic_file.h"

namespace leantron::ckpt {
namespace {

std::string TempPath(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("libckpt_st_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::vector<std::byte> MakeFile(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> file(8 + header.size() + data_bytes, std::byte{0});
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(file.data() + 8, header.data(), header.size());
  return file;
}

absl::Status Parse(const std::string& header, size_t data_bytes) {
  auto file = MakeFile(header, data_bytes);
  return ParseSafetensorsHeader(file, "t.safetensors").status();
}

TEST(SafetensorsTest, WriteThenReadRoundTrip) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<int64_t> b = {42};
  std::vector<uint16_t> c = {0x3c00, 0xc000};
  std::string path = TempPath("round.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{{"a", DType::kF32, {2, 3}}, std::as_bytes(std::span(a))},
                                      {{"b", DType::kI64, {}}, std::as_bytes(std::span(b))},
                                      {{"c", DType::kF16, {2}}, std::as_bytes(std::span(c))},
                                      {{"empty", DType::kF32, {0, 4}}, {}}})
                  .ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 4u);
  // HF order: widest dtype first (I64 > F32 > F16), then name.
  EXPECT_EQ((*file)->tensors()[0].name, "b");
  auto view = (*file)->Get("a");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->info->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(view->data.data(), a.data(), 24), 0);
  EXPECT_EQ((*file)->Get("b")->info->shape.size(), 0u);
  EXPECT_EQ((*file)->Get("empty")->data.size(), 0u);
  ASSERT_EQ((*file)->metadata().size(), 1u);
  EXPECT_EQ((*file)->metadata()[0].second, "pt");
  auto missing = (*file)->Get("zzz");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("zzz"), std::string::npos);
  // 8 + header length is a multiple of 8, so the data buffer starts aligned.
  EXPECT_EQ((std::filesystem::file_size(path) - 36) % 8, 0u);
}

TEST(SafetensorsTest, HeaderIsPaddedToEightWithSpaces) {
  std::vector<uint64_t> offsets;
  std::string header =
      BuildSafetensorsHeader({{"x", DType::kU8, {3}}}, {{"format", "pt"}}, &offsets);
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header.substr(0, 42), R"({"__metadata__":{"format":"pt"},"x":{"dtyp)");
  EXPECT_EQ(header.back(), ' ');
}

TEST(SafetensorsTest, WriterRejectsWrongSizesAndMissingTensors) {
  std::string path = TempPath("bad.safetensors");
  auto writer = SafetensorsWriter::Create(path, {{"a", DType::kF32, {2}}, {"b", DType::kF32, {1}}});
  ASSERT_TRUE(writer.ok());
  std::vector<float> three(3);
  EXPECT_FALSE((*writer)->Write("a", std::as_bytes(std::span(three))).ok());
  EXPECT_FALSE((*writer)->Write("nope", {}).ok());
  std::vector<float> two(2);
  EXPECT_TRUE((*writer)->Write("a", std::as_bytes(std::span(two))).ok());
  EXPECT_FALSE((*writer)->Write("a", std::as_bytes(std::span(two))).ok());
  EXPECT_FALSE((*writer)->Finish().ok());  // "b" missing.
  writer->reset();
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_FALSE(
      SafetensorsWriter::Create(path, {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}).ok());
}

TEST(SafetensorsTest, AppendedPiecesMakeTheFileWriteMakes) {
  // Two tensors written in pieces of odd sizes, interleaved, against the same tensors written
  // whole: the same bytes, header checksums included (XXH3 streamed over the pieces).
  std::vector<uint8_t> a(4000 * 4), b(37);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7 + i / 251);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(200 - i);
  const std::vector<TensorSpec> specs = {{"a", DType::kF32, {4000}}, {"b", DType::kU8, {37}}};
  const std::string whole_path = TempPath("whole.safetensors");
  const std::string pieces_path = TempPath("pieces.safetensors");
  auto whole = SafetensorsWriter::Create(whole_path, specs, {{"format", "pt"}}, true);
  ASSERT_TRUE(whole.ok());
  ASSERT_TRUE((*whole)->Write("b", std::as_bytes(std::span(b))).ok());
  ASSERT_TRUE((*whole)->Write("a", std::as_bytes(std::span(a))).ok());
  ASSERT_TRUE((*whole)->Finish().ok());
  auto pieces = SafetensorsWriter::Create(pieces_path, specs, {{"format", "pt"}}, true);
  ASSERT_TRUE(pieces.ok());
  const auto bytes_a = std::as_bytes(std::span(a));
  const auto bytes_b = std::as_bytes(std::span(b));
  size_t at_a = 0, at_b = 0;
  for (size_t step = 1; at_a < bytes_a.size() || at_b < bytes_b.size();
       step = step * 3 % 1021 + 1) {
    const size_t n = std::min(step, bytes_a.size() - at_a);
    if (n > 0) {
      ASSERT_TRUE((*pieces)->Append("a", bytes_a.subspan(at_a, n)).ok());
    }
    at_a += n;
    const size_t m = std::min<size_t>(5, bytes_b.size() - at_b);
    if (m > 0) {
      ASSERT_TRUE((*pieces)->Append("b", bytes_b.subspan(at_b, m)).ok());
    }
    at_b += m;
  }
  EXPECT_FALSE((*pieces)->Append("b", bytes_b.subspan(0, 1)).ok());  // Complete: written twice.
  ASSERT_TRUE((*pieces)->Finish().ok());
  auto read = [](const std::string& path) { return *fs::ReadFileToString(path); };
  EXPECT_EQ(read(pieces_path), read(whole_path));
  auto file = SafetensorsFile::Open(pieces_path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(std::memcmp((*file)->Get("a")->data.data(), a.data(), a.size()), 0);

  // Too many bytes, a Write after a piece, a tensor left half written.
  const std::string bad_path = TempPath("half.safetensors");
  auto bad = SafetensorsWriter::Create(bad_path, specs, {{"format", "pt"}}, true);
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE((*bad)->Append("b", std::as_bytes(std::span(a)).subspan(0, 38)).ok());
  ASSERT_TRUE((*bad)->Append("b", bytes_b.subspan(0, 10)).ok());
  EXPECT_FALSE((*bad)->Write("b", bytes_b).ok());
  ASSERT_TRUE((*bad)->Write("a", bytes_a).ok());
  const absl::Status finish = (*bad)->Finish();
  EXPECT_FALSE(finish.ok());
  EXPECT_NE(finish.message().find("'b' got only 10 of its 37 bytes"), std::string::npos) << finish;
}

TEST(SafetensorsTest, AcceptsWhatTheReferenceAccepts) {
  const std::string t = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  EXPECT_TRUE(Parse("{" + t + "}", 4).ok());
  EXPECT_TRUE(Parse(" {" + t + "}  ", 4).ok());  // Whitespace, no padding to 8 required.
  EXPECT_TRUE(Parse(R"({"__metadata__":null,)" + t + "}", 4).ok());
  EXPECT_TRUE(Parse(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4).ok());
  EXPECT_TRUE(Parse("{}", 0).ok());
  EXPECT_TRUE(Parse(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})", 8).ok());
  EXPECT_TRUE(Parse(R"({"z":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}})", 0).ok());
  EXPECT_TRUE(Parse(R"({"f":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2).ok());
}

TEST(SafetensorsTest, RejectsEveryInvalidForm) {
  const std::string ok = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  struct Case {
    const char* why;
    std::string header;
    size_t data;
    const char* message;
  };
  std::vector<Case> cases = {
      {"trailing bytes", "{" + ok + "}", 5, "trailing or missing"},
      {"hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "hole"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       6, "'b'"},
      {"end before begin", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4, "'a'"},
      {"size mismatch", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "needs 8"},
      {"shape overflow",
       R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4,
       "overflows"},
      {"bytes overflow",
       R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4]}})", 4,
       "overflows"},
      {"sub-byte end", R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2,
       "byte boundary"},
      {"duplicate name", "{" + ok + "," + ok + "}", 8, "duplicate"},
      {"bad dtype", R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4, "F33"},
      {"negative dim", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "shape"},
      {"float offset", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})", 4,
       "data_offsets"},
      {"three offsets", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}})", 4, "two"},
      {"missing shape", R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4,
       "missing field 'shape'"},
      {"not object", "[]", 0, "not a JSON object"},
      {"bad json", "{\"a\":", 0, "not valid JSON"},
      {"metadata non-string", R"({"__metadata__":{"k":1}})", 0, "not a string"},
      {"trailing nul", "{" + ok + std::string("}\0\0", 3), 4, "not valid JSON"},
      {"invalid utf8", "{\"\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
       "UTF-8"},
  };
  for (const Case& c : cases) {
    absl::Status status = Parse(c.header, c.data);
    EXPECT_FALSE(status.ok()) << c.why;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << c.why << ": " << status;
    EXPECT_NE(status.message().find("t.safetensors"), std::string::npos) << c.why;
  }
}

TEST(SafetensorsTest, RejectsBadLengthPrefix) {
  std::vector<std::byte> tiny(7);
  EXPECT_FALSE(ParseSafetensorsHeader(tiny, "x").ok());
  auto file = MakeFile("{}", 0);
  file[0] = std::byte{0xff};  // Claims 255 header bytes: past the end.
  EXPECT_NE(ParseSafetensorsHeader(file, "x").status().message().find("past the end"),
            std::string::npos);
  file[3] = std::byte{0x10};  // > 100,000,000.
  EXPECT_NE(ParseSafetensorsHeader(file, "x").status().message().find("limit"), std::string::npos);
}

TEST(SafetensorsTest, OpenNamesTheFile) {
  std::string path = TempPath("short.safetensors");
  ASSERT_TRUE(leantron::fs::WriteFileAtomically(path, "abc").ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find(path), std::string::npos);
  EXPECT_EQ(SafetensorsFile::Open(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace leantron::ckpt
