#include "libdata/unicode_class.h"

#include <unicode/uchar.h>
#include <unicode/uset.h>

#include <algorithm>
#include <memory>

namespace leantron::data {
namespace {

constexpr uint32_t kCodePoints = 0x110000;

struct NewerRange {
  uint32_t first, last;
  CharClass cls;
};
// Letters and numbers assigned after older ICU releases, as tiktoken's regex engine knows them.
constexpr NewerRange kNewerRanges[] = {
#include "libdata/unicode_delta.inc"
};

CharClass ClassOfCategory(UCharCategory type) {
  switch (type) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

// Classes from ICU, enumerated by ranges of equal general category (fast: a few thousand
// ranges instead of a property lookup per code point). Code points this ICU does not know yet
// but Unicode 16.0 (tiktoken's) does come from kNewerRanges.
std::unique_ptr<CharClass[]> BuildTable() {
  auto table = std::make_unique<CharClass[]>(kCodePoints);
  u_enumCharTypes(
      [](const void* context, UChar32 start, UChar32 limit, UCharCategory type) -> UBool {
        auto* t = static_cast<CharClass*>(const_cast<void*>(context));
        std::fill(t + start, t + limit, ClassOfCategory(type));
        return true;
      },
      table.get());
  for (const NewerRange& r : kNewerRanges) {
    for (uint32_t cp = r.first; cp <= r.last; ++cp) {
      if (u_charType(static_cast<UChar32>(cp)) == U_UNASSIGNED) table[cp] = r.cls;
    }
  }
  // White_Space wins over the category (it holds separators and a few controls).
  UErrorCode status = U_ZERO_ERROR;
  const USet* spaces = u_getBinaryPropertySet(UCHAR_WHITE_SPACE, &status);
  if (U_FAILURE(status)) {
    for (uint32_t cp = 0; cp < kCodePoints; ++cp) {
      if (u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE))
        table[cp] = CharClass::kSpace;
    }
  } else {
    for (int32_t i = 0; i < uset_getItemCount(spaces); ++i) {
      UChar32 first, last;
      status = U_ZERO_ERROR;
      if (uset_getItem(spaces, i, &first, &last, nullptr, 0, &status) == 0)
        std::fill(table.get() + first, table.get() + last + 1, CharClass::kSpace);
    }
  }
  return table;
}

}  // namespace

const CharClass* CodePointClassTable() {
  static const std::unique_ptr<CharClass[]> table = BuildTable();
  return table.get();
}

CharClass ClassOfCodePoint(uint32_t cp) {
  return cp < kCodePoints ? CodePointClassTable()[cp] : CharClass::kOther;
}

}  // namespace leantron::data
