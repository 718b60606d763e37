// The inert values an unpickled pickle.h tree is made of: kind names, dictionary and object
// lookups, and a bounded Python-like rendering for messages and `inspect`.
#include <cmath>
#include <string>

#include "absl/strings/str_format.h"
#include "libckpt/pickle.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {

std::string_view PyKindName(PyKind kind) {
  switch (kind) {
    case PyKind::kNone:
      return "None";
    case PyKind::kBool:
      return "bool";
    case PyKind::kInt:
    case PyKind::kBigInt:
      return "int";
    case PyKind::kFloat:
      return "float";
    case PyKind::kStr:
      return "str";
    case PyKind::kBytes:
      return "bytes";
    case PyKind::kTuple:
      return "tuple";
    case PyKind::kList:
      return "list";
    case PyKind::kDict:
      return "dict";
    case PyKind::kSet:
      return "set";
    case PyKind::kGlobal:
      return "global";
    case PyKind::kCall:
      return "object";
    case PyKind::kPersistent:
      return "persistent id";
  }
  return "?";
}

const PyValue* DictGet(const PyValue* dict, std::string_view key) {
  if (dict == nullptr || dict->kind != PyKind::kDict) return nullptr;
  // Later keys win, as in Python.
  for (size_t i = dict->items.size(); i >= 2; i -= 2) {
    if (dict->items[i - 2]->IsStr(key)) return dict->items[i - 1];
  }
  return nullptr;
}

const PyValue* ObjectDict(const PyValue* object) {
  if (object == nullptr || object->kind != PyKind::kCall || object->state == nullptr) {
    return nullptr;
  }
  const PyValue* state = object->state;
  if (state->kind == PyKind::kDict) return state;
  if (state->kind == PyKind::kTuple && state->items.size() == 2) {
    if (state->items[0]->kind == PyKind::kDict) return state->items[0];
    if (state->items[1]->kind == PyKind::kDict) return state->items[1];
  }
  return nullptr;
}

namespace {

void Repr(const PyValue* v, int depth, size_t max_chars, std::string* out) {
  if (out->size() > max_chars) return;
  if (depth > 6) {
    out->append("...");
    return;
  }
  auto seq = [&](const std::vector<PyValue*>& items, const char* open, const char* close,
                 bool pairs) {
    out->append(open);
    for (size_t i = 0; i < items.size(); ++i) {
      if (out->size() > max_chars) {
        out->append("...");
        break;
      }
      if (i > 0) out->append(pairs && i % 2 == 1 ? ": " : ", ");
      Repr(items[i], depth + 1, max_chars, out);
    }
    out->append(close);
  };
  switch (v->kind) {
    case PyKind::kNone:
      out->append("None");
      break;
    case PyKind::kBool:
      out->append(v->boolean ? "True" : "False");
      break;
    case PyKind::kInt:
      CatAppend(out, v->integer);
      break;
    case PyKind::kBigInt:
      CatAppend(out, "<", v->s.size() * 8, "-bit int>");
      break;
    case PyKind::kFloat:
      out->append(absl::StrFormat("%.10g", v->real));
      break;
    case PyKind::kStr:
      CatAppend(out, "'", v->s.substr(0, 80), v->s.size() > 80 ? "...'" : "'");
      break;
    case PyKind::kBytes:
      CatAppend(out, "<", v->s.size(), " bytes>");
      break;
    case PyKind::kTuple:
      seq(v->items, "(", ")", false);
      break;
    case PyKind::kList:
      seq(v->items, "[", "]", false);
      break;
    case PyKind::kSet:
      seq(v->items, "{", "}", false);
      break;
    case PyKind::kDict:
      seq(v->items, "{", "}", true);
      break;
    case PyKind::kGlobal:
      CatAppend(out, v->s, ".", v->name);
      break;
    case PyKind::kPersistent:
      out->append("<persistent ");
      Repr(v->args, depth + 1, max_chars, out);
      out->append(">");
      break;
    case PyKind::kCall:
      out->append("<");
      Repr(v->callable, depth + 1, max_chars, out);
      if (v->args != nullptr && !v->args->items.empty()) {
        seq(v->args->items, "(", ")", false);
      } else {
        out->append("()");
      }
      out->append(">");
      break;
  }
}

}  // namespace

std::string PyRepr(const PyValue* value, size_t max_chars) {
  std::string out;
  if (value != nullptr) Repr(value, 0, max_chars, &out);
  if (out.size() > max_chars) {
    out.resize(max_chars);
    out.append("...");
  }
  return out;
}

}  // namespace leantron::ckpt
