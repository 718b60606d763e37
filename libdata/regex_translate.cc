#include "libdata/regex_translate.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>

#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libdata/string_compat.h"
#include "libdata/unicode_class.h"

namespace leantron::data {
namespace {

// White_Space, written out (PCRE2's \s also holds U+180E).
constexpr char kWhiteSpace[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

struct Category {
  const char* short_name;
  const char* long_name;
  int icu;  // UCharCategory
};
constexpr Category kCategories[] = {
    {"Lu", "uppercaseletter", U_UPPERCASE_LETTER},
    {"Ll", "lowercaseletter", U_LOWERCASE_LETTER},
    {"Lt", "titlecaseletter", U_TITLECASE_LETTER},
    {"Lm", "modifierletter", U_MODIFIER_LETTER},
    {"Lo", "otherletter", U_OTHER_LETTER},
    {"Mn", "nonspacingmark", U_NON_SPACING_MARK},
    {"Mc", "spacingmark", U_COMBINING_SPACING_MARK},
    {"Me", "enclosingmark", U_ENCLOSING_MARK},
    {"Nd", "decimalnumber", U_DECIMAL_DIGIT_NUMBER},
    {"Nl", "letternumber", U_LETTER_NUMBER},
    {"No", "othernumber", U_OTHER_NUMBER},
    {"Pc", "connectorpunctuation", U_CONNECTOR_PUNCTUATION},
    {"Pd", "dashpunctuation", U_DASH_PUNCTUATION},
    {"Ps", "openpunctuation", U_START_PUNCTUATION},
    {"Pe", "closepunctuation", U_END_PUNCTUATION},
    {"Pi", "initialpunctuation", U_INITIAL_PUNCTUATION},
    {"Pf", "finalpunctuation", U_FINAL_PUNCTUATION},
    {"Po", "otherpunctuation", U_OTHER_PUNCTUATION},
    {"Sm", "mathsymbol", U_MATH_SYMBOL},
    {"Sc", "currencysymbol", U_CURRENCY_SYMBOL},
    {"Sk", "modifiersymbol", U_MODIFIER_SYMBOL},
    {"So", "othersymbol", U_OTHER_SYMBOL},
    {"Zs", "spaceseparator", U_SPACE_SEPARATOR},
    {"Zl", "lineseparator", U_LINE_SEPARATOR},
    {"Zp", "paragraphseparator", U_PARAGRAPH_SEPARATOR},
    {"Cc", "control", U_CONTROL_CHAR},
    {"Cf", "format", U_FORMAT_CHAR},
    {"Cs", "surrogate", U_SURROGATE},
    {"Co", "privateuse", U_PRIVATE_USE_CHAR},
};

struct Group {
  const char* short_name;
  const char* long_name;
  const char* members;  // first letters of kCategories short names, or "LC"
};
constexpr Group kGroups[] = {
    {"L", "letter", "L"},        {"M", "mark", "M"},   {"N", "number", "N"},
    {"P", "punctuation", "P"},   {"S", "symbol", "S"}, {"Z", "separator", "Z"},
    {"LC", "casedletter", "LC"},
};

// Loose matching of property names, as both engines do: case, spaces, '_' and '-' ignored.
std::string LooseName(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == ' ' || c == '_' || c == '-') continue;
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

// The PCRE2 class items (no brackets) for general-category property `name`: PCRE2's own \p{..}
// plus the code points assigned between Unicode 14.0 and 16.0.
absl::StatusOr<std::string> CategoryClassItems(std::string_view name) {
  const std::string loose = LooseName(name);
  std::vector<int> cats;
  std::string pcre;
  for (const Category& c : kCategories) {
    if (loose == LooseName(c.short_name) || loose == c.long_name) {
      cats.push_back(c.icu);
      pcre = Cat("\\p{", c.short_name, "}");
    }
  }
  for (const Group& g : kGroups) {
    if (loose != LooseName(g.short_name) && loose != g.long_name) continue;
    for (const Category& c : kCategories) {
      const std::string_view s = c.short_name;
      const bool member = std::string_view(g.members) == "LC"
                              ? (s == "Lu" || s == "Ll" || s == "Lt")
                              : s[0] == g.members[0];
      if (member) cats.push_back(c.icu);
    }
    pcre = std::string_view(g.short_name) == "LC" ? "\\p{Lu}\\p{Ll}\\p{Lt}"
                                                  : Cat("\\p{", g.short_name, "}");
  }
  if (cats.empty()) {
    if (loose == "c" || loose == "other" || loose == "cn" || loose == "unassigned") {
      return absl::UnimplementedError(
          Cat("Unicode property \\p{", name,
              "} is not implemented (its unassigned code points differ between Unicode versions)"));
    }
    return absl::UnimplementedError(
        Cat("Unicode property \\p{", name,
            "} is not implemented (only general categories such as \\p{L}, \\p{Lu}, "
            "\\p{N}, \\p{P} are)"));
  }
  if (cats.size() == 1 && (cats[0] == U_NON_SPACING_MARK || cats[0] == U_COMBINING_SPACING_MARK)) {
    return absl::UnimplementedError(
        Cat("Unicode property \\p{", name,
            "} is not implemented (U+1171E moved from Mn to Mc in Unicode 15; use \\p{M})"));
  }
  for (const NewerUnicodeRange& r : NewerUnicodeRanges()) {
    for (int c : cats) {
      if (c != r.category) continue;
      if (r.first == r.last) {
        absl::StrAppendFormat(&pcre, "\\x{%X}", r.first);
      } else {
        absl::StrAppendFormat(&pcre, "\\x{%X}-\\x{%X}", r.first, r.last);
      }
    }
  }
  return pcre;
}

class Translator {
 public:
  Translator(std::string_view pattern, RegexDialect dialect) : p_(pattern), dialect_(dialect) {}

  absl::StatusOr<TranslatedRegex> Run() {
    TranslatedRegex result;
    result.options = dialect_ == RegexDialect::kOniguruma ? PCRE2_MULTILINE : PCRE2_DOLLAR_ENDONLY;
    while (i_ < p_.size()) {
      if (absl::Status st = Step(); !st.ok()) return Prefixed(st);
    }
    if (!groups_.empty()) return Prefixed(Error("unbalanced parenthesis"));
    result.pattern = std::move(out_);
    return result;
  }

 private:
  absl::Status Prefixed(const absl::Status& st) const {
    return absl::Status(st.code(), Cat("regex \"", p_, "\": ", st.message()));
  }
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(Cat(what, " (at offset ", i_, ")"));
  }
  absl::Status Unimplemented(std::string_view what) const {
    return absl::UnimplementedError(Cat(what, " is not implemented (at offset ", i_,
                                        "); this tokenizer cannot be used exactly"));
  }
  bool Onig() const { return dialect_ == RegexDialect::kOniguruma; }
  char Peek(size_t k = 0) const { return i_ + k < p_.size() ? p_[i_ + k] : '\0'; }

  // One UTF-8 character of the pattern, copied.
  void CopyChar() {
    const auto b = static_cast<unsigned char>(p_[i_]);
    const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    const size_t len = std::min(n, p_.size() - i_);
    out_.append(p_.substr(i_, len));
    i_ += len;
  }

  absl::Status Step() {
    const char c = p_[i_];
    switch (c) {
      case '\\': {
        atom_ = out_.size();
        return Escape(/*in_class=*/false);
      }
      case '[':
        atom_ = out_.size();
        return Class();
      case '(':
        return OpenGroup();
      case ')':
        if (groups_.empty()) return Error("unbalanced parenthesis");
        atom_ = groups_.back();
        groups_.pop_back();
        out_.push_back(')');
        ++i_;
        return absl::OkStatus();
      case '{':
        return Interval();
      case '*':
      case '+':
      case '?':
        out_.push_back(c);
        ++i_;
        if (Peek() == '+' || Peek() == '?') {  // possessive or lazy, the same in all three
          out_.push_back(Peek());
          ++i_;
        }
        return absl::OkStatus();
      default:
        atom_ = out_.size();
        CopyChar();
        return absl::OkStatus();
    }
  }

  // {n}, {n,}, {n,m} (and Oniguruma's {,m}); anything else is a literal '{' in all engines.
  absl::Status Interval() {
    size_t j = i_ + 1;
    std::string lo, hi;
    bool comma = false;
    while (j < p_.size() && std::isdigit(static_cast<unsigned char>(p_[j]))) lo.push_back(p_[j++]);
    if (j < p_.size() && p_[j] == ',') {
      comma = true;
      ++j;
      while (j < p_.size() && std::isdigit(static_cast<unsigned char>(p_[j])))
        hi.push_back(p_[j++]);
    }
    const bool valid = j < p_.size() && p_[j] == '}' && (!lo.empty() || (comma && !hi.empty()));
    if (!valid) {
      atom_ = out_.size();
      out_ += "\\{";
      ++i_;
      return absl::OkStatus();
    }
    if (lo.empty()) {
      if (!Onig()) return Unimplemented("the interval {,m}");
      lo = "0";
    }
    i_ = j + 1;
    out_ += "{" + lo + (comma ? "," : "") + hi + "}";
    if (Peek() == '?') {
      out_.push_back('?');
      ++i_;
    } else if (Peek() == '+') {
      ++i_;
      if (Onig()) {
        // Oniguruma (Ruby syntax): X{n,m}+ is (X{n,m})+, not possessive.
        out_.insert(atom_, "(?:");
        out_ += ")+";
      } else {
        out_.push_back('+');
      }
    }
    return absl::OkStatus();
  }

  absl::Status OpenGroup() {
    groups_.push_back(out_.size());
    ++i_;
    if (Peek() != '?') {
      out_.push_back('(');
      return absl::OkStatus();
    }
    const char k = Peek(1);
    if (k == ':' || k == '=' || k == '!' || k == '>') {
      out_ += Cat("(?", std::string(1, k));
      i_ += 2;
      return absl::OkStatus();
    }
    if (k == '<' && (Peek(2) == '=' || Peek(2) == '!')) {
      out_ += Cat("(?<", std::string(1, Peek(2)));
      i_ += 3;
      return absl::OkStatus();
    }
    if (k == '<' || (k == 'P' && Peek(2) == '<')) {  // named capture
      const size_t close = p_.find('>', i_);
      if (close == std::string_view::npos) return Error("unterminated group name");
      const size_t name_start = i_ + (k == 'P' ? 3 : 2);
      out_ += Cat("(?<", p_.substr(name_start, close - name_start), ">");
      i_ = close + 1;
      return absl::OkStatus();
    }
    // Flags: (?imx-imx) or (?imx-imx:...).
    size_t j = i_ + 1;
    std::string on, off;
    bool negate = false;
    while (j < p_.size() && p_[j] != ':' && p_[j] != ')') {
      const char f = p_[j++];
      if (f == '-') {
        negate = true;
        continue;
      }
      std::string mapped;
      if (f == 'i') {
        mapped = "i";
      } else if (Onig() && f == 'm') {
        mapped = "s";  // Ruby's (?m) is PCRE's (?s)
      } else if (!Onig() && (f == 'm' || f == 's')) {
        mapped = std::string(1, f);
      } else if (!Onig() && f == 'u' && !negate) {
        continue;  // Unicode mode is always on
      } else {
        return Unimplemented(Cat("the inline flag '", std::string(1, f), "'"));
      }
      (negate ? off : on) += mapped;
    }
    if (j >= p_.size()) return Error("unterminated group");
    const bool scoped = p_[j] == ':';
    out_ += "(?" + on + (off.empty() ? "" : "-" + off) + (scoped ? ":" : ")");
    i_ = j + 1;
    if (!scoped) groups_.pop_back();
    return absl::OkStatus();
  }

  absl::Status Class() {
    ++i_;  // '['
    out_.push_back('[');
    if (Peek() == '^') {
      out_.push_back('^');
      ++i_;
    }
    if (Peek() == ']') {  // a leading ']' is literal in all three engines
      out_ += "\\]";
      ++i_;
    }
    for (;;) {
      if (i_ >= p_.size()) return Error("unterminated character class");
      const char c = p_[i_];
      if (c == ']') {
        out_.push_back(']');
        ++i_;
        return absl::OkStatus();
      }
      if (c == '[') return Unimplemented("a nested character class or POSIX class ([[...]])");
      if (c == '&' && Peek(1) == '&') return Unimplemented("class intersection (&&)");
      if (!Onig() && (c == '-' || c == '~') && Peek(1) == c)
        return Unimplemented("class set operations (-- and ~~)");
      if (c == '\\') {
        if (absl::Status st = Escape(/*in_class=*/true); !st.ok()) return st;
        continue;
      }
      CopyChar();
    }
  }

  absl::Status Property(bool negated, bool in_class) {
    // \pL or \p{Name} or \p{^Name}.
    std::string name;
    if (Peek() == '{') {
      const size_t close = p_.find('}', i_);
      if (close == std::string_view::npos) return Error("unterminated \\p{");
      name = std::string(p_.substr(i_ + 1, close - i_ - 1));
      i_ = close + 1;
      if (!name.empty() && name[0] == '^') {
        negated = !negated;
        name.erase(0, 1);
      }
    } else if (i_ < p_.size()) {
      name = std::string(1, p_[i_++]);
    }
    absl::StatusOr<std::string> items = CategoryClassItems(name);
    if (!items.ok()) return items.status();
    if (in_class) {
      if (negated) return Unimplemented("a negated property (\\P) inside a character class");
      out_ += *items;
    } else {
      out_ += Cat(negated ? "[^" : "[", *items, "]");
    }
    return absl::OkStatus();
  }

  absl::Status Escape(bool in_class) {
    ++i_;  // '\'
    if (i_ >= p_.size()) return Error("pattern ends with '\\'");
    const char c = p_[i_];
    const auto pass = [&](std::string_view s) {
      out_ += s;
      ++i_;
      return absl::OkStatus();
    };
    switch (c) {
      case 'p':
      case 'P':
        ++i_;
        return Property(c == 'P', in_class);
      case 's':
        return pass(in_class ? std::string(kWhiteSpace) : Cat("[", kWhiteSpace, "]"));
      case 'S':
        if (in_class) return Unimplemented("\\S inside a character class");
        return pass(Cat("[^", kWhiteSpace, "]"));
      case 'd':
      case 'D': {
        absl::StatusOr<std::string> items = CategoryClassItems("Nd");
        if (!items.ok()) return items.status();
        if (in_class && c == 'D') return Unimplemented("\\D inside a character class");
        return pass(in_class ? *items : Cat(c == 'D' ? "[^" : "[", *items, "]"));
      }
      case 'h':
      case 'H':
        if (!Onig()) return Unimplemented("\\h");
        if (in_class && c == 'H') return Unimplemented("\\H inside a character class");
        return pass(in_class ? "0-9a-fA-F" : (c == 'H' ? "[^0-9a-fA-F]" : "[0-9a-fA-F]"));
      case 'v':
        return pass("\\x0B");
      case 'n':
      case 'r':
      case 't':
      case 'f':
      case 'a':
      case 'e':
        return pass(Cat("\\", std::string(1, c)));
      case 'A':
      case 'z':
        if (in_class) return Unimplemented(Cat("\\", std::string(1, c), " in a class"));
        return pass(Cat("\\", std::string(1, c)));
      case 'Z':
        if (in_class || !Onig()) return Unimplemented("\\Z");
        return pass("\\Z");
      case 'x': {
        // \xHH or \x{H...}: the same in PCRE2.
        out_ += "\\x";
        ++i_;
        if (Peek() == '{') {
          const size_t close = p_.find('}', i_);
          if (close == std::string_view::npos) return Error("unterminated \\x{");
          out_.append(p_.substr(i_, close - i_ + 1));
          i_ = close + 1;
        } else {
          for (int k = 0; k < 2 && std::isxdigit(static_cast<unsigned char>(Peek())); ++k) {
            out_.push_back(Peek());
            ++i_;
          }
        }
        return absl::OkStatus();
      }
      case 'u': {
        ++i_;
        std::string hex;
        if (Peek() == '{') {
          const size_t close = p_.find('}', i_);
          if (close == std::string_view::npos) return Error("unterminated \\u{");
          hex = std::string(p_.substr(i_ + 1, close - i_ - 1));
          i_ = close + 1;
        } else {
          hex = std::string(p_.substr(i_, 4));
          i_ += hex.size();
        }
        if (hex.empty() || hex.size() > 6 ||
            hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
          return Error("bad \\u escape");
        }
        out_ += Cat("\\x{", hex, "}");
        return absl::OkStatus();
      }
      case '0':
        if (std::isdigit(static_cast<unsigned char>(Peek(1))))
          return Unimplemented("octal escapes");
        return pass("\\x00");
      default:
        break;
    }
    if (std::isalnum(static_cast<unsigned char>(c))) {
      return Unimplemented(Cat("the escape \\", std::string(1, c)));
    }
    // An escaped punctuation or non-ASCII character stands for itself.
    out_.push_back('\\');
    CopyChar();
    return absl::OkStatus();
  }

  std::string_view p_;
  RegexDialect dialect_;
  size_t i_ = 0;
  std::string out_;
  size_t atom_ = 0;             // where the last complete atom starts in out_
  std::vector<size_t> groups_;  // where each open group starts in out_
};

}  // namespace

absl::StatusOr<TranslatedRegex> TranslateRegex(std::string_view pattern, RegexDialect dialect) {
  return Translator(pattern, dialect).Run();
}

}  // namespace leantron::data
