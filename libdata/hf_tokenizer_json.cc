// tokenizer.json -> HfTokenizerSpec: the fields the `tokenizers` library reads (its serde
// definitions), with every component or option that would change ids and is not implemented
// refused by name.
#include <simdjson.h>

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "libdata/hf_tokenizer.h"
#include "libdata/pretokenize_fast.h"
#include "libdata/string_compat.h"
#include "libdata/unicode_class.h"

namespace leantron::data {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

// GPT-2's pre-tokenizer regex, as HF's ByteLevel(use_regex=true) hard-codes it.
constexpr char kByteLevelRegex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::Status Bad(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(Cat(path, ": ", what));
}
absl::Status Unsupported(std::string_view path, std::string_view what) {
  return absl::UnimplementedError(
      Cat(path, ": ", what, " is not implemented (the ids would differ from HF tokenizers')"));
}

// A field that may be absent: simdjson's result carries the error.
using Result = simdjson::simdjson_result<element>;

bool IsNull(Result r) {
  element e;
  return r.get(e) != simdjson::SUCCESS || e.is_null();
}
Result Field(const object& obj, std::string_view key) { return obj.at_key(key); }
bool Has(const object& obj, std::string_view key) { return !IsNull(obj.at_key(key)); }

absl::StatusOr<std::string_view> String(Result e, std::string_view path) {
  std::string_view s;
  if (e.get_string().get(s)) return Bad(path, "expected a string");
  return s;
}
absl::StatusOr<bool> Bool(const object& obj, std::string_view key, std::string_view path,
                          bool fallback) {
  const Result e = Field(obj, key);
  if (IsNull(e)) return fallback;
  bool b;
  if (e.get_bool().get(b)) return Bad(Cat(path, ".", key), "expected true or false");
  return b;
}
absl::StatusOr<int64_t> Int(Result e, std::string_view path) {
  int64_t v;
  if (e.get_int64().get(v)) return Bad(path, "expected an integer");
  return v;
}
absl::StatusOr<std::string_view> Type(const object& obj, std::string_view path) {
  const Result e = Field(obj, "type");
  if (IsNull(e)) return Bad(path, "no \"type\"");
  return String(e, Cat(path, ".type"));
}

// A single character (Metaspace's replacement, Strip's content).
absl::StatusOr<std::string> OneChar(Result e, std::string_view path) {
  absl::StatusOr<std::string_view> s = String(e, path);
  if (!s.ok()) return s.status();
  uint32_t cp;
  const auto* p = reinterpret_cast<const uint8_t*>(s->data());
  if (s->empty() || DecodeUtf8(p, p + s->size(), &cp) != static_cast<int>(s->size()))
    return Bad(path, "expected one character");
  return std::string(*s);
}

// {"String": s} or {"Regex": r}: a literal or an Oniguruma regex.
absl::StatusOr<std::shared_ptr<Regex>> Pattern(Result e, std::string_view path) {
  object obj;
  if (e.get_object().get(obj)) return Bad(path, "expected {\"String\": ...} or {\"Regex\": ...}");
  absl::StatusOr<std::unique_ptr<Regex>> regex;
  if (Has(obj, "String")) {
    absl::StatusOr<std::string_view> s = String(Field(obj, "String"), Cat(path, ".String"));
    if (!s.ok()) return s.status();
    regex = Regex::Literal(*s);
  } else if (Has(obj, "Regex")) {
    absl::StatusOr<std::string_view> s = String(Field(obj, "Regex"), Cat(path, ".Regex"));
    if (!s.ok()) return s.status();
    regex = Regex::Compile(*s, RegexDialect::kOniguruma);
  } else {
    return Bad(path, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  if (!regex.ok())
    return absl::Status(regex.status().code(), Cat(path, ": ", regex.status().message()));
  return std::shared_ptr<Regex>(std::move(*regex));
}

absl::Status ParseNormalizer(Result e, std::string_view path, std::vector<HfNormalizer>* out) {
  if (IsNull(e)) return absl::OkStatus();
  object obj;
  if (e.get_object().get(obj)) return Bad(path, "expected an object");
  absl::StatusOr<std::string_view> type = Type(obj, path);
  if (!type.ok()) return type.status();
  HfNormalizer n;
  if (*type == "Sequence") {
    array items;
    if (Field(obj, "normalizers").get_array().get(items))
      return Bad(path, "Sequence needs \"normalizers\"");
    size_t i = 0;
    for (element item : items) {
      if (absl::Status st =
              ParseNormalizer(Result(element(item)), Cat(path, ".normalizers[", i++, "]"), out);
          !st.ok())
        return st;
    }
    return absl::OkStatus();
  } else if (*type == "NFC" || *type == "NFD" || *type == "NFKC" || *type == "NFKD") {
    n.kind = HfNormalizer::Kind::kUnicode;
    n.form = *type == "NFC"    ? UnicodeForm::kNFC
             : *type == "NFD"  ? UnicodeForm::kNFD
             : *type == "NFKC" ? UnicodeForm::kNFKC
                               : UnicodeForm::kNFKD;
  } else if (*type == "Prepend") {
    absl::StatusOr<std::string_view> s = String(Field(obj, "prepend"), Cat(path, ".prepend"));
    if (!s.ok()) return s.status();
    n.kind = HfNormalizer::Kind::kPrepend;
    n.content = std::string(*s);
  } else if (*type == "Replace") {
    absl::StatusOr<std::shared_ptr<Regex>> regex =
        Pattern(Field(obj, "pattern"), Cat(path, ".pattern"));
    if (!regex.ok()) return regex.status();
    absl::StatusOr<std::string_view> s = String(Field(obj, "content"), Cat(path, ".content"));
    if (!s.ok()) return s.status();
    n.kind = HfNormalizer::Kind::kReplace;
    n.regex = *regex;
    n.content = std::string(*s);
  } else if (*type == "Strip") {
    absl::StatusOr<bool> left = Bool(obj, "strip_left", path, false);
    absl::StatusOr<bool> right = Bool(obj, "strip_right", path, false);
    if (!left.ok()) return left.status();
    if (!right.ok()) return right.status();
    n.kind = HfNormalizer::Kind::kStrip;
    n.strip_left = *left;
    n.strip_right = *right;
  } else {
    return Unsupported(path, Cat("the normalizer ", *type));
  }
  out->push_back(std::move(n));
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(Result e, std::string_view path, std::vector<HfPreTokenizer>* out) {
  if (IsNull(e)) return absl::OkStatus();
  object obj;
  if (e.get_object().get(obj)) return Bad(path, "expected an object");
  absl::StatusOr<std::string_view> type = Type(obj, path);
  if (!type.ok()) return type.status();
  HfPreTokenizer t;
  if (*type == "Sequence") {
    array items;
    if (Field(obj, "pretokenizers").get_array().get(items))
      return Bad(path, "Sequence needs \"pretokenizers\"");
    size_t i = 0;
    for (element item : items) {
      if (absl::Status st =
              ParsePreTokenizer(Result(element(item)), Cat(path, ".pretokenizers[", i++, "]"), out);
          !st.ok())
        return st;
    }
    return absl::OkStatus();
  } else if (*type == "ByteLevel") {
    absl::StatusOr<bool> prefix = Bool(obj, "add_prefix_space", path, true);
    absl::StatusOr<bool> use_regex = Bool(obj, "use_regex", path, true);
    if (!prefix.ok()) return prefix.status();
    if (!use_regex.ok()) return use_regex.status();
    t.kind = HfPreTokenizer::Kind::kByteLevel;
    t.add_prefix_space = *prefix;
    if (*use_regex) {
      absl::StatusOr<std::unique_ptr<Regex>> regex =
          Regex::Compile(kByteLevelRegex, RegexDialect::kOniguruma);
      if (!regex.ok()) return regex.status();
      t.regex = std::move(*regex);
      t.fast = RecognizeFastPattern(kByteLevelRegex);
    }
  } else if (*type == "Split") {
    absl::StatusOr<std::shared_ptr<Regex>> regex =
        Pattern(Field(obj, "pattern"), Cat(path, ".pattern"));
    if (!regex.ok()) return regex.status();
    absl::StatusOr<std::string_view> behavior =
        String(Field(obj, "behavior"), Cat(path, ".behavior"));
    if (!behavior.ok()) return behavior.status();
    absl::StatusOr<bool> invert = Bool(obj, "invert", path, false);
    if (!invert.ok()) return invert.status();
    t.kind = HfPreTokenizer::Kind::kSplit;
    t.regex = *regex;
    t.invert = *invert;
    if (*behavior == "Removed") {
      t.behavior = SplitBehavior::kRemoved;
    } else if (*behavior == "Isolated") {
      t.behavior = SplitBehavior::kIsolated;
    } else if (*behavior == "MergedWithPrevious") {
      t.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (*behavior == "MergedWithNext") {
      t.behavior = SplitBehavior::kMergedWithNext;
    } else if (*behavior == "Contiguous") {
      t.behavior = SplitBehavior::kContiguous;
    } else {
      return Bad(Cat(path, ".behavior"), Cat("unknown behavior \"", *behavior, "\""));
    }
    object pattern;
    if (!Field(obj, "pattern").get_object().get(pattern) && Has(pattern, "Regex")) {
      std::string_view source;
      if (!Field(pattern, "Regex").get_string().get(source)) t.fast = RecognizeFastPattern(source);
    }
  } else if (*type == "Digits") {
    absl::StatusOr<bool> individual = Bool(obj, "individual_digits", path, false);
    if (!individual.ok()) return individual.status();
    t.kind = HfPreTokenizer::Kind::kDigits;
    t.individual_digits = *individual;
  } else if (*type == "Metaspace") {
    absl::StatusOr<std::string> replacement =
        OneChar(Field(obj, "replacement"), Cat(path, ".replacement"));
    if (!replacement.ok()) return replacement.status();
    t.kind = HfPreTokenizer::Kind::kMetaspace;
    t.replacement = *replacement;
    const Result scheme = Field(obj, "prepend_scheme");
    std::string_view s = "always";
    if (!IsNull(scheme) && scheme.get_string().get(s))
      return Bad(Cat(path, ".prepend_scheme"), "expected a string");
    if (s == "always") {
      t.prepend = HfPreTokenizer::Prepend::kAlways;
    } else if (s == "first") {
      t.prepend = HfPreTokenizer::Prepend::kFirst;
    } else if (s == "never") {
      t.prepend = HfPreTokenizer::Prepend::kNever;
    } else {
      return Bad(Cat(path, ".prepend_scheme"), Cat("unknown scheme \"", s, "\""));
    }
    absl::StatusOr<bool> prefix = Bool(obj, "add_prefix_space", path, true);
    if (!prefix.ok()) return prefix.status();
    if (!*prefix) {
      if (t.prepend != HfPreTokenizer::Prepend::kNever && Has(obj, "prepend_scheme"))
        return Bad(path, "add_prefix_space does not match declared prepend_scheme");
      t.prepend = HfPreTokenizer::Prepend::kNever;
    }
    absl::StatusOr<bool> split = Bool(obj, "split", path, true);
    if (!split.ok()) return split.status();
    t.split = *split;
  } else {
    return Unsupported(path, Cat("the pre-tokenizer ", *type));
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status ParseDecoder(Result e, std::string_view path, std::vector<HfDecoder>* out) {
  object obj;
  if (e.get_object().get(obj)) return Bad(path, "expected an object");
  absl::StatusOr<std::string_view> type = Type(obj, path);
  if (!type.ok()) return type.status();
  HfDecoder d;
  if (*type == "Sequence") {
    array items;
    if (Field(obj, "decoders").get_array().get(items))
      return Bad(path, "Sequence needs \"decoders\"");
    size_t i = 0;
    for (element item : items) {
      if (absl::Status st =
              ParseDecoder(Result(element(item)), Cat(path, ".decoders[", i++, "]"), out);
          !st.ok())
        return st;
    }
    return absl::OkStatus();
  } else if (*type == "ByteLevel") {
    d.kind = HfDecoder::Kind::kByteLevel;
  } else if (*type == "ByteFallback") {
    d.kind = HfDecoder::Kind::kByteFallback;
  } else if (*type == "Fuse") {
    d.kind = HfDecoder::Kind::kFuse;
  } else if (*type == "Strip") {
    absl::StatusOr<std::string> content = OneChar(Field(obj, "content"), Cat(path, ".content"));
    if (!content.ok()) return content.status();
    absl::StatusOr<int64_t> start = Int(Field(obj, "start"), Cat(path, ".start"));
    absl::StatusOr<int64_t> stop = Int(Field(obj, "stop"), Cat(path, ".stop"));
    if (!start.ok()) return start.status();
    if (!stop.ok()) return stop.status();
    if (*start < 0 || *stop < 0) return Bad(path, "negative start or stop");
    d.kind = HfDecoder::Kind::kStrip;
    d.content = *content;
    d.start = static_cast<size_t>(*start);
    d.stop = static_cast<size_t>(*stop);
  } else if (*type == "Replace") {
    absl::StatusOr<std::shared_ptr<Regex>> regex =
        Pattern(Field(obj, "pattern"), Cat(path, ".pattern"));
    if (!regex.ok()) return regex.status();
    absl::StatusOr<std::string_view> s = String(Field(obj, "content"), Cat(path, ".content"));
    if (!s.ok()) return s.status();
    d.kind = HfDecoder::Kind::kReplace;
    d.regex = *regex;
    d.content = std::string(*s);
  } else if (*type == "Metaspace") {
    std::vector<HfPreTokenizer> as_pre;
    if (absl::Status st = ParsePreTokenizer(e, path, &as_pre); !st.ok()) return st;
    d.kind = HfDecoder::Kind::kMetaspace;
    d.content = as_pre[0].replacement;
    d.metaspace_prepends = as_pre[0].prepend != HfPreTokenizer::Prepend::kNever;
  } else {
    return Unsupported(path, Cat("the decoder ", *type));
  }
  out->push_back(std::move(d));
  return absl::OkStatus();
}

// Single-sequence post-processing: ids before and after the text.
absl::Status ParsePostProcessor(Result e, std::string_view path, std::vector<int32_t>* prefix,
                                std::vector<int32_t>* suffix) {
  if (IsNull(e)) return absl::OkStatus();
  object obj;
  if (e.get_object().get(obj)) return Bad(path, "expected an object");
  absl::StatusOr<std::string_view> type = Type(obj, path);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (*type == "Sequence") {
    array items;
    if (Field(obj, "processors").get_array().get(items))
      return Bad(path, "Sequence needs \"processors\"");
    size_t i = 0;
    for (element item : items) {
      if (absl::Status st = ParsePostProcessor(Result(element(item)),
                                               Cat(path, ".processors[", i++, "]"), prefix, suffix);
          !st.ok())
        return st;
    }
    return absl::OkStatus();
  }
  if (*type == "RobertaProcessing" || *type == "BertProcessing") {
    // "cls": [token, id], "sep": [token, id]: cls A sep.
    int32_t ids[2];
    const char* keys[2] = {"cls", "sep"};
    for (int k = 0; k < 2; ++k) {
      array pair;
      element id;
      int64_t v;
      if (Field(obj, keys[k]).get_array().get(pair) || pair.size() != 2 || pair.at(1).get(id) ||
          id.get_int64().get(v) || v < 0 || v > INT32_MAX)
        return Bad(Cat(path, ".", keys[k]), "expected [token, id]");
      ids[k] = static_cast<int32_t>(v);
    }
    prefix->push_back(ids[0]);
    suffix->insert(suffix->begin(), ids[1]);
    return absl::OkStatus();
  }
  if (*type != "TemplateProcessing") return Unsupported(path, Cat("the post-processor ", *type));
  array single;
  if (Field(obj, "single").get_array().get(single)) return Bad(path, "no \"single\" template");
  object specials;
  if (Field(obj, "special_tokens").get_object().get(specials))
    return Bad(path, "no \"special_tokens\"");
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  size_t i = 0;
  for (element piece : single) {
    const std::string where = Cat(path, ".single[", i++, "]");
    object p;
    if (piece.get_object().get(p)) return Bad(where, "expected an object");
    if (Has(p, "Sequence")) {
      object seq;
      std::string_view id;
      if (Field(p, "Sequence").get_object().get(seq) || Field(seq, "id").get_string().get(id))
        return Bad(where, "malformed Sequence");
      if (id != "A") return Unsupported(where, "a single-sequence template naming sequence B");
      if (seen_sequence) return Unsupported(where, "a template repeating the sequence");
      seen_sequence = true;
    } else if (Has(p, "SpecialToken")) {
      object tok;
      std::string_view id;
      if (Field(p, "SpecialToken").get_object().get(tok) || Field(tok, "id").get_string().get(id))
        return Bad(where, "malformed SpecialToken");
      object entry;
      array entry_ids;
      if (specials.at_key(id).get(entry) || Field(entry, "ids").get_array().get(entry_ids))
        return Bad(where, Cat("special token \"", id, "\" is not in special_tokens"));
      for (element x : entry_ids) {
        int64_t v;
        if (x.get_int64().get(v) || v < 0 || v > INT32_MAX)
          return Bad(where, Cat("special token \"", id, "\" has a bad id"));
        (seen_sequence ? after : before).push_back(static_cast<int32_t>(v));
      }
    } else {
      return Bad(where, "expected Sequence or SpecialToken");
    }
  }
  prefix->insert(prefix->end(), before.begin(), before.end());
  suffix->insert(suffix->begin(), after.begin(), after.end());
  return absl::OkStatus();
}

absl::Status ParseModel(Result e, HfTokenizerSpec* spec, bool byte_level) {
  const std::string path = "model";
  object obj;
  if (e.get_object().get(obj)) return Bad(path, "expected an object");
  const Result type_field = Field(obj, "type");
  std::string_view type = "BPE";
  if (!IsNull(type_field) && type_field.get_string().get(type))
    return Bad(path + ".type", "expected a string");
  if (type != "BPE") return Unsupported(path, Cat("the model ", type, " (only BPE is)"));
  HfBpeSettings settings;
  settings.byte_level = byte_level;
  const Result dropout = Field(obj, "dropout");
  if (!IsNull(dropout)) {
    double p;
    if (dropout.get_double().get(p)) return Bad(path + ".dropout", "expected a number");
    if (p != 0.0) return Unsupported(path, "BPE dropout (random merges)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Result f = Field(obj, key);
    std::string_view s;
    if (IsNull(f)) continue;
    if (f.get_string().get(s)) return Bad(Cat(path, ".", key), "expected a string");
    if (!s.empty()) return Unsupported(path, Cat("a non-empty ", key));
  }
  const Result unk = Field(obj, "unk_token");
  if (!IsNull(unk)) {
    absl::StatusOr<std::string_view> s = String(unk, path + ".unk_token");
    if (!s.ok()) return s.status();
    settings.unk_token = std::string(*s);
  }
  for (auto [key, flag] : {std::pair{"fuse_unk", &settings.fuse_unk},
                           std::pair{"byte_fallback", &settings.byte_fallback},
                           std::pair{"ignore_merges", &settings.ignore_merges}}) {
    absl::StatusOr<bool> b = Bool(obj, key, path, false);
    if (!b.ok()) return b.status();
    *flag = *b;
  }
  object vocab_obj;
  if (Field(obj, "vocab").get_object().get(vocab_obj))
    return Bad(path + ".vocab", "expected an object");
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(vocab_obj.size());
  for (const auto field : vocab_obj) {
    int64_t id;
    if (field.value.get_int64().get(id))
      return Bad(path + ".vocab",
                 Cat("token \"", absl::CHexEscape(ToAbsl(field.key)), "\": id is not an integer"));
    vocab.emplace_back(std::string(field.key), id);
  }
  array merges_arr;
  if (Field(obj, "merges").get_array().get(merges_arr))
    return Bad(path + ".merges", "expected an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_arr.size());
  size_t rank = 0;
  for (element m : merges_arr) {
    const std::string where = Cat(path, ".merges[", rank, "]");
    std::string_view s;
    array pair;
    if (!m.get_string().get(s)) {
      if (s.rfind("#version", 0) == 0) continue;  // HF skips a version line
      const size_t sp = s.find(' ');
      if (sp == std::string_view::npos || s.find(' ', sp + 1) != std::string_view::npos)
        return Bad(where, "expected \"left right\" (exactly one space)");
      merges.emplace_back(std::string(s.substr(0, sp)), std::string(s.substr(sp + 1)));
    } else if (!m.get_array().get(pair) && pair.size() == 2) {
      std::string_view a, b;
      if (pair.at(0).get_string().get(a) || pair.at(1).get_string().get(b))
        return Bad(where, "expected [left, right] strings");
      merges.emplace_back(std::string(a), std::string(b));
    } else {
      return Bad(where, "expected \"left right\" or [left, right]");
    }
    ++rank;
  }
  absl::StatusOr<std::unique_ptr<HfBpeModel>> model = HfBpeModel::Create(vocab, merges, settings);
  if (!model.ok()) return model.status();
  spec->model = std::move(*model);
  return absl::OkStatus();
}

// HF's AddedVocabulary::add_tokens on load: ids are recomputed (a content in the vocabulary keeps
// its id, a new one takes the next id after the model's vocabulary), as the library does.
absl::Status ParseAddedTokens(Result e, HfTokenizerSpec* spec) {
  if (IsNull(e)) return absl::OkStatus();
  array tokens;
  if (e.get_array().get(tokens)) return Bad("added_tokens", "expected an array");
  int64_t next_id = static_cast<int64_t>(spec->model->vocab_entries());
  absl::flat_hash_map<std::string, int32_t> added_ids;
  size_t i = 0;
  for (element t : tokens) {
    const std::string path = Cat("added_tokens[", i++, "]");
    object obj;
    if (t.get_object().get(obj)) return Bad(path, "expected an object");
    HfAddedToken tok;
    absl::StatusOr<std::string_view> content = String(Field(obj, "content"), path + ".content");
    if (!content.ok()) return content.status();
    tok.content = std::string(*content);
    absl::StatusOr<bool> special = Bool(obj, "special", path, false);
    if (!special.ok()) return special.status();
    tok.special = *special;
    for (auto [key, flag, fallback] :
         {std::tuple{"single_word", &tok.single_word, false},
          std::tuple{"lstrip", &tok.lstrip, false}, std::tuple{"rstrip", &tok.rstrip, false},
          std::tuple{"normalized", &tok.normalized, !tok.special}}) {
      absl::StatusOr<bool> b = Bool(obj, key, path, fallback);
      if (!b.ok()) return b.status();
      *flag = *b;
    }
    if (tok.content.empty()) continue;  // HF ignores empty tokens
    if (const auto it = added_ids.find(tok.content); it != added_ids.end()) {
      tok.id = it->second;
    } else if (const int32_t id = spec->model->FindString(tok.content); id >= 0) {
      tok.id = id;
    } else {
      if (next_id > INT32_MAX) return Bad(path, "too many tokens");
      tok.id = static_cast<int32_t>(next_id++);
    }
    added_ids[tok.content] = tok.id;
    // A token added again replaces the earlier entry.
    std::erase_if(spec->added, [&](const HfAddedToken& a) { return a.content == tok.content; });
    spec->added.push_back(std::move(tok));
  }
  return absl::OkStatus();
}

// tokenizer_config.json's "eos_token" / "bos_token": a string or {"content": ...}.
absl::StatusOr<std::optional<std::string>> ConfigToken(const object& config, std::string_view key) {
  const Result e = Field(config, key);
  if (IsNull(e)) return std::optional<std::string>();
  std::string_view s;
  if (!e.get_string().get(s)) return std::optional<std::string>(std::string(s));
  object obj;
  if (!e.get_object().get(obj) && !Field(obj, "content").get_string().get(s))
    return std::optional<std::string>(std::string(s));
  return Bad(Cat("tokenizer_config.json: ", key), "expected a string or {\"content\": ...}");
}

}  // namespace

absl::StatusOr<HfTokenizerSpec> ParseHfTokenizerJson(std::string_view json, std::string_view name,
                                                     std::string_view config_json) {
  const auto in_file = [&](const absl::Status& st) {
    return absl::Status(st.code(), Cat(name, ": ", st.message()));
  };
  simdjson::dom::parser parser;
  element doc;
  if (auto err = parser.parse(simdjson::padded_string(json)).get(doc); err)
    return in_file(Bad("tokenizer.json", Cat("not valid JSON: ", simdjson::error_message(err))));
  object root;
  if (doc.get_object().get(root)) return in_file(Bad("tokenizer.json", "not a JSON object"));
  HfTokenizerSpec spec;
  spec.source = std::string(name);
  const Result version = Field(root, "version");
  std::string_view v;
  if (!IsNull(version) && (version.get_string().get(v) || v != "1.0"))
    return in_file(Unsupported("version", Cat("tokenizer.json version \"", v, "\"")));
  for (const char* key : {"truncation", "padding"}) {
    if (Has(root, key)) return in_file(Unsupported(key, Cat("a non-null ", key)));
  }
  if (absl::Status st = ParseNormalizer(Field(root, "normalizer"), "normalizer", &spec.normalizers);
      !st.ok())
    return in_file(st);
  if (absl::Status st =
          ParsePreTokenizer(Field(root, "pre_tokenizer"), "pre_tokenizer", &spec.pre_tokenizers);
      !st.ok())
    return in_file(st);
  bool byte_level = false;
  for (size_t i = 0; i < spec.pre_tokenizers.size(); ++i) {
    if (spec.pre_tokenizers[i].kind != HfPreTokenizer::Kind::kByteLevel) continue;
    if (i + 1 != spec.pre_tokenizers.size())
      return in_file(Unsupported("pre_tokenizer", "a ByteLevel pre-tokenizer followed by others"));
    byte_level = true;
  }
  if (!Has(root, "model")) return in_file(Bad("model", "missing"));
  if (absl::Status st = ParseModel(Field(root, "model"), &spec, byte_level); !st.ok())
    return in_file(st);
  if (absl::Status st = ParseAddedTokens(Field(root, "added_tokens"), &spec); !st.ok())
    return in_file(st);
  if (absl::Status st = ParsePostProcessor(Field(root, "post_processor"), "post_processor",
                                           &spec.prefix, &spec.suffix);
      !st.ok())
    return in_file(st);
  const Result decoder = Field(root, "decoder");
  if (!IsNull(decoder)) {
    spec.has_decoder = true;
    if (absl::Status st = ParseDecoder(decoder, "decoder", &spec.decoders); !st.ok())
      return in_file(st);
  }
  if (!config_json.empty()) {
    simdjson::dom::parser config_parser;
    element config_doc;
    object config;
    if (config_parser.parse(simdjson::padded_string(config_json)).get(config_doc) ||
        config_doc.get_object().get(config))
      return absl::InvalidArgumentError(Cat(name, ": tokenizer_config.json is not a JSON object"));
    absl::StatusOr<std::optional<std::string>> eos = ConfigToken(config, "eos_token");
    absl::StatusOr<std::optional<std::string>> bos = ConfigToken(config, "bos_token");
    if (!eos.ok()) return in_file(eos.status());
    if (!bos.ok()) return in_file(bos.status());
    spec.eos_token = *eos;
    spec.bos_token = *bos;
  }
  return spec;
}

}  // namespace leantron::data
