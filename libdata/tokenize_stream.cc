#include "libdata/tokenize_stream.h"

#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libdata/pretokenizer.h"
#include "libdata/unicode_class.h"

namespace leantron::data {
namespace {

using Mode = TokenizeStreamOptions::Mode;

// Runs fn(i, worker) for i in [0, n) on up to `threads` threads; worker < threads identifies the
// thread, so per-thread state can be indexed by it.
template <typename Fn>
void ParallelFor(size_t n, int threads, Fn fn) {
  const size_t workers = std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1)));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, size_t{0});
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = next++; i < n; i = next++) fn(i, w);
    });
  }
  for (std::thread& t : pool) t.join();
}

void AppendIds(const std::vector<int32_t>& ids, std::string* out) {
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out->push_back(' ');
    const auto r = std::to_chars(buf, buf + sizeof(buf), ids[i]);
    out->append(buf, r.ptr);
  }
}

absl::Status WriteAll(std::FILE* out, std::string_view data) {
  if (!data.empty() && std::fwrite(data.data(), 1, data.size(), out) != data.size())
    return absl::DataLossError("cannot write output");
  return absl::OkStatus();
}

// Reads up to `want` more bytes onto `buf`; returns false at end of input.
absl::StatusOr<bool> ReadMore(std::FILE* in, size_t want, std::string* buf,
                              const std::string& name) {
  const size_t old = buf->size();
  buf->resize(old + want);
  const size_t got = std::fread(buf->data() + old, 1, want, in);
  buf->resize(old + got);
  if (got < want && std::ferror(in)) return absl::DataLossError(absl::StrCat(name, ": read error"));
  return got > 0;
}

// Splits [0, size) of text into about `parts` ranges that end at safe split points.
std::vector<size_t> SafeCuts(const uint8_t* text, size_t size, size_t parts) {
  std::vector<size_t> cuts{0};
  for (size_t k = 1; k < parts; ++k) {
    size_t i = std::max(size * k / parts, cuts.back() + 1);
    while (i < size && !IsSafeSplit(text, i)) ++i;
    if (i >= size) break;
    cuts.push_back(i);
  }
  cuts.push_back(size);
  return cuts;
}

// Plain text: encode (or count) the whole input as one text, streaming in blocks cut at safe
// split points so memory stays bounded by the block size (or the longest run without one).
absl::Status EncodePlain(const Tokenizer& tokenizer, const TokenizeStreamOptions& opt,
                         std::FILE* in, std::FILE* out) {
  const bool splittable = tokenizer.SplitsAtSpaces();
  const int threads = splittable ? std::max(opt.threads, 1) : 1;
  EncodeOptions part_options = opt.encode;
  part_options.add_special = false;  // added once around the whole input below
  std::vector<std::unique_ptr<TextEncoder>> encoders;
  for (int t = 0; t < threads; ++t) encoders.push_back(tokenizer.NewEncoder(part_options));
  std::vector<int32_t> prefix, suffix;
  if (opt.encode.add_special) tokenizer.SpecialTokensAround(&prefix, &suffix);
  std::string buf;
  bool eof = false;
  bool wrote_any = false;
  uint64_t count = 0;
  const auto write_ids = [&](const std::vector<int32_t>& ids) -> absl::Status {
    count += ids.size();
    if (opt.mode != Mode::kEncode || ids.empty()) return absl::OkStatus();
    std::string text;
    AppendIds(ids, &text);
    if (wrote_any) {
      if (absl::Status st = WriteAll(out, " "); !st.ok()) return st;
    }
    wrote_any = true;
    return WriteAll(out, text);
  };
  if (absl::Status st = write_ids(prefix); !st.ok()) return st;
  while (!eof || !buf.empty()) {
    size_t cut = 0;
    while (!eof) {
      absl::StatusOr<bool> more = ReadMore(in, opt.block_bytes * threads, &buf, opt.input_name);
      if (!more.ok()) return more.status();
      eof = !*more;
      if (eof) break;
      // Cut at the last safe point; without one, keep reading (one huge run of text).
      const auto* text = reinterpret_cast<const uint8_t*>(buf.data());
      for (size_t i = buf.size() - 1; splittable && i > 0 && cut == 0; --i)
        if (IsSafeSplit(text, i)) cut = i;
      if (cut > 0) break;
    }
    if (eof) cut = buf.size();
    const auto* text = reinterpret_cast<const uint8_t*>(buf.data());
    const std::vector<size_t> cuts = SafeCuts(text, cut, threads);
    const size_t parts = cuts.size() - 1;
    std::vector<std::vector<int32_t>> ids(parts);
    std::vector<std::string> rendered(parts);
    std::vector<absl::Status> status(parts);
    ParallelFor(parts, threads, [&](size_t k, size_t w) {
      const std::string_view chunk(buf.data() + cuts[k], cuts[k + 1] - cuts[k]);
      status[k] = encoders[w]->Encode(chunk, &ids[k]);
      if (opt.mode == Mode::kEncode) AppendIds(ids[k], &rendered[k]);
    });
    for (size_t k = 0; k < parts; ++k) {
      if (!status[k].ok()) return status[k];
      count += ids[k].size();
      if (opt.mode != Mode::kEncode || ids[k].empty()) continue;
      if (wrote_any) {
        if (absl::Status st = WriteAll(out, " "); !st.ok()) return st;
      }
      if (absl::Status st = WriteAll(out, rendered[k]); !st.ok()) return st;
      wrote_any = true;
    }
    buf.erase(0, cut);
  }
  if (absl::Status st = write_ids(suffix); !st.ok()) return st;
  if (opt.mode == Mode::kCount) return WriteAll(out, absl::StrCat(count, "\n"));
  return WriteAll(out, "\n");
}

// Parses whitespace-separated decimal ids in [p, end); `first_index` numbers them for errors.
absl::Status ParseIds(std::string_view text, uint64_t first_index, const std::string& where,
                      std::vector<int32_t>* ids) {
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
    if (p == end) break;
    int64_t v = -1;
    const auto r = std::from_chars(p, end, v);
    const char* stop = r.ptr;
    if (r.ec != std::errc() || v < 0 || v > INT32_MAX ||
        (stop < end && !(*stop == ' ' || *stop == '\t' || *stop == '\n' || *stop == '\r'))) {
      const char* word_end = p;
      while (word_end < end && !std::isspace(static_cast<unsigned char>(*word_end))) ++word_end;
      return absl::InvalidArgumentError(absl::StrFormat("%s: token %d: \"%s\" is not a token id",
                                                        where, first_index + ids->size(),
                                                        std::string_view(p, word_end - p)));
    }
    ids->push_back(static_cast<int32_t>(v));
    p = stop;
  }
  return absl::OkStatus();
}

// Plain decode: all ids of the input are one sequence; its bytes are written unchanged.
absl::Status DecodePlain(const Tokenizer& tokenizer, const TokenizeStreamOptions& opt,
                         std::FILE* in, std::FILE* out) {
  const bool by_parts = tokenizer.DecodesPartByPart();
  const int threads = by_parts ? std::max(opt.threads, 1) : 1;
  std::string buf;
  bool eof = false;
  uint64_t index = 0;
  while (!eof || !buf.empty()) {
    absl::StatusOr<bool> more = ReadMore(in, opt.block_bytes * threads, &buf, opt.input_name);
    if (!more.ok()) return more.status();
    eof = !*more;
    if (!by_parts && !eof) continue;  // decode the whole input at once
    // Keep a trailing partial number for the next round.
    size_t cut = buf.size();
    if (!eof) {
      while (cut > 0 && !std::isspace(static_cast<unsigned char>(buf[cut - 1]))) --cut;
    }
    // Chunks end at whitespace; each chunk's ids are numbered after the previous chunks'.
    std::vector<size_t> cuts{0};
    for (int k = 1; k < threads; ++k) {
      size_t i = std::max(cut * k / threads, cuts.back());
      while (i < cut && !std::isspace(static_cast<unsigned char>(buf[i]))) ++i;
      cuts.push_back(i);
    }
    cuts.push_back(cut);
    const size_t parts = cuts.size() - 1;
    std::vector<std::vector<int32_t>> ids(parts);
    std::vector<std::string> bytes(parts);
    std::vector<absl::Status> status(parts);
    ParallelFor(parts, threads, [&](size_t k, size_t) {
      status[k] = ParseIds(std::string_view(buf).substr(cuts[k], cuts[k + 1] - cuts[k]), 0,
                           opt.input_name, &ids[k]);
    });
    for (size_t k = 0; k < parts; ++k) {
      if (!status[k].ok()) {
        // Renumber against the whole stream.
        std::vector<int32_t> tmp;
        return ParseIds(std::string_view(buf).substr(cuts[k], cuts[k + 1] - cuts[k]), index,
                        opt.input_name, &tmp);
      }
      index += ids[k].size();
    }
    ParallelFor(parts, threads,
                [&](size_t k, size_t) { status[k] = tokenizer.Decode(ids[k], &bytes[k]); });
    for (size_t k = 0; k < parts; ++k) {
      if (!status[k].ok())
        return absl::InvalidArgumentError(absl::StrCat(opt.input_name, ": ", status[k].message()));
      if (absl::Status st = WriteAll(out, bytes[k]); !st.ok()) return st;
    }
    buf.erase(0, cut);
    if (eof) break;
  }
  return absl::OkStatus();
}

// Appends `bytes` as a JSON string; invalid UTF-8 becomes U+FFFD.
void AppendJsonString(std::string_view bytes, std::string* out) {
  out->push_back('"');
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint8_t* end = p + bytes.size();
  while (p < end) {
    uint32_t cp;
    const int n = DecodeUtf8(p, end, &cp);
    if (n == 0) {
      out->append("\xEF\xBF\xBD");
      ++p;
      continue;
    }
    if (cp == '"') {
      out->append("\\\"");
    } else if (cp == '\\') {
      out->append("\\\\");
    } else if (cp == '\n') {
      out->append("\\n");
    } else if (cp == '\t') {
      out->append("\\t");
    } else if (cp == '\r') {
      out->append("\\r");
    } else if (cp < 0x20) {
      out->append(absl::StrFormat("\\u%04x", cp));
    } else {
      out->append(reinterpret_cast<const char*>(p), n);
    }
    p += n;
  }
  out->push_back('"');
}

// One line of JSONL work: parse, then encode/count, or decode ids to a JSON object.
absl::Status ProcessLine(const Tokenizer& tokenizer, const TokenizeStreamOptions& opt,
                         TextEncoder& encoder, simdjson::dom::parser& parser, std::string_view line,
                         uint64_t line_no, std::vector<int32_t>& ids, std::string* out) {
  const auto where = [&] { return absl::StrCat(opt.input_name, ":", line_no); };
  ids.clear();
  if (opt.mode == Mode::kDecode) {
    if (absl::Status st = ParseIds(line, 0, where(), &ids); !st.ok()) return st;
    std::string bytes;
    if (absl::Status st = tokenizer.Decode(ids, &bytes); !st.ok())
      return absl::InvalidArgumentError(absl::StrCat(where(), ": ", st.message()));
    out->append("{");
    AppendJsonString(opt.json_key, out);
    out->append(": ");
    AppendJsonString(bytes, out);
    out->append("}\n");
    return absl::OkStatus();
  }
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
    out->append(opt.mode == Mode::kCount ? "0\n" : "\n");  // keep one output line per input line
    return absl::OkStatus();
  }
  // The DOM parser validates the whole line (ondemand would skip what it does not visit).
  simdjson::dom::element doc;
  if (auto err = parser.parse(line.data(), line.size(), false).get(doc); err) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), ": invalid JSON: ", simdjson::error_message(err)));
  }
  simdjson::dom::object obj;
  if (doc.get_object().get(obj))
    return absl::InvalidArgumentError(absl::StrCat(where(), ": not a JSON object"));
  simdjson::dom::element value;
  if (obj.at_key(opt.json_key).get(value))
    return absl::InvalidArgumentError(absl::StrCat(where(), ": no key \"", opt.json_key, "\""));
  std::string_view text;
  if (value.get_string().get(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), ": \"", opt.json_key, "\" is not a string"));
  }
  if (absl::Status st = encoder.Encode(text, &ids); !st.ok())
    return absl::InvalidArgumentError(absl::StrCat(where(), ": ", st.message()));
  if (opt.mode == Mode::kCount) {
    absl::StrAppend(out, ids.size(), "\n");
  } else {
    AppendIds(ids, out);
    out->push_back('\n');
  }
  return absl::OkStatus();
}

absl::Status RunJsonl(const Tokenizer& tokenizer, const TokenizeStreamOptions& opt, std::FILE* in,
                      std::FILE* out) {
  const int threads = std::max(opt.threads, 1);
  std::vector<std::unique_ptr<TextEncoder>> encoders;
  std::vector<simdjson::dom::parser> parsers(threads);
  for (int t = 0; t < threads; ++t) encoders.push_back(tokenizer.NewEncoder(opt.encode));
  std::string buf;
  bool eof = false;
  uint64_t first_line_no = 1;
  while (!eof || !buf.empty()) {
    absl::StatusOr<bool> more = ReadMore(in, opt.block_bytes * threads, &buf, opt.input_name);
    if (!more.ok()) return more.status();
    eof = !*more;
    size_t cut = eof ? buf.size() : buf.rfind('\n');
    if (cut == std::string::npos) continue;  // a line longer than the block: read more
    if (!eof) ++cut;
    // Lines of this round, then padding so simdjson may read past any line's end.
    std::vector<std::pair<size_t, size_t>> lines;
    for (size_t pos = 0; pos < cut;) {
      size_t nl = buf.find('\n', pos);
      if (nl == std::string::npos || nl >= cut) nl = cut;
      lines.emplace_back(pos, nl - pos);
      pos = nl + 1;
    }
    const size_t used = buf.size();
    buf.append(simdjson::SIMDJSON_PADDING, '\0');
    const size_t parts = std::min<size_t>(lines.size(), threads * 4);
    std::vector<std::string> rendered(parts);
    std::vector<absl::Status> status(parts);
    ParallelFor(parts, threads, [&](size_t k, size_t t) {
      const size_t lo = lines.size() * k / parts, hi = lines.size() * (k + 1) / parts;
      std::vector<int32_t> ids;
      for (size_t l = lo; l < hi && status[k].ok(); ++l) {
        const auto [pos, len] = lines[l];
        status[k] = ProcessLine(tokenizer, opt, *encoders[t], parsers[t],
                                std::string_view(buf.data() + pos, len), first_line_no + l, ids,
                                &rendered[k]);
      }
    });
    for (size_t k = 0; k < parts; ++k) {
      if (!status[k].ok()) return status[k];
      if (absl::Status st = WriteAll(out, rendered[k]); !st.ok()) return st;
    }
    buf.resize(used);
    buf.erase(0, std::min(cut, buf.size()));
    first_line_no += lines.size();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTokenizeStream(const Tokenizer& tokenizer, const TokenizeStreamOptions& options,
                               std::FILE* in, std::FILE* out) {
  absl::Status st;
  if (options.jsonl) {
    st = RunJsonl(tokenizer, options, in, out);
  } else if (options.mode == Mode::kDecode) {
    st = DecodePlain(tokenizer, options, in, out);
  } else {
    st = EncodePlain(tokenizer, options, in, out);
  }
  if (st.ok() && std::fflush(out) != 0) return absl::DataLossError("cannot write output");
  return st;
}

}  // namespace leantron::data
