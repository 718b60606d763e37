#include "libdata/npy_writer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libdata/mapped_file.h"

namespace leantron::data {

absl::Status WriteNpy(const std::string& path, const std::string& descr,
                      const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header.push_back('\n');
  absl::StatusOr<fs::AtomicFileWriter> writer = fs::AtomicFileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  const uint16_t len = static_cast<uint16_t>(header.size());
  absl::Status s = writer->Write("\x93NUMPY\x01\x00", 8);
  if (s.ok()) s = writer->Write(&len, 2);
  if (s.ok()) s = writer->Write(header);
  if (s.ok()) s = writer->Write(data, bytes);
  if (s.ok()) s = writer->Commit();
  return s;
}

}  // namespace leantron::data
