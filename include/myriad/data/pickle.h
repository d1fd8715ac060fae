#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace myriad {

// One value of a pickle, as data. Nothing a pickle names is ever imported or called: a global is
// a kGlobal node, a call (REDUCE) a kCall node that records what would have been called with what,
// and a persistent id (BINPERSID) a kPersistentId node. Whoever reads the pickle decides what
// such nodes mean (read_state_dict, read_verification_bin).
struct PickleValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kBytes,
    kString,
    kList,
    kTuple,
    kDict,
    kGlobal,
    kCall,
    kPersistentId
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0.0;
  // kBytes (Python 3 bytes, Python 2 str), kString (UTF-8), kGlobal ("module.name").
  std::string bytes;
  // kList and kTuple: the items. kDict: keys and values alternating, in insertion order.
  // kCall: the arguments. kPersistentId: the id.
  std::vector<const PickleValue*> items;
  // kCall only: the callable (a kGlobal); items set on the result (SETITEM, keys and values
  // alternating) or appended to it (APPEND); the state BUILD gave it (or null).
  const PickleValue* callable = nullptr;
  std::vector<const PickleValue*> set_items;
  std::vector<const PickleValue*> appended;
  const PickleValue* state = nullptr;

  const char* kind_name() const;
  // kGlobal, or kCall of that global.
  bool is_global(const std::string& name) const;
  bool is_call_of(const std::string& name) const;
  // The value of `key` in a kDict (the last one set wins), or null.
  const PickleValue* find(const std::string& key) const;
};

// An unpickled value and the storage of every node under it (acyclic, at most kMaxDepth deep).
class Pickle {
 public:
  static constexpr int kMaxDepth = 1000;

  const PickleValue& root() const { return *root_; }

 private:
  friend class Unpickler;
  std::deque<PickleValue> nodes_;
  const PickleValue* root_ = nullptr;
};

// Which globals ("module", "name") a pickle may name; any other is an Error.
using GlobalFilter = std::function<bool(const std::string& module, const std::string& name)>;

// Reads a pickle (protocols 0-5) of None, bools, ints, floats, bytes, strings, lists, tuples and
// dicts, plus the globals `allowed` accepts, calls of them (REDUCE, BUILD) and persistent ids,
// all as data (see PickleValue). Opcodes that build objects otherwise (INST, OBJ, NEWOBJ,
// extensions, sets, out-of-band buffers) are refused. A truncated or malformed pickle, a container
// that contains itself, or one nested deeper than Pickle::kMaxDepth is an Error naming `what` and
// the byte.
Pickle unpickle(const std::string& data, const std::string& what, const GlobalFilter& allowed = {});

// The bytes of `value`: kBytes, or Python 3's protocol-2 spelling of bytes,
// _codecs.encode(text, "latin1"), decoded (not called). Nothing for anything else.
std::optional<std::string> pickled_bytes(const PickleValue& value);

// Allows _codecs.encode only: what plain-data pickles written by Python 3 at protocol 2 name.
bool allow_codecs_encode(const std::string& module, const std::string& name);

}  // namespace myriad
