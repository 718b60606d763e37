#include "libdata/hf_decode.h"

#include "absl/container/flat_hash_map.h"
#include "libdata/string_compat.h"
#include "libdata/unicode_class.h"

namespace leantron::data {
namespace {

// Code point lengths of valid UTF-8 text's characters, as views.
std::vector<std::string_view> Chars(std::string_view s) {
  std::vector<std::string_view> out;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t* end = p + s.size();
  while (p < end) {
    uint32_t cp;
    int len = DecodeUtf8(p, end, &cp);
    if (len == 0) len = 1;
    out.emplace_back(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
    p += len;
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

absl::Status ApplyDecoder(const HfDecoder& d, std::vector<std::string>* tokens) {
  std::vector<std::string> out;
  switch (d.kind) {
    case HfDecoder::Kind::kByteLevel: {
      std::string joined;
      for (const std::string& t : *tokens) {
        std::string bytes;
        if (ByteLevelDecode(t, &bytes)) {
          joined += bytes;
        } else {
          joined += t;
        }
      }
      out.push_back(std::move(joined));
      break;
    }
    case HfDecoder::Kind::kByteFallback: {
      std::string bytes;
      bool pending = false;
      for (std::string& t : *tokens) {
        int hi, lo;
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
            (hi = HexDigit(t[3])) >= 0 && (lo = HexDigit(t[4])) >= 0) {
          bytes.push_back(static_cast<char>(hi * 16 + lo));
          pending = true;
          continue;
        }
        if (pending) out.push_back(std::move(bytes));
        bytes.clear();
        pending = false;
        out.push_back(std::move(t));
      }
      if (pending) out.push_back(std::move(bytes));
      break;
    }
    case HfDecoder::Kind::kFuse: {
      std::string joined;
      for (const std::string& t : *tokens) joined += t;
      out.push_back(std::move(joined));
      break;
    }
    case HfDecoder::Kind::kStrip:
      for (const std::string& t : *tokens) {
        const std::vector<std::string_view> chars = Chars(t);
        size_t start_cut = 0, stop_cut = chars.size();
        for (size_t i = 0; i < d.start && i < chars.size() && chars[i] == d.content; ++i)
          start_cut = i + 1;
        for (size_t i = 0; i < d.stop && i < chars.size(); ++i) {
          const size_t index = chars.size() - i - 1;
          if (chars[index] != d.content) break;
          stop_cut = index;
        }
        std::string s;
        for (size_t i = start_cut; i < stop_cut; ++i) s += chars[i];
        out.push_back(std::move(s));
      }
      break;
    case HfDecoder::Kind::kReplace: {
      RegexMatcher m(*d.regex);
      for (const std::string& t : *tokens) {
        std::string s;
        if (absl::Status st = m.FindMatches(t,
                                            [&](size_t a, size_t b, bool is_match) {
                                              if (is_match) {
                                                s += d.content;
                                              } else {
                                                s.append(t, a, b - a);
                                              }
                                            });
            !st.ok())
          return st;
        out.push_back(std::move(s));
      }
      break;
    }
    case HfDecoder::Kind::kMetaspace:
      for (size_t i = 0; i < tokens->size(); ++i) {
        std::string s;
        for (std::string_view c : Chars((*tokens)[i])) {
          if (c != d.content) {
            s += c;
          } else if (!(i == 0 && d.metaspace_prepends)) {
            s += ' ';
          }
        }
        out.push_back(std::move(s));
      }
      break;
  }
  tokens->swap(out);
  return absl::OkStatus();
}

}  // namespace

absl::Status HfDecode(const HfTokenizerSpec& spec, const std::vector<std::string>& added_strings,
                      absl::Span<const int32_t> ids, std::string* out) {
  absl::flat_hash_map<int32_t, size_t> added;
  for (size_t i = 0; i < spec.added.size(); ++i) added[spec.added[i].id] = i;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (const auto it = added.find(ids[i]); it != added.end()) {
      tokens.push_back(added_strings[it->second]);
    } else if (const std::string* s = spec.model->TokenString(ids[i])) {
      tokens.push_back(*s);
    } else {
      return absl::OutOfRangeError(
          Cat("id ", ids[i], " at position ", i, " is not in the vocabulary of ", spec.source));
    }
  }
  if (!spec.has_decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out->push_back(' ');
      out->append(tokens[i]);
    }
    return absl::OkStatus();
  }
  for (const HfDecoder& d : spec.decoders) {
    if (absl::Status st = ApplyDecoder(d, &tokens); !st.ok()) return st;
  }
  for (const std::string& t : tokens) out->append(t);
  return absl::OkStatus();
}

}  // namespace leantron::data
