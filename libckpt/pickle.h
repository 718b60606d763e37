// A restricted unpickler for what torch.save and torch.distributed.checkpoint write (pickle
// protocols 0-5, opcodes as CPython's Lib/pickletools.py documents them). It builds an inert tree
// of values and never imports or calls anything:
//   - None, bools, ints (arbitrary length; beyond 64 bits kept as bytes), floats, str, bytes,
//     tuples, lists, dicts, sets, and the globals a pickle names;
//   - constructors that only build data become that data: collections.OrderedDict -> dict,
//     builtins.set/frozenset -> set, _codecs.encode(s, "latin1") and bytearray -> bytes,
//     torch.Size -> tuple;
//   - any other call (REDUCE, NEWOBJ, BUILD of a class: torch's tensor rebuild functions,
//     argparse.Namespace, Megatron's enums and dataclasses, numpy arrays) becomes a kCall
//     placeholder recording the callable, its arguments and its state, which nothing ever calls;
//   - persistent ids (torch's storages) become kPersistent values holding the id.
// Globals from modules that exist to run code (os, subprocess, sys, builtins.eval, ...) are refused
// outright with an error. Memory is bounded by the input: each opcode creates at most one value,
// lengths are checked against the bytes left, and the memo is a map (a huge memo index allocates
// nothing). Values can share children or form cycles (a list that contains itself); they live in
// an arena, so nothing recurses to destroy them, and readers walk them with depth limits.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace leantron::ckpt {

enum class PyKind : uint8_t {
  kNone,
  kBool,
  kInt,
  kBigInt,  // Beyond 64 bits: `s` holds the two's complement bytes, little-endian.
  kFloat,
  kStr,
  kBytes,
  kTuple,
  kList,
  kDict,  // `items` holds key, value, key, value, ... in insertion order.
  kSet,
  kGlobal,      // `s` module, `name` qualified name.
  kCall,        // callable(*args, **kwargs), then __setstate__(state), appends and setitems.
  kPersistent,  // persistent_load(args): torch's storages.
};

struct PyValue {
  PyKind kind = PyKind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string s;
  std::string name;
  std::vector<PyValue*> items;
  PyValue* callable = nullptr;      // kCall
  PyValue* args = nullptr;          // kCall (a tuple), kPersistent (the id)
  PyValue* kwargs = nullptr;        // kCall from NEWOBJ_EX
  PyValue* state = nullptr;         // kCall after BUILD; kDict: an OrderedDict's attributes
  std::vector<PyValue*> set_items;  // kCall: SETITEM pairs, key, value, ...

  bool IsStr(std::string_view text) const { return kind == PyKind::kStr && s == text; }
  bool IsGlobal(std::string_view module, std::string_view qualname) const {
    return kind == PyKind::kGlobal && s == module && name == qualname;
  }
  // A call of the global module.qualname.
  bool IsCallOf(std::string_view module, std::string_view qualname) const {
    return kind == PyKind::kCall && callable != nullptr && callable->IsGlobal(module, qualname);
  }
};

// Python's name of a kind ("dict", "str", ...), for error messages.
std::string_view PyKindName(PyKind kind);

// Value of key `key` (a str) in a kDict, or nullptr.
const PyValue* DictGet(const PyValue* dict, std::string_view key);
// The attribute dictionary of an object built by NEWOBJ/REDUCE + BUILD (argparse.Namespace,
// dataclasses): its state when that is a dict, or the dict of a (dict, slots) state tuple.
const PyValue* ObjectDict(const PyValue* object);
// A short Python-like rendering (depth- and length-limited, safe on cycles) for messages and
// `inspect`: "{'lr': 0.001, ...}", "<call torch._utils._rebuild_tensor_v2(...)>".
std::string PyRepr(const PyValue* value, size_t max_chars = 200);

class Pickle {
 public:
  // `source` names the pickle in errors ("model_optim_rng.pt: data.pkl").
  static absl::StatusOr<std::unique_ptr<Pickle>> Parse(std::span<const std::byte> bytes,
                                                       std::string source);
  const PyValue* root() const { return root_; }
  const std::string& source() const { return source_; }
  size_t num_values() const { return values_.size(); }

 private:
  friend class Unpickler;
  Pickle() = default;
  PyValue* New(PyKind kind);
  std::string source_;
  std::deque<PyValue> values_;
  PyValue* root_ = nullptr;
};

// The largest pickle Parse accepts (data.pkl of real checkpoints is kilobytes to a few MB).
inline constexpr size_t kMaxPickleBytes = size_t{1} << 30;

}  // namespace leantron::ckpt
