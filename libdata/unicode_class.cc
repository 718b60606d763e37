#include "libdata/unicode_class.h"

#include <unicode/uchar.h>

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

// Classes from ICU; code points this ICU does not know yet but Unicode 16.0 (tiktoken's) does
// come from kNewerRanges.
std::unique_ptr<CharClass[]> BuildTable() {
  auto table = std::make_unique<CharClass[]>(kCodePoints);
  for (uint32_t cp = 0; cp < kCodePoints; ++cp) {
    CharClass c = CharClass::kOther;
    if (u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE)) {
      c = CharClass::kSpace;
    } else {
      const uint32_t mask = U_GET_GC_MASK(static_cast<UChar32>(cp));
      if (mask & U_GC_L_MASK) {
        c = CharClass::kLetter;
      } else if (mask & U_GC_N_MASK) {
        c = CharClass::kNumber;
      }
    }
    table[cp] = c;
  }
  for (const NewerRange& r : kNewerRanges) {
    for (uint32_t cp = r.first; cp <= r.last; ++cp) {
      if (u_charType(static_cast<UChar32>(cp)) == U_UNASSIGNED) table[cp] = r.cls;
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
