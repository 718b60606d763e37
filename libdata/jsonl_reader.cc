#include "libdata/jsonl_reader.h"

#include <fcntl.h>
#include <glob.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libdata/mapped_file.h"

namespace leantron::data {
namespace {

constexpr size_t kChunk = 1 << 20;

class PlainSource : public ByteSource {
 public:
  PlainSource(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PlainSource() override { ::close(fd_); }
  absl::StatusOr<size_t> Read(char* data, size_t size) override {
    for (;;) {
      const ssize_t n = ::read(fd_, data, size);
      if (n >= 0) {
        raw_ += static_cast<uint64_t>(n);
        return static_cast<size_t>(n);
      }
      if (errno != EINTR) return fs::ErrnoError("cannot read", path_, errno);
    }
  }
  uint64_t raw_bytes() const override { return raw_; }

 private:
  std::string path_;
  int fd_;
  uint64_t raw_ = 0;
};

// Decoders hand out what they decoded before an error and report the error on the next call, so
// that the line it is reported at is the line the damage is in.
class ZstdSource : public ByteSource {
 public:
  ZstdSource(std::string path, int fd)
      : path_(std::move(path)), fd_(fd), dctx_(ZSTD_createDCtx()), in_buf_(ZSTD_DStreamInSize()) {}
  ~ZstdSource() override {
    ZSTD_freeDCtx(dctx_);
    ::close(fd_);
  }
  absl::StatusOr<size_t> Read(char* data, size_t size) override {
    if (!error_.ok()) return error_;
    ZSTD_outBuffer out{data, size, 0};
    while (out.pos == 0) {
      if (in_.pos == in_.size) {
        if (input_done_) {
          // A frame still open at the end of the input means the file was cut short.
          if (last_hint_ != 0) {
            return absl::DataLossError(
                absl::StrCat(path_, ": truncated zstd stream (ends inside a frame)"));
          }
          return size_t{0};
        }
        const ssize_t n = ::read(fd_, in_buf_.data(), in_buf_.size());
        if (n < 0) {
          if (errno == EINTR) continue;
          return fs::ErrnoError("cannot read", path_, errno);
        }
        if (n == 0) {
          input_done_ = true;
          continue;
        }
        raw_ += static_cast<uint64_t>(n);
        in_ = ZSTD_inBuffer{in_buf_.data(), static_cast<size_t>(n), 0};
      }
      const size_t hint = ZSTD_decompressStream(dctx_, &out, &in_);
      if (ZSTD_isError(hint)) {
        error_ = absl::DataLossError(
            absl::StrCat(path_, ": corrupt zstd data: ", ZSTD_getErrorName(hint)));
        if (out.pos > 0) return out.pos;
        return error_;
      }
      last_hint_ = hint;
    }
    return out.pos;
  }
  uint64_t raw_bytes() const override { return raw_; }

 private:
  std::string path_;
  int fd_;
  ZSTD_DCtx* dctx_;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool input_done_ = false;
  size_t last_hint_ = 0;
  uint64_t raw_ = 0;
  absl::Status error_;
};

// gzip with zlib's inflate, strictly: the file must be gzip from its first byte (zlib's gzread
// would read anything else as plain text), may hold several members back to back (what gzip
// writes for concatenated files), and nothing else: data after the last member that is not a
// member is an error (gzread ignores it), as is a stream cut short inside a member.
class GzipSource : public ByteSource {
 public:
  GzipSource(std::string path, int fd) : path_(std::move(path)), fd_(fd), in_buf_(kChunk) {
    ok_ = inflateInit2(&zs_, 16 + MAX_WBITS) == Z_OK;
  }
  ~GzipSource() override {
    if (ok_) inflateEnd(&zs_);
    ::close(fd_);
  }
  absl::StatusOr<size_t> Read(char* data, size_t size) override {
    if (!ok_) return absl::ResourceExhaustedError(absl::StrCat(path_, ": cannot start zlib"));
    if (!error_.ok()) return error_;
    size = std::min<size_t>(size, 1u << 30);
    size_t produced = 0;
    while (produced == 0) {
      if (zs_.avail_in == 0 && !input_done_) {
        const ssize_t n = ::read(fd_, in_buf_.data(), in_buf_.size());
        if (n < 0) {
          if (errno == EINTR) continue;
          return fs::ErrnoError("cannot read", path_, errno);
        }
        if (n == 0) {
          input_done_ = true;
        } else {
          raw_ += static_cast<uint64_t>(n);
          zs_.next_in = reinterpret_cast<Bytef*>(in_buf_.data());
          zs_.avail_in = static_cast<uInt>(n);
        }
      }
      if (zs_.avail_in == 0 && input_done_) {
        if (in_member_) {
          error_ = absl::DataLossError(
              absl::StrCat(path_, ": truncated gzip stream (ends inside a member)"));
        }
        break;
      }
      if (!in_member_) {  // A new member starts here (or garbage does).
        inflateReset(&zs_);
        in_member_ = true;
        ++members_;
      }
      zs_.next_out = reinterpret_cast<Bytef*>(data + produced);
      zs_.avail_out = static_cast<uInt>(size - produced);
      const int ret = inflate(&zs_, Z_NO_FLUSH);
      produced = size - zs_.avail_out;
      if (ret == Z_STREAM_END) {
        in_member_ = false;
      } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
        const char* why = zs_.msg != nullptr ? zs_.msg : "inflate failed";
        if (members_ == 1 && zs_.total_out == 0 && produced == 0) {
          error_ = absl::DataLossError(absl::StrCat(path_, ": not gzip data (", why, ")"));
        } else if (members_ > 1 && zs_.total_out == 0 && produced == 0) {
          error_ = absl::DataLossError(absl::StrCat(
              path_, ": data after the end of the gzip stream is not gzip (", why, ")"));
        } else {
          error_ = absl::DataLossError(absl::StrCat(path_, ": corrupt gzip data: ", why));
        }
        break;
      }
    }
    if (produced > 0) return produced;
    if (!error_.ok()) return error_;
    return size_t{0};
  }
  uint64_t raw_bytes() const override { return raw_; }

 private:
  std::string path_;
  int fd_;
  std::vector<char> in_buf_;
  z_stream zs_ = {};
  bool ok_ = false;
  bool input_done_ = false;
  bool in_member_ = false;
  int64_t members_ = 0;
  uint64_t raw_ = 0;
  absl::Status error_;
};

bool IsGlob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

bool IsJsonlName(const std::string& name) {
  for (const char* ext : {".jsonl", ".json", ".jsonl.zst", ".json.zst", ".jsonl.gz", ".json.gz"}) {
    if (absl::EndsWith(name, ext)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteSource>> OpenByteSource(const std::string& path) {
  if (path == "-") {  // standard input, uncompressed (pipe a decompressor in front if needed)
    const int fd = ::dup(STDIN_FILENO);
    if (fd < 0) return fs::ErrnoError("cannot read", "standard input", errno);
    return std::unique_ptr<ByteSource>(new PlainSource("(stdin)", fd));
  }
  if (std::filesystem::is_directory(path)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fs::ErrnoError("cannot open", path, errno);
  if (absl::EndsWith(path, ".gz")) return std::unique_ptr<ByteSource>(new GzipSource(path, fd));
  if (absl::EndsWith(path, ".zst")) return std::unique_ptr<ByteSource>(new ZstdSource(path, fd));
  return std::unique_ptr<ByteSource>(new PlainSource(path, fd));
}

absl::StatusOr<std::vector<std::string>> ExpandInputs(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (input == "-") {
      files.push_back(input);
    } else if (fs::is_directory(input, ec)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(input, ec); !ec && it != fs::end(it);
           it.increment(ec)) {
        if (it->is_regular_file(ec) && IsJsonlName(it->path().filename().string())) {
          found.push_back(it->path().string());
        }
      }
      if (ec) return absl::InternalError(absl::StrCat(input, ": ", ec.message()));
      if (found.empty()) {
        return absl::NotFoundError(absl::StrCat(input, ": directory holds no .jsonl/.json files"));
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(input, ec)) {
      files.push_back(input);
    } else if (IsGlob(input)) {
      glob_t g{};
      const int rc = ::glob(input.c_str(), 0, nullptr, &g);
      if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return absl::NotFoundError(absl::StrCat(input, ": pattern matches no file"));
      }
      if (rc != 0) {
        globfree(&g);
        return absl::InternalError(absl::StrCat(input, ": glob failed"));
      }
      for (size_t k = 0; k < g.gl_pathc; ++k) {
        if (!fs::is_directory(g.gl_pathv[k], ec)) files.emplace_back(g.gl_pathv[k]);
      }
      globfree(&g);
    } else {
      return absl::NotFoundError(absl::StrCat(input, ": no such file or directory"));
    }
  }
  return files;
}

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<ByteSource>> source = OpenByteSource(path);
  if (!source.ok()) return source.status();
  std::unique_ptr<LineReader> reader(new LineReader());
  reader->path_ = path;
  reader->source_ = *std::move(source);
  reader->buffer_.resize(kChunk);
  return reader;
}

absl::StatusOr<bool> LineReader::Next(std::string_view* line) {
  size_t scan_from = begin_;
  for (;;) {
    const char* nl =
        static_cast<const char*>(std::memchr(buffer_.data() + scan_from, '\n', end_ - scan_from));
    if (nl != nullptr) {
      const size_t pos = static_cast<size_t>(nl - buffer_.data());
      *line = std::string_view(buffer_.data() + begin_, pos - begin_);
      begin_ = pos + 1;
      ++line_number_;
      return true;
    }
    if (eof_) {
      if (begin_ == end_) return false;
      *line = std::string_view(buffer_.data() + begin_, end_ - begin_);
      begin_ = end_;
      ++line_number_;
      return true;
    }
    // Keep the partial line, make room (growing only for lines longer than the buffer), refill.
    const size_t partial = end_ - begin_;
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, partial);
      begin_ = 0;
      end_ = partial;
    }
    if (buffer_.size() - end_ < kChunk / 2) buffer_.resize(std::max(buffer_.size() * 2, kChunk));
    scan_from = end_;
    absl::StatusOr<size_t> n = source_->Read(buffer_.data() + end_, buffer_.size() - end_);
    if (!n.ok()) {
      return absl::Status(n.status().code(),
                          absl::StrCat(n.status().message(), " (at line ", line_number_ + 1, ")"));
    }
    if (*n == 0) eof_ = true;
    end_ += *n;
  }
}

}  // namespace leantron::data
