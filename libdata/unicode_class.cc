#include "libdata/unicode_class.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <memory>

namespace leantron::data {
namespace {

constexpr uint32_t kCodePoints = 0x110000;

constexpr NewerUnicodeRange kNewerRanges[] = {
#include "libdata/unicode_delta.inc"
};

CharClass ClassOfCategory(uint8_t type) {
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

// Categories from ICU, enumerated by ranges of equal general category (fast: a few thousand
// ranges instead of a property lookup per code point). Code points this ICU does not know yet
// but Unicode 16.0 does come from kNewerRanges.
std::unique_ptr<uint8_t[]> BuildCategories() {
  auto table = std::make_unique<uint8_t[]>(kCodePoints);
  u_enumCharTypes(
      [](const void* context, UChar32 start, UChar32 limit, UCharCategory type) -> UBool {
        auto* t = static_cast<uint8_t*>(const_cast<void*>(context));
        std::fill(t + start, t + limit, static_cast<uint8_t>(type));
        return true;
      },
      table.get());
  for (const NewerUnicodeRange& r : kNewerRanges) {
    for (uint32_t cp = r.first; cp <= r.last; ++cp) {
      if (table[cp] == U_UNASSIGNED) table[cp] = r.category;
    }
  }
  return table;
}

std::unique_ptr<CharClass[]> BuildClasses() {
  const uint8_t* categories = GeneralCategoryTable();
  auto table = std::make_unique<CharClass[]>(kCodePoints);
  for (uint32_t cp = 0; cp < kCodePoints; ++cp) table[cp] = ClassOfCategory(categories[cp]);
  // White_Space wins over the category (it holds separators and a few controls).
  for (uint32_t cp = 0; cp < 0x3001; ++cp) {
    if (IsUnicodeWhiteSpace(cp)) table[cp] = CharClass::kSpace;
  }
  return table;
}

}  // namespace

bool IsUnicodeWhiteSpace(uint32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

const uint8_t* GeneralCategoryTable() {
  static const std::unique_ptr<uint8_t[]> table = BuildCategories();
  return table.get();
}

const CharClass* CodePointClassTable() {
  static const std::unique_ptr<CharClass[]> table = BuildClasses();
  return table.get();
}

CharClass ClassOfCodePoint(uint32_t cp) {
  return cp < kCodePoints ? CodePointClassTable()[cp] : CharClass::kOther;
}

absl::Span<const NewerUnicodeRange> NewerUnicodeRanges() {
  return absl::MakeConstSpan(kNewerRanges);
}

}  // namespace leantron::data
