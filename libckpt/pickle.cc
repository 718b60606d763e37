#include "libckpt/pickle.h"

#include <cmath>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {
namespace {

// Opcodes (CPython Lib/pickletools.py).
enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadonlyBuffer = 0x98,
};

// Modules whose globals exist to run code or touch the system. A checkpoint has no business
// naming them; refusing them outright gives a clear error instead of an inert placeholder.
bool IsDangerousGlobal(std::string_view module, std::string_view name) {
  static const absl::flat_hash_set<std::string_view> kModules = {
      "os",      "posix",      "nt",        "subprocess",      "sys",
      "shutil",  "socket",     "importlib", "runpy",           "pty",
      "code",    "codeop",     "ctypes",    "pickle",          "_pickle",
      "marshal", "webbrowser", "commands",  "multiprocessing", "asyncio",
      "pdb",     "timeit",     "trace",     "popen2",          "posixpath",
      "ntpath",  "zipimport"};
  const std::string_view top = module.substr(0, module.find('.'));
  if (kModules.contains(top)) return true;
  if (module == "builtins" || module == "__builtin__") {
    static const absl::flat_hash_set<std::string_view> kDataBuiltins = {
        "set",   "frozenset", "bytearray", "slice",          "complex", "object", "int",
        "float", "str",       "bytes",     "list",           "dict",    "tuple",  "bool",
        "range", "NoneType",  "Ellipsis",  "NotImplemented", "type"};
    return !kDataBuiltins.contains(name);
  }
  return false;
}

}  // namespace

PyValue* Pickle::New(PyKind kind) {
  values_.emplace_back();
  values_.back().kind = kind;
  return &values_.back();
}

class Unpickler {
 public:
  Unpickler(Pickle* out, std::span<const std::byte> bytes)
      : out_(out), p_(reinterpret_cast<const uint8_t*>(bytes.data())), end_(p_ + bytes.size()) {}

  absl::Status Run() {
    while (true) {
      if (p_ >= end_) return Error("ends without a STOP opcode");
      const uint8_t op = *p_++;
      if (op == kStop) {
        if (stack_.size() != 1 || !marks_.empty()) return Error("STOP with a malformed stack");
        out_->root_ = stack_.back();
        return absl::OkStatus();
      }
      if (auto s = Step(op); !s.ok()) return s;
    }
  }

 private:
  absl::Status Error(std::string_view why) const {
    const size_t at = static_cast<size_t>(p_ - start_()) - (p_ > start_() ? 1 : 0);
    return absl::DataLossError(Cat(out_->source_, ": bad pickle at byte ", at, ": ", why));
  }
  const uint8_t* start_() const { return end_ - total_; }

  // Reads n bytes (n checked against what is left).
  absl::StatusOr<std::string_view> Take(uint64_t n) {
    if (n > static_cast<uint64_t>(end_ - p_)) {
      return Error(Cat("length ", n, " runs past the end (", end_ - p_, " bytes left)"));
    }
    std::string_view out(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return out;
  }
  absl::StatusOr<uint64_t> TakeLe(int width) {
    auto bytes = Take(width);
    if (!bytes.ok()) return bytes.status();
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = v << 8 | static_cast<uint8_t>((*bytes)[i]);
    return v;
  }
  absl::StatusOr<std::string_view> TakeLine() {
    const void* nl = std::memchr(p_, '\n', end_ - p_);
    if (nl == nullptr) return Error("text argument without a newline");
    std::string_view out(reinterpret_cast<const char*>(p_), static_cast<const uint8_t*>(nl) - p_);
    p_ = static_cast<const uint8_t*>(nl) + 1;
    return out;
  }

  absl::StatusOr<PyValue*> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      return Error("pops an empty stack");
    }
    PyValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  absl::StatusOr<PyValue*> Top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      return Error("reads an empty stack");
    }
    return stack_.back();
  }
  // The values pushed since the last MARK, removing them and the mark.
  absl::StatusOr<std::vector<PyValue*>> PopMark() {
    if (marks_.empty()) return Error("no MARK to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PyValue*> items(stack_.begin() + mark, stack_.end());
    stack_.resize(mark);
    return items;
  }
  void Push(PyValue* v) { stack_.push_back(v); }

  PyValue* MakeInt(int64_t v) {
    PyValue* x = out_->New(PyKind::kInt);
    x->integer = v;
    return x;
  }
  PyValue* MakeStr(PyKind kind, std::string_view text) {
    PyValue* x = out_->New(kind);
    x->s.assign(text);
    return x;
  }
  PyValue* MakeSeq(PyKind kind, std::vector<PyValue*> items) {
    PyValue* x = out_->New(kind);
    x->items = std::move(items);
    return x;
  }

  // Two's complement little-endian integer of any length.
  PyValue* MakeLong(std::string_view bytes) {
    size_t n = bytes.size();
    if (n == 0) return MakeInt(0);
    const bool negative = static_cast<uint8_t>(bytes[n - 1]) & 0x80;
    // Drop redundant sign bytes, then see whether it fits 64 bits.
    while (n > 1 && static_cast<uint8_t>(bytes[n - 1]) == (negative ? 0xFF : 0x00) &&
           ((static_cast<uint8_t>(bytes[n - 2]) & 0x80) != 0) == negative) {
      --n;
    }
    if (n <= 8) {
      uint64_t v = negative ? ~uint64_t{0} : 0;
      for (size_t i = n; i-- > 0;) v = v << 8 | static_cast<uint8_t>(bytes[i]);
      return MakeInt(static_cast<int64_t>(v));
    }
    return MakeStr(PyKind::kBigInt, bytes.substr(0, n));
  }

  absl::Status PushGlobal(std::string_view module, std::string_view name) {
    if (IsDangerousGlobal(module, name)) {
      return absl::PermissionDeniedError(
          Cat(out_->source_, ": the pickle refers to ", module, ".", name,
              ", which can run code; Leantron never executes pickled code and refuses it"));
    }
    PyValue* g = out_->New(PyKind::kGlobal);
    g->s.assign(module);
    g->name.assign(name);
    Push(g);
    return absl::OkStatus();
  }

  // callable(*args): data constructors become data; everything else an inert placeholder.
  absl::StatusOr<PyValue*> Call(PyValue* callable, PyValue* args) {
    const bool tuple_args = args->kind == PyKind::kTuple;
    auto arg = [&](size_t i) -> PyValue* {
      return tuple_args && i < args->items.size() ? args->items[i] : nullptr;
    };
    const size_t nargs = tuple_args ? args->items.size() : 0;
    if (callable->kind == PyKind::kGlobal) {
      const std::string& m = callable->s;
      const std::string& n = callable->name;
      if (m == "collections" && n == "OrderedDict" && nargs == 0) {
        PyValue* d = out_->New(PyKind::kDict);
        d->boolean = true;  // ordered
        return d;
      }
      const bool builtin = m == "builtins" || m == "__builtin__";
      if (builtin && (n == "set" || n == "frozenset") && nargs <= 1) {
        PyValue* s = out_->New(PyKind::kSet);
        if (nargs == 1 && (arg(0)->kind == PyKind::kList || arg(0)->kind == PyKind::kTuple)) {
          s->items = arg(0)->items;
        } else if (nargs == 1) {
          return Error(Cat(n, "() of a ", PyKindName(arg(0)->kind)));
        }
        return s;
      }
      if (builtin && n == "bytearray" && nargs <= 1) {
        if (nargs == 0) return MakeStr(PyKind::kBytes, "");
        if (arg(0)->kind == PyKind::kBytes) return MakeStr(PyKind::kBytes, arg(0)->s);
      }
      if (m == "_codecs" && n == "encode" && nargs == 2 && arg(0)->kind == PyKind::kStr &&
          (arg(1)->IsStr("latin1") || arg(1)->IsStr("latin-1"))) {
        // Protocol 2's spelling of bytes: the str's code points, each below 256.
        std::string bytes;
        const std::string& text = arg(0)->s;
        for (size_t i = 0; i < text.size();) {
          const auto c = static_cast<uint8_t>(text[i]);
          if (c < 0x80) {
            bytes.push_back(static_cast<char>(c));
            i += 1;
          } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size() && c <= 0xC3) {
            bytes.push_back(static_cast<char>(((c & 0x1F) << 6) | (text[i + 1] & 0x3F)));
            i += 2;
          } else {
            return Error("_codecs.encode of a str outside latin-1");
          }
        }
        return MakeStr(PyKind::kBytes, bytes);
      }
      if (m == "torch" && n == "Size" && nargs == 1 && arg(0)->kind == PyKind::kTuple) {
        return MakeSeq(PyKind::kTuple, arg(0)->items);
      }
    }
    PyValue* call = out_->New(PyKind::kCall);
    call->callable = callable;
    call->args = args;
    return call;
  }

  absl::Status Step(uint8_t op);

  Pickle* out_;
  const uint8_t* p_;
  const uint8_t* end_;
  size_t total_ = static_cast<size_t>(end_ - p_);
  std::vector<PyValue*> stack_;
  std::vector<size_t> marks_;
  absl::flat_hash_map<uint64_t, PyValue*> memo_;
};

absl::Status Unpickler::Step(uint8_t op) {
#define TRY_ASSIGN(var, expr)                   \
  auto var##_or = (expr);                       \
  if (!var##_or.ok()) return var##_or.status(); \
  auto var = *std::move(var##_or)
  switch (op) {
    case kProto: {
      TRY_ASSIGN(version, TakeLe(1));
      if (version > 5) return Error(Cat("unsupported pickle protocol ", version));
      return absl::OkStatus();
    }
    case kFrame: {
      TRY_ASSIGN(length, TakeLe(8));
      if (length > static_cast<uint64_t>(end_ - p_)) return Error("frame runs past the end");
      return absl::OkStatus();
    }
    case kMark:
      marks_.push_back(stack_.size());
      return absl::OkStatus();
    case kPop: {
      if (!marks_.empty() && stack_.size() == marks_.back()) {
        marks_.pop_back();  // POP of a bare MARK, as CPython allows.
        return absl::OkStatus();
      }
      TRY_ASSIGN(v, Pop());
      (void)v;
      return absl::OkStatus();
    }
    case kPopMark: {
      TRY_ASSIGN(items, PopMark());
      (void)items;
      return absl::OkStatus();
    }
    case kDup: {
      TRY_ASSIGN(top, Top());
      Push(top);
      return absl::OkStatus();
    }
    case kNone:
      Push(out_->New(PyKind::kNone));
      return absl::OkStatus();
    case kNewTrue:
    case kNewFalse: {
      PyValue* b = out_->New(PyKind::kBool);
      b->boolean = op == kNewTrue;
      Push(b);
      return absl::OkStatus();
    }
    case kBinInt: {
      TRY_ASSIGN(v, TakeLe(4));
      Push(MakeInt(static_cast<int32_t>(static_cast<uint32_t>(v))));
      return absl::OkStatus();
    }
    case kBinInt1:
    case kBinInt2: {
      TRY_ASSIGN(v, TakeLe(op == kBinInt1 ? 1 : 2));
      Push(MakeInt(static_cast<int64_t>(v)));
      return absl::OkStatus();
    }
    case kInt:
    case kLong: {
      TRY_ASSIGN(line, TakeLine());
      if (op == kInt && (line == "00" || line == "01")) {
        PyValue* b = out_->New(PyKind::kBool);
        b->boolean = line == "01";
        Push(b);
        return absl::OkStatus();
      }
      if (op == kLong && !line.empty() && line.back() == 'L') line.remove_suffix(1);
      int64_t v = 0;
      if (!absl::SimpleAtoi(ToAbsl(line), &v)) return Error("text integer outside 64 bits");
      Push(MakeInt(v));
      return absl::OkStatus();
    }
    case kLong1:
    case kLong4: {
      TRY_ASSIGN(n, TakeLe(op == kLong1 ? 1 : 4));
      if (op == kLong4 && static_cast<int32_t>(static_cast<uint32_t>(n)) < 0) {
        return Error("LONG4 with a negative length");
      }
      TRY_ASSIGN(bytes, Take(n));
      Push(MakeLong(bytes));
      return absl::OkStatus();
    }
    case kBinFloat: {
      TRY_ASSIGN(bits, TakeLe(8));
      // Big-endian on the wire.
      uint64_t be = 0;
      for (int i = 0; i < 8; ++i) be = be << 8 | ((bits >> (8 * i)) & 0xFF);
      PyValue* f = out_->New(PyKind::kFloat);
      std::memcpy(&f->real, &be, 8);
      Push(f);
      return absl::OkStatus();
    }
    case kFloat: {
      TRY_ASSIGN(line, TakeLine());
      double v = 0;
      if (!absl::SimpleAtod(ToAbsl(line), &v)) return Error("bad text float");
      PyValue* f = out_->New(PyKind::kFloat);
      f->real = v;
      Push(f);
      return absl::OkStatus();
    }
    case kBinUnicode:
    case kShortBinUnicode:
    case kBinUnicode8:
    case kBinBytes:
    case kShortBinBytes:
    case kBinBytes8:
    case kByteArray8:
    case kBinString:
    case kShortBinString: {
      const int width = op == kShortBinUnicode || op == kShortBinBytes || op == kShortBinString ? 1
                        : op == kBinUnicode8 || op == kBinBytes8 || op == kByteArray8           ? 8
                                                                                                : 4;
      TRY_ASSIGN(n, TakeLe(width));
      if (op == kBinString && static_cast<int32_t>(static_cast<uint32_t>(n)) < 0) {
        return Error("BINSTRING with a negative length");
      }
      TRY_ASSIGN(text, Take(n));
      const bool is_str = op == kBinUnicode || op == kShortBinUnicode || op == kBinUnicode8 ||
                          op == kBinString || op == kShortBinString;
      Push(MakeStr(is_str ? PyKind::kStr : PyKind::kBytes, text));
      return absl::OkStatus();
    }
    case kString:
    case kUnicode:
      return Error("text-mode (protocol 0) strings are not supported");
    case kEmptyTuple:
      Push(MakeSeq(PyKind::kTuple, {}));
      return absl::OkStatus();
    case kTuple1:
    case kTuple2:
    case kTuple3: {
      const size_t n = op - kTuple1 + 1;
      std::vector<PyValue*> items(n);
      for (size_t i = n; i-- > 0;) {
        TRY_ASSIGN(v, Pop());
        items[i] = v;
      }
      Push(MakeSeq(PyKind::kTuple, std::move(items)));
      return absl::OkStatus();
    }
    case kTuple:
    case kList:
    case kFrozenSet: {
      TRY_ASSIGN(items, PopMark());
      Push(MakeSeq(op == kTuple  ? PyKind::kTuple
                   : op == kList ? PyKind::kList
                                 : PyKind::kSet,
                   std::move(items)));
      return absl::OkStatus();
    }
    case kEmptyList:
      Push(MakeSeq(PyKind::kList, {}));
      return absl::OkStatus();
    case kEmptyDict:
      Push(MakeSeq(PyKind::kDict, {}));
      return absl::OkStatus();
    case kEmptySet:
      Push(MakeSeq(PyKind::kSet, {}));
      return absl::OkStatus();
    case kDict: {
      TRY_ASSIGN(items, PopMark());
      if (items.size() % 2 != 0) return Error("DICT with an odd number of items");
      Push(MakeSeq(PyKind::kDict, std::move(items)));
      return absl::OkStatus();
    }
    case kAppend:
    case kAppends: {
      std::vector<PyValue*> items;
      if (op == kAppend) {
        TRY_ASSIGN(v, Pop());
        items.push_back(v);
      } else {
        TRY_ASSIGN(popped, PopMark());
        items = std::move(popped);
      }
      TRY_ASSIGN(target, Top());
      if (target->kind != PyKind::kList && target->kind != PyKind::kCall) {
        return Error(Cat("APPEND to a ", PyKindName(target->kind)));
      }
      target->items.insert(target->items.end(), items.begin(), items.end());
      return absl::OkStatus();
    }
    case kSetItem:
    case kSetItems: {
      std::vector<PyValue*> items;
      if (op == kSetItem) {
        TRY_ASSIGN(value, Pop());
        TRY_ASSIGN(key, Pop());
        items = {key, value};
      } else {
        TRY_ASSIGN(popped, PopMark());
        items = std::move(popped);
      }
      if (items.size() % 2 != 0) return Error("SETITEMS with an odd number of items");
      TRY_ASSIGN(target, Top());
      if (target->kind == PyKind::kDict) {
        target->items.insert(target->items.end(), items.begin(), items.end());
      } else if (target->kind == PyKind::kCall) {
        target->set_items.insert(target->set_items.end(), items.begin(), items.end());
      } else {
        return Error(Cat("SETITEM on a ", PyKindName(target->kind)));
      }
      return absl::OkStatus();
    }
    case kAddItems: {
      TRY_ASSIGN(items, PopMark());
      TRY_ASSIGN(target, Top());
      if (target->kind != PyKind::kSet)
        return Error(Cat("ADDITEMS to a ", PyKindName(target->kind)));
      target->items.insert(target->items.end(), items.begin(), items.end());
      return absl::OkStatus();
    }
    case kGlobal: {
      TRY_ASSIGN(module, TakeLine());
      TRY_ASSIGN(name, TakeLine());
      return PushGlobal(module, name);
    }
    case kStackGlobal: {
      TRY_ASSIGN(name, Pop());
      TRY_ASSIGN(module, Pop());
      if (name->kind != PyKind::kStr || module->kind != PyKind::kStr) {
        return Error("STACK_GLOBAL of non-strings");
      }
      return PushGlobal(module->s, name->s);
    }
    case kInst: {
      TRY_ASSIGN(module, TakeLine());
      TRY_ASSIGN(name, TakeLine());
      TRY_ASSIGN(items, PopMark());
      if (auto s = PushGlobal(module, name); !s.ok()) return s;
      TRY_ASSIGN(cls, Pop());
      TRY_ASSIGN(call, Call(cls, MakeSeq(PyKind::kTuple, std::move(items))));
      Push(call);
      return absl::OkStatus();
    }
    case kObj: {
      TRY_ASSIGN(items, PopMark());
      if (items.empty()) return Error("OBJ without a class");
      PyValue* cls = items.front();
      items.erase(items.begin());
      TRY_ASSIGN(call, Call(cls, MakeSeq(PyKind::kTuple, std::move(items))));
      Push(call);
      return absl::OkStatus();
    }
    case kReduce:
    case kNewObj: {
      TRY_ASSIGN(args, Pop());
      TRY_ASSIGN(callable, Pop());
      if (args->kind != PyKind::kTuple) return Error("REDUCE/NEWOBJ arguments are not a tuple");
      TRY_ASSIGN(call, Call(callable, args));
      Push(call);
      return absl::OkStatus();
    }
    case kNewObjEx: {
      TRY_ASSIGN(kwargs, Pop());
      TRY_ASSIGN(args, Pop());
      TRY_ASSIGN(cls, Pop());
      if (args->kind != PyKind::kTuple || kwargs->kind != PyKind::kDict) {
        return Error("NEWOBJ_EX with malformed arguments");
      }
      PyValue* call = out_->New(PyKind::kCall);
      call->callable = cls;
      call->args = args;
      call->kwargs = kwargs;
      Push(call);
      return absl::OkStatus();
    }
    case kBuild: {
      TRY_ASSIGN(state, Pop());
      TRY_ASSIGN(target, Top());
      // An OrderedDict's state is its instance attributes (torch's state_dict() sets _metadata).
      const bool attributes_of_dict = target->kind == PyKind::kDict && state->kind == PyKind::kDict;
      if (target->kind != PyKind::kCall && !attributes_of_dict) {
        return Error(Cat("BUILD on a ", PyKindName(target->kind)));
      }
      target->state = state;
      return absl::OkStatus();
    }
    case kBinPersId:
    case kPersId: {
      PyValue* id;
      if (op == kBinPersId) {
        TRY_ASSIGN(v, Pop());
        id = v;
      } else {
        TRY_ASSIGN(line, TakeLine());
        id = MakeStr(PyKind::kStr, line);
      }
      PyValue* pers = out_->New(PyKind::kPersistent);
      pers->args = id;
      Push(pers);
      return absl::OkStatus();
    }
    case kPut:
    case kBinPut:
    case kLongBinPut:
    case kMemoize: {
      uint64_t index = memo_.size();
      if (op == kPut) {
        TRY_ASSIGN(line, TakeLine());
        if (!absl::SimpleAtoi(ToAbsl(line), &index)) return Error("bad PUT index");
      } else if (op != kMemoize) {
        TRY_ASSIGN(v, TakeLe(op == kBinPut ? 1 : 4));
        index = v;
      }
      TRY_ASSIGN(top, Top());
      memo_[index] = top;
      return absl::OkStatus();
    }
    case kGet:
    case kBinGet:
    case kLongBinGet: {
      uint64_t index = 0;
      if (op == kGet) {
        TRY_ASSIGN(line, TakeLine());
        if (!absl::SimpleAtoi(ToAbsl(line), &index)) return Error("bad GET index");
      } else {
        TRY_ASSIGN(v, TakeLe(op == kBinGet ? 1 : 4));
        index = v;
      }
      auto it = memo_.find(index);
      if (it == memo_.end()) return Error(Cat("GET of memo entry ", index, ", never PUT"));
      Push(it->second);
      return absl::OkStatus();
    }
    case kExt1:
    case kExt2:
    case kExt4:
      return Error("extension-registry opcodes (EXT1/2/4) are not supported");
    case kNextBuffer:
    case kReadonlyBuffer:
      return Error("out-of-band buffers (protocol 5) are not supported");
    default:
      return Error(absl::StrFormat("unknown opcode 0x%02x", op));
  }
#undef TRY_ASSIGN
}

absl::StatusOr<std::unique_ptr<Pickle>> Pickle::Parse(std::span<const std::byte> bytes,
                                                      std::string source) {
  if (bytes.size() > kMaxPickleBytes) {
    return absl::ResourceExhaustedError(Cat(source, ": pickle of ", bytes.size(),
                                            " bytes is larger than the ", kMaxPickleBytes,
                                            "-byte limit"));
  }
  std::unique_ptr<Pickle> pickle(new Pickle());
  pickle->source_ = std::move(source);
  Unpickler unpickler(pickle.get(), bytes);
  if (auto s = unpickler.Run(); !s.ok()) return s;
  return pickle;
}

}  // namespace leantron::ckpt
