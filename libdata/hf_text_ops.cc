#include "libdata/hf_text_ops.h"

#include <unicode/uchar.h>

#include <cctype>

#include "libdata/unicode_class.h"
#include "libdata/unicode_normalize.h"

namespace leantron::data {

bool IsWordChar(uint32_t cp) {
  // Rust regex's Unicode \w (Unicode 16.0): Alphabetic, marks, decimal numbers, connector
  // punctuation, Join_Control. Alphabetic is the letters, letter numbers and Other_Alphabetic
  // (ICU's property; its Unicode 15 gap holds only marks and letters, covered by the table).
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  if (cp >= 0x110000) return false;
  switch (GeneralCategoryTable()[cp]) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
    case U_NON_SPACING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return cp == 0x200C || cp == 0x200D ||
             u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_ALPHABETIC);
  }
}

// The last / first code point of valid UTF-8 text.
uint32_t LastChar(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  uint32_t cp;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  return DecodeUtf8(p, p + (s.size() - i), &cp) > 0 ? cp : 0xFFFD;
}
uint32_t FirstChar(std::string_view s, int* len) {
  uint32_t cp;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  *len = DecodeUtf8(p, p + s.size(), &cp);
  if (*len == 0) {
    *len = 1;
    return 0xFFFD;
  }
  return cp;
}

absl::Status ApplyNormalizers(const std::vector<HfNormalizer>& normalizers,
                              std::vector<std::unique_ptr<RegexMatcher>>* matchers,
                              std::string_view in, std::string* out, bool* at_start) {
  std::string tmp;
  out->assign(in.data(), in.size());
  for (size_t i = 0; i < normalizers.size(); ++i) {
    const HfNormalizer& n = normalizers[i];
    tmp.clear();
    switch (n.kind) {
      case HfNormalizer::Kind::kUnicode:
        if (absl::Status st = NormalizeUnicodeLikeHf(n.form, *out, &tmp); !st.ok()) return st;
        break;
      case HfNormalizer::Kind::kPrepend:
        if (!out->empty()) tmp = n.content + *out;
        break;
      case HfNormalizer::Kind::kReplace: {
        std::unique_ptr<RegexMatcher> local;
        RegexMatcher* m = matchers != nullptr ? (*matchers)[i].get() : nullptr;
        if (m == nullptr) {
          local = std::make_unique<RegexMatcher>(*n.regex);
          m = local.get();
        }
        const std::string& src = *out;
        absl::Status st = m->FindMatches(src, [&](size_t s, size_t e, bool is_match) {
          if (is_match) {
            tmp += n.content;
          } else {
            tmp.append(src, s, e - s);
          }
        });
        if (!st.ok()) return st;
        break;
      }
      case HfNormalizer::Kind::kStrip: {
        std::string_view v = *out;
        int len;
        while (n.strip_left && !v.empty() && IsUnicodeWhiteSpace(FirstChar(v, &len))) {
          v.remove_prefix(static_cast<size_t>(len));
          *at_start = false;
        }
        while (n.strip_right && !v.empty() && IsUnicodeWhiteSpace(LastChar(v))) {
          const uint32_t cp = LastChar(v);
          v.remove_suffix(cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
        }
        tmp.assign(v.data(), v.size());
        break;
      }
    }
    out->swap(tmp);
  }
  return absl::OkStatus();
}

}  // namespace leantron::data
