// The PyTorch format layer: the restricted unpickler (data, placeholders, refusals, bounded
// memory on hostile input), the zip reader and writer, and torch.save archives end to end.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "libckpt/pickle.h"
#include "libckpt/pickle_writer.h"
#include "libckpt/torch_archive.h"
#include "libckpt/zip_archive.h"
#include "libckpt/zip_writer.h"

namespace leantron::ckpt {
namespace {

using namespace std::string_literals;  // "..."s keeps embedded NULs

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

absl::StatusOr<std::unique_ptr<Pickle>> Unpickle(const std::string& s) {
  return Pickle::Parse(Bytes(s), "test.pkl");
}

std::string TempPath(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "torch_format_test";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

TEST(Pickle, DataValuesAndDataConstructors) {
  PickleWriter p;
  p.EmptyDict();
  p.Mark();
  p.Str("n");
  p.Int(-5);
  p.Str("big");
  p.Int(int64_t{1} << 40);
  p.Str("f");
  p.Float(0.25);
  p.Str("od");
  p.OrderedDict();
  p.Mark();
  p.Str("k");
  p.Bool(true);
  p.SetItems();
  p.SetItems();
  auto pickle = Unpickle(p.Finish());
  ASSERT_TRUE(pickle.ok()) << pickle.status();
  const PyValue* root = (*pickle)->root();
  EXPECT_EQ(DictGet(root, "n")->integer, -5);
  EXPECT_EQ(DictGet(root, "big")->integer, int64_t{1} << 40);
  EXPECT_EQ(DictGet(root, "f")->real, 0.25);
  const PyValue* od = DictGet(root, "od");
  ASSERT_EQ(od->kind, PyKind::kDict);  // collections.OrderedDict() became a dict
  EXPECT_TRUE(DictGet(od, "k")->boolean);
}

TEST(Pickle, OrderedDictAttributesAreBuiltAndOtherBuildsRefused) {
  // pickle.dumps(d, protocol=2) of OrderedDict(a=1) with d._metadata set, as torch's state_dict()
  // (Python 3.11): BUILD applies the attribute dict to the OrderedDict.
  const std::string bytes =
      "\x80\x02"
      "ccollections\nOrderedDict\nq\x00)Rq\x01X\x01\x00\x00\x00"
      "aq\x02K\x01s}q\x03"
      "X\t\x00\x00\x00_metadataq\x04h\x00)Rq\x05X\x00\x00\x00\x00q\x06}q\x07"
      "X\x07\x00\x00\x00versionq\x08K\x01sssb."s;
  auto pickle = Unpickle(bytes);
  ASSERT_TRUE(pickle.ok()) << pickle.status();
  const PyValue* root = (*pickle)->root();
  ASSERT_EQ(root->kind, PyKind::kDict);
  EXPECT_EQ(DictGet(root, "a")->integer, 1);
  EXPECT_EQ(DictGet(root, "_metadata"), nullptr);  // an attribute, not an item
  ASSERT_NE(root->state, nullptr);
  EXPECT_NE(DictGet(root->state, "_metadata"), nullptr);
  // BUILD on a list, or a dict given a non-dict state, is not a pickle Python writes.
  for (const std::string& bad : {"\x80\x02]K\x01"
                                 "b."s,
                                 "\x80\x02}K\x01"
                                 "b."s}) {
    auto refused = Unpickle(bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("BUILD on a"), std::string::npos) << refused.status();
  }
}

TEST(Pickle, ProtocolTwoBytesAndLongIntegers) {
  // _codecs.encode('\xff\x00', 'latin1') is protocol 2's bytes; LONG1 of 2**80.
  const std::string bytes = "\x80\x02"s + "c_codecs\nencode\nX\x03\x00\x00\x00\xc3\xbf\x00"s +
                            "X\x06\x00\x00\x00"s + "latin1\x86R."s;
  auto pickle = Unpickle(bytes);
  ASSERT_TRUE(pickle.ok()) << pickle.status();
  ASSERT_EQ((*pickle)->root()->kind, PyKind::kBytes);
  EXPECT_EQ((*pickle)->root()->s, std::string("\xff\x00", 2));
  auto big = Unpickle("\x80\x02\x8a\x0b"s + std::string(10, '\0') + "\x01."s);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*big)->root()->kind, PyKind::kBigInt);
}

TEST(Pickle, UnknownGlobalsAreInertPlaceholders) {
  // megatron.core.enums.ModelType(1): REDUCE of an unknown class becomes a kCall, never called.
  auto pickle = Unpickle("\x80\x02"s + "cmegatron.core.enums\nModelType\nK\x01\x85R."s);
  ASSERT_TRUE(pickle.ok()) << pickle.status();
  const PyValue* root = (*pickle)->root();
  EXPECT_TRUE(root->IsCallOf("megatron.core.enums", "ModelType"));
  EXPECT_EQ(PyRepr(root), "<megatron.core.enums.ModelType(1)>");
}

TEST(Pickle, CodeRunningGlobalsAreRefused) {
  // pickle.dumps of an object whose __reduce__ returns (os.system, ('echo pwned',)).
  for (std::string_view module : {"os\nsystem", "posix\nsystem", "subprocess\nPopen",
                                  "builtins\neval", "__builtin__\nexec", "builtins\ngetattr"}) {
    auto pickle = Unpickle("\x80\x02"s + "c"s + std::string(module) + "\nX\x0a\x00\x00\x00"s +
                           "echo pwned\x85R."s);
    ASSERT_FALSE(pickle.ok()) << module;
    EXPECT_EQ(pickle.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(pickle.status().message().find("never executes pickled code"), std::string::npos);
  }
}

TEST(Pickle, HostileInputIsBounded) {
  // A length past the end, a GET of a memo entry never PUT, a huge memo index, truncation.
  for (const std::string& bad :
       {std::string("\x80\x02X\xff\xff\xff\x7f"
                    "abc."),
        std::string("\x80\x02h\x05."), std::string("\x80\x02]r\xff\xff\xff\xffh\x00."),
        std::string("\x80\x02]"), std::string("\x80\x02(K\x01u."),
        std::string("\x80\x02"
                    "\x97.")}) {
    EXPECT_FALSE(Unpickle(bad).ok()) << PyRepr(nullptr);
  }
  // 100000 nested lists: parsed without recursion; the repr is cut off.
  std::string deep = "\x80\x02";
  deep += std::string(100000, ']') + std::string(99999, 'a') + ".";
  auto nested = Unpickle(deep);
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_LE(PyRepr((*nested)->root(), 100).size(), 110u);
  // A list appended to itself 50000 times through the memo: values stay bounded by the input.
  std::string self_append = "\x80\x02]q\x00("s;
  for (int i = 0; i < 50000; ++i) self_append += "h\x00"s;
  self_append += "e.";
  auto looped = Unpickle(self_append);
  ASSERT_TRUE(looped.ok()) << looped.status();
  EXPECT_LE((*looped)->num_values(), 10u);
  EXPECT_EQ((*looped)->root()->items.size(), 50000u);
  EXPECT_LE(PyRepr((*looped)->root(), 200).size(), 210u);  // safe on the cycle
}

TEST(Zip, Crc32IsZlibs) {
  // Against zlib's crc32 (another implementation), whole and continued across odd splits.
  std::string data(100003, '\0');
  uint32_t x = 12345;
  for (char& c : data) c = static_cast<char>((x = x * 1103515245 + 12345) >> 16);
  for (size_t length : {size_t{0}, size_t{1}, size_t{15}, size_t{64}, size_t{4099}, data.size()}) {
    const auto want = static_cast<uint32_t>(
        ::crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(length)));
    EXPECT_EQ(Crc32(0, Bytes(data.substr(0, length))), want) << length;
    for (size_t split : {size_t{0}, length / 3, length}) {
      const uint32_t head = Crc32(0, Bytes(data.substr(0, split)));
      EXPECT_EQ(Crc32(head, Bytes(data.substr(split, length - split))), want) << length;
    }
  }
}

TEST(Zip, WriterRoundTripWithPiecesOutOfOrder) {
  const std::string path = TempPath("pieces.pt");
  {
    auto zip = TorchZipWriter::Create(path, "pieces");
    ASSERT_TRUE(zip.ok());
    ASSERT_TRUE((*zip)->Add("byteorder", std::string_view("little")).ok());
    auto record = (*zip)->Reserve("data/0", 1000);
    ASSERT_TRUE(record.ok());
    std::string a(400, 'a'), b(300, 'b');
    ASSERT_TRUE((*zip)->Write(*record, 600, Bytes(b)).ok());  // a gap [400, 600) stays zero
    ASSERT_TRUE((*zip)->Write(*record, 0, Bytes(a)).ok());
    ASSERT_TRUE((*zip)->Add("empty", std::string_view("")).ok());
    ASSERT_TRUE((*zip)->Commit().ok());
  }
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto zip = ZipArchive::Parse((*file)->bytes(), path);
  ASSERT_TRUE(zip.ok()) << zip.status();
  const ZipEntry* data = zip->Find("pieces/data/0");
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(data->size, 1000u);
  EXPECT_EQ(data->offset % 64, 0u);  // torch's alignment
  EXPECT_TRUE(zip->VerifyCrc(*data).ok());
  const auto bytes = zip->Data(*data);
  EXPECT_EQ(static_cast<char>(bytes[0]), 'a');
  EXPECT_EQ(static_cast<char>(bytes[500]), '\0');
  EXPECT_EQ(static_cast<char>(bytes[899]), 'b');
  EXPECT_EQ(static_cast<char>(bytes[999]), '\0');
  EXPECT_EQ(zip->Find("pieces/empty")->size, 0u);
}

TEST(Zip, CorruptionIsReportedNotRead) {
  const std::string path = TempPath("corrupt.pt");
  {
    auto zip = TorchZipWriter::Create(path, "corrupt");
    ASSERT_TRUE(zip.ok());
    ASSERT_TRUE((*zip)->Add("data/0", std::string_view("0123456789")).ok());
    ASSERT_TRUE((*zip)->Commit().ok());
  }
  auto file = MappedFile::Open(path);
  std::string copy(reinterpret_cast<const char*>((*file)->bytes().data()), (*file)->bytes().size());
  // Truncated: no end record.
  EXPECT_FALSE(ZipArchive::Parse(Bytes(copy.substr(0, copy.size() - 5)), "t").ok());
  // A flipped data byte: parses, the CRC check names the entry.
  std::string flipped = copy;
  flipped[copy.find("0123456789")] = 'X';
  auto zip = ZipArchive::Parse(Bytes(flipped), "flipped");
  ASSERT_TRUE(zip.ok());
  auto crc = zip->VerifyCrc(zip->entries()[0]);
  EXPECT_NE(crc.message().find("corrupt/data/0"), std::string::npos);
  // A compressed entry (method 8) is refused.
  std::string deflated = copy;
  const size_t central = deflated.find("PK\x01\x02");
  deflated[central + 10] = 8;
  auto refused = ZipArchive::Parse(Bytes(deflated), "deflated");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("compressed"), std::string::npos);
}

TEST(TorchArchive, TensorsResolveAndBadOnesAreRefused) {
  const std::string path = TempPath("tensors.pt");
  {
    auto zip = TorchZipWriter::Create(path, "tensors");
    ASSERT_TRUE(zip.ok());
    float values[6] = {1, 2, 3, 4, 5, 6};
    ASSERT_TRUE((*zip)->Add("data/0", std::as_bytes(std::span<const float>(values, 6))).ok());
    PickleWriter p;
    p.EmptyDict();
    p.Mark();
    p.Str("ok");
    p.Tensor("FloatStorage", "0", 6, {2, 3});
    p.Str("too_big");
    p.Tensor("FloatStorage", "0", 6, {3, 3});
    p.Str("missing");
    p.Tensor("FloatStorage", "7", 6, {6});
    p.SetItems();
    ASSERT_TRUE((*zip)->Add("data.pkl", p.Finish()).ok());
    ASSERT_TRUE((*zip)->Commit().ok());
  }
  auto archive = TorchArchive::Open(path);
  ASSERT_TRUE(archive.ok()) << archive.status();
  const PyValue* root = (*archive)->root();
  auto ok = (*archive)->Tensor(DictGet(root, "ok"), "ok");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ok->dtype, DType::kF32);
  float last;
  std::memcpy(&last, ok->data.data() + 20, 4);
  EXPECT_EQ(last, 6.0f);
  EXPECT_FALSE((*archive)->Tensor(DictGet(root, "too_big"), "too_big").ok());
  auto missing = (*archive)->Tensor(DictGet(root, "missing"), "missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("data/7"), std::string::npos);
  EXPECT_TRUE((*archive)->VerifyCrcs().ok());
}

}  // namespace
}  // namespace leantron::ckpt
