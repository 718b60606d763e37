// Debian 12's Abseil has its own absl::string_view (not std::string_view), so absl::StrCat does
// not take a std::string_view. Cat() adapts the arguments and forwards to absl::StrCat.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace leantron::data {

inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

template <typename T>
decltype(auto) AdaptForCat(const T& value) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    return ToAbsl(value);
  } else {
    return (value);
  }
}

template <typename... Args>
std::string Cat(const Args&... args) {
  return absl::StrCat(AdaptForCat(args)...);
}

template <typename... Args>
void CatAppend(std::string* out, const Args&... args) {
  absl::StrAppend(out, AdaptForCat(args)...);
}

}  // namespace leantron::data
