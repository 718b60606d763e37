#include "libdata/unicode_normalize.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uniset.h>

#include <cstring>
#include <memory>

#include "libdata/string_compat.h"

namespace leantron::data {
namespace {

struct Normalizers {
  std::unique_ptr<icu::UnicodeSet> unicode9;
  std::unique_ptr<icu::FilteredNormalizer2> forms[4];
  UErrorCode status = U_ZERO_ERROR;
};

const Normalizers& Get() {
  static const Normalizers* n = [] {
    auto* n = new Normalizers();
    n->unicode9 = std::make_unique<icu::UnicodeSet>(icu::UnicodeString(u"[:age=9.0:]"), n->status);
    if (U_FAILURE(n->status)) return n;
    n->unicode9->freeze();
    const icu::Normalizer2* base[4] = {
        icu::Normalizer2::getNFCInstance(n->status), icu::Normalizer2::getNFDInstance(n->status),
        icu::Normalizer2::getNFKCInstance(n->status), icu::Normalizer2::getNFKDInstance(n->status)};
    if (U_FAILURE(n->status)) return n;
    for (int i = 0; i < 4; ++i) {
      n->forms[i] = std::make_unique<icu::FilteredNormalizer2>(*base[i], *n->unicode9);
    }
    return n;
  }();
  return *n;
}

bool IsAscii(std::string_view s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

}  // namespace

absl::Status NormalizeUnicodeLikeHf(UnicodeForm form, std::string_view text, std::string* out) {
  if (IsAscii(text)) {  // every form leaves ASCII as it is
    out->append(text);
    return absl::OkStatus();
  }
  const Normalizers& n = Get();
  if (U_FAILURE(n.status)) {
    return absl::InternalError(Cat("ICU normalizer unavailable: ", u_errorName(n.status)));
  }
  UErrorCode status = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(out);
  n.forms[static_cast<int>(form)]->normalizeUTF8(
      0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink, nullptr, status);
  if (U_FAILURE(status)) {
    return absl::InternalError(Cat("ICU normalization failed: ", u_errorName(status)));
  }
  return absl::OkStatus();
}

}  // namespace leantron::data
