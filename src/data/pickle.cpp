#include "myriad/data/pickle.h"

#include <cstring>
#include <unordered_map>
#include <utility>

#include "myriad/util/error.h"

namespace myriad {

const char* PickleValue::kind_name() const {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kBytes:
      return "bytes";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kGlobal:
      return "global";
    case Kind::kCall:
      return "call";
    case Kind::kPersistentId:
      return "persistent id";
  }
  return "?";
}

bool PickleValue::is_global(const std::string& name) const {
  return kind == Kind::kGlobal && bytes == name;
}

bool PickleValue::is_call_of(const std::string& name) const {
  return kind == Kind::kCall && callable->is_global(name);
}

const PickleValue* PickleValue::find(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  const PickleValue* found = nullptr;
  for (size_t i = 0; i + 1 < items.size(); i += 2) {
    if (items[i]->kind == Kind::kString && items[i]->bytes == key) found = items[i + 1];
  }
  return found;
}

bool allow_codecs_encode(const std::string& module, const std::string& name) {
  return module == "_codecs" && name == "encode";
}

namespace {

// Latin-1 bytes from the UTF-8 text Python writes for them; nothing if a character is not Latin-1.
std::optional<std::string> latin1_from_utf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if ((c & 0xE0) == 0xC0 && c <= 0xC3 && i + 1 < text.size() &&
               (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      out.push_back(static_cast<char>(((c & 0x1F) << 6) | (text[++i] & 0x3F)));
    } else {
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace

std::optional<std::string> pickled_bytes(const PickleValue& value) {
  using Kind = PickleValue::Kind;
  if (value.kind == Kind::kBytes) return value.bytes;
  if (value.is_call_of("_codecs.encode") && value.items.size() == 2 &&
      value.items[0]->kind == Kind::kString && value.items[1]->kind == Kind::kString &&
      value.items[1]->bytes == "latin1") {
    return latin1_from_utf8(value.items[0]->bytes);
  }
  return std::nullopt;
}

class Unpickler {
 public:
  using Kind = PickleValue::Kind;

  Unpickler(const std::string& data, std::string what, const GlobalFilter& allowed)
      : data_(data), what_(std::move(what)), allowed_(allowed) {}

  Pickle run() {
    while (true) {
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') {  // STOP
        result_.root_ = pop(at);
        check_acyclic(at);
        return std::move(result_);
      }
      const bool handled = push_constant(op, at) || push_text(op) || build_container(op, at) ||
                           fill_container(op, at) || use_memo(op, at) ||
                           record_object_as_data(op, at) || handle_stack_and_framing(op, at);
      MYRIAD_CHECK(handled,
                   "{}: unsupported pickle opcode 0x{:x} at byte {}; myriad reads pickles of plain "
                   "data (lists, tuples, dicts, bytes, strings, numbers, bools) and builds no "
                   "objects",
                   what_, static_cast<int>(op), at);
    }
  }

 private:
  // Each handler below owns a disjoint set of opcodes and consumes no input for any other, so the
  // order in which run() tries them does not matter.

  bool push_constant(unsigned char op, size_t at) {
    switch (op) {
      case 'N':
        push(make(Kind::kNone));
        return true;
      case 0x88:  // NEWTRUE
        push(boolean(true));
        return true;
      case 0x89:  // NEWFALSE
        push(boolean(false));
        return true;
      case 'I':
        push(text_int(line(), at));
        return true;
      case 'L':
        push(integer(parse_int(line(), at)));
        return true;
      case 'J':
        push(integer(static_cast<int32_t>(little_endian(4))));
        return true;
      case 'K':
        push(integer(static_cast<int64_t>(little_endian(1))));
        return true;
      case 'M':
        push(integer(static_cast<int64_t>(little_endian(2))));
        return true;
      case 0x8a:  // LONG1
        push(integer(long_bytes(little_endian(1), at)));
        return true;
      case 0x8b:  // LONG4
        push(integer(long_bytes(little_endian(4), at)));
        return true;
      case 'F':
        push(real(parse_float(line(), at)));
        return true;
      case 'G':
        push(real(big_endian_double()));
        return true;
      default:
        return false;
    }
  }

  bool push_text(unsigned char op) {
    switch (op) {
      case 'U':
      case 'C':
        push(sized(1, Kind::kBytes));
        return true;
      case 'T':
      case 'B':
        push(sized(4, Kind::kBytes));
        return true;
      case 0x8e:  // BINBYTES8
        push(sized(8, Kind::kBytes));
        return true;
      case 0x8c:  // SHORT_BINUNICODE
        push(sized(1, Kind::kString));
        return true;
      case 'X':
        push(sized(4, Kind::kString));
        return true;
      case 0x8d:  // BINUNICODE8
        push(sized(8, Kind::kString));
        return true;
      case 'V':
        push(bytes(line(), Kind::kString));
        return true;
      default:
        return false;
    }
  }

  bool build_container(unsigned char op, size_t at) {
    switch (op) {
      case ']':
        push(make(Kind::kList));
        return true;
      case ')':
        push(make(Kind::kTuple));
        return true;
      case '}':
        push(make(Kind::kDict));
        return true;
      case '(':
        marks_.push_back(stack_.size());
        return true;
      case 'l':
        push(collect(Kind::kList, at));
        return true;
      case 't':
        push(collect(Kind::kTuple, at));
        return true;
      case 'd': {
        PickleValue* dict = collect(Kind::kDict, at);
        check_pairs(dict->items, "a dict", at);
        push(dict);
        return true;
      }
      case 0x85:  // TUPLE1
        push(tuple_of(1, at));
        return true;
      case 0x86:  // TUPLE2
        push(tuple_of(2, at));
        return true;
      case 0x87:  // TUPLE3
        push(tuple_of(3, at));
        return true;
      default:
        return false;
    }
  }

  bool fill_container(unsigned char op, size_t at) {
    switch (op) {
      case 'a':
        append({pop(at)}, at);
        return true;
      case 'e':
        append(since_mark(at), at);
        return true;
      case 's': {
        PickleValue* value = pop(at);
        PickleValue* key = pop(at);
        set_items({key, value}, at);
        return true;
      }
      case 'u': {
        const std::vector<const PickleValue*> pairs = since_mark(at);
        check_pairs(pairs, "SETITEMS", at);
        set_items(pairs, at);
        return true;
      }
      default:
        return false;
    }
  }

  bool use_memo(unsigned char op, size_t at) {
    switch (op) {
      case 'q':
      case 'r':
      case 'p':
        memo_[memo_key(op, at)] = top(at);
        return true;
      case 0x94:  // MEMOIZE
        memo_[static_cast<int64_t>(memo_.size())] = top(at);
        return true;
      case 'h':
      case 'j':
      case 'g':
        push(recall(memo_key(op, at), at));
        return true;
      default:
        return false;
    }
  }

  // Globals, calls and persistent ids are what a pickle would run; they are kept as nodes instead.
  bool record_object_as_data(unsigned char op, size_t at) {
    switch (op) {
      case 'c': {
        const std::string module = line();
        push(global(module, line(), at));
        return true;
      }
      case 0x93: {  // STACK_GLOBAL
        const PickleValue* name = pop(at);
        const PickleValue* module = pop(at);
        MYRIAD_CHECK(module->kind == Kind::kString && name->kind == Kind::kString,
                     "{} is malformed: STACK_GLOBAL at byte {} needs two strings, found a {} "
                     "and a {}",
                     what_, at, module->kind_name(), name->kind_name());
        push(global(module->bytes, name->bytes, at));
        return true;
      }
      case 'R':
        push(call(at));
        return true;
      case 'b': {  // BUILD
        const PickleValue* state = pop(at);
        PickleValue* target = top(at);
        MYRIAD_CHECK(target->kind == Kind::kCall && target->state == nullptr,
                     "{} is malformed: BUILD of a {} at byte {}", what_, target->kind_name(), at);
        target->state = state;
        return true;
      }
      case 'Q':  // BINPERSID
        push(persistent_id(pop(at)));
        return true;
      case 'P':  // PERSID
        push(persistent_id(bytes(line(), Kind::kString)));
        return true;
      default:
        return false;
    }
  }

  bool handle_stack_and_framing(unsigned char op, size_t at) {
    switch (op) {
      case 0x80:  // PROTO
        take(1);
        return true;
      case 0x95:  // FRAME: a hint for buffered readers; the data follows inline
        take(8);
        return true;
      case '0':  // POP
        pop(at);
        return true;
      case '1':  // POP_MARK
        since_mark(at);
        return true;
      case '2':  // DUP
        push(top(at));
        return true;
      default:
        return false;
    }
  }

  std::string take(uint64_t n) {
    MYRIAD_CHECK(n <= data_.size() - pos_, "{} is truncated: {} bytes needed at byte {} of {}",
                 what_, n, pos_, data_.size());
    std::string out = data_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }
  uint64_t little_endian(int n) {
    const std::string b = take(static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[i]);
    return v;
  }
  double big_endian_double() {
    const std::string b = take(8);
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(b[i]);
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  std::string line() {
    const size_t end = data_.find('\n', pos_);
    MYRIAD_CHECK(end != std::string::npos, "{} is truncated: a line at byte {} never ends", what_,
                 pos_);
    std::string out = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  int64_t parse_int(std::string text, size_t at) const {
    if (!text.empty() && text.back() == 'L') text.pop_back();
    try {
      size_t used = 0;
      const int64_t v = std::stoll(text, &used);
      if (used == text.size()) return v;
    } catch (const std::exception&) {
    }
    MYRIAD_THROW("{}: '{}' at byte {} is not a 64-bit integer", what_, text, at);
  }
  double parse_float(const std::string& text, size_t at) const {
    try {
      size_t used = 0;
      const double v = std::stod(text, &used);
      if (used == text.size()) return v;
    } catch (const std::exception&) {
    }
    MYRIAD_THROW("{}: '{}' at byte {} is not a number", what_, text, at);
  }
  // LONG1 / LONG4: a little-endian two's-complement integer of `n` bytes.
  int64_t long_bytes(uint64_t n, size_t at) {
    MYRIAD_CHECK(n <= 8, "{}: an integer of {} bytes at byte {} is too large", what_, n, at);
    const int width = static_cast<int>(n);
    const uint64_t raw = width == 0 ? 0 : little_endian(width);
    if (width == 0 || width == 8) return static_cast<int64_t>(raw);
    const uint64_t sign = uint64_t{1} << (8 * width - 1);
    return static_cast<int64_t>((raw ^ sign) - sign);
  }

  PickleValue* make(Kind kind) {
    result_.nodes_.emplace_back();
    PickleValue* v = &result_.nodes_.back();
    v->kind = kind;
    return v;
  }
  PickleValue* boolean(bool b) {
    PickleValue* v = make(Kind::kBool);
    v->boolean = b;
    return v;
  }
  PickleValue* integer(int64_t i) {
    PickleValue* v = make(Kind::kInt);
    v->integer = i;
    return v;
  }
  PickleValue* real(double d) {
    PickleValue* v = make(Kind::kFloat);
    v->number = d;
    return v;
  }
  PickleValue* bytes(std::string b, Kind kind) {
    PickleValue* v = make(kind);
    v->bytes = std::move(b);
    return v;
  }
  // Bytes or text after a little-endian length of `width` bytes.
  PickleValue* sized(int width, Kind kind) { return bytes(take(little_endian(width)), kind); }
  // Protocol 0 writes True and False as the integers "01" and "00".
  PickleValue* text_int(const std::string& text, size_t at) {
    if (text == "01" || text == "00") return boolean(text == "01");
    return integer(parse_int(text, at));
  }
  PickleValue* global(const std::string& module, const std::string& name, size_t at) {
    MYRIAD_CHECK(allowed_ && allowed_(module, name),
                 "{} imports {}.{} at byte {}, which is refused: myriad runs no code from pickles "
                 "and reads only plain data",
                 what_, module, name, at);
    return bytes(module + "." + name, Kind::kGlobal);
  }
  PickleValue* call(size_t at) {
    const PickleValue* args = pop(at);
    const PickleValue* callable = pop(at);
    MYRIAD_CHECK(callable->kind == Kind::kGlobal && args->kind == Kind::kTuple,
                 "{} is malformed: a call of a {} with a {} at byte {}", what_,
                 callable->kind_name(), args->kind_name(), at);
    PickleValue* v = make(Kind::kCall);
    v->callable = callable;
    v->items = args->items;
    return v;
  }
  PickleValue* persistent_id(const PickleValue* id) {
    PickleValue* v = make(Kind::kPersistentId);
    v->items = {id};
    return v;
  }

  void push(PickleValue* v) { stack_.push_back(v); }
  PickleValue* pop(size_t at) {
    MYRIAD_CHECK(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()),
                 "{} is malformed: nothing to take at byte {}", what_, at);
    PickleValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PickleValue* top(size_t at) const {
    MYRIAD_CHECK(!stack_.empty(), "{} is malformed: nothing on the stack at byte {}", what_, at);
    return stack_.back();
  }
  PickleValue* recall(int64_t key, size_t at) const {
    const auto it = memo_.find(key);
    MYRIAD_CHECK(it != memo_.end(), "{} is malformed: memo {} at byte {} was never stored", what_,
                 key, at);
    return it->second;
  }
  // PUT and GET name a memo slot alike: in one byte (q, h), four bytes (r, j) or a line (p, g).
  int64_t memo_key(unsigned char op, size_t at) {
    if (op == 'q' || op == 'h') return static_cast<int64_t>(little_endian(1));
    if (op == 'r' || op == 'j') return static_cast<int64_t>(little_endian(4));
    return parse_int(line(), at);
  }
  // The items above the last mark, which is removed.
  std::vector<const PickleValue*> since_mark(size_t at) {
    MYRIAD_CHECK(!marks_.empty(), "{} is malformed: no mark for the opcode at byte {}", what_, at);
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<const PickleValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark),
                                          stack_.end());
    stack_.resize(mark);
    return items;
  }
  PickleValue* collect(Kind kind, size_t at) {
    PickleValue* v = make(kind);
    v->items = since_mark(at);
    return v;
  }
  PickleValue* tuple_of(int n, size_t at) {
    PickleValue* v = make(Kind::kTuple);
    v->items.resize(static_cast<size_t>(n));
    for (int i = n - 1; i >= 0; --i) v->items[static_cast<size_t>(i)] = pop(at);
    return v;
  }
  // DICT and SETITEMS take keys and values alternating; a key without a value is damage.
  void check_pairs(const std::vector<const PickleValue*>& items, const char* whose,
                   size_t at) const {
    MYRIAD_CHECK(items.size() % 2 == 0,
                 "{} is malformed: {} of an odd number of keys and values at byte {}", what_, whose,
                 at);
  }
  // APPEND / APPENDS to the list below (or to what a call made, as data).
  void append(const std::vector<const PickleValue*>& items, size_t at) {
    PickleValue* target = top(at);
    MYRIAD_CHECK(target->kind == Kind::kList || target->kind == Kind::kCall,
                 "{} is malformed: appending to a {} at byte {}", what_, target->kind_name(), at);
    auto& into = target->kind == Kind::kList ? target->items : target->appended;
    into.insert(into.end(), items.begin(), items.end());
  }
  // SETITEM / SETITEMS on the dict below (or on what a call made, as data).
  void set_items(const std::vector<const PickleValue*>& pairs, size_t at) {
    PickleValue* target = top(at);
    MYRIAD_CHECK(target->kind == Kind::kDict || target->kind == Kind::kCall,
                 "{} is malformed: setting items of a {} at byte {}", what_, target->kind_name(),
                 at);
    auto& into = target->kind == Kind::kDict ? target->items : target->set_items;
    into.insert(into.end(), pairs.begin(), pairs.end());
  }

  // Memo references can make a list contain itself, and nesting has no bound in the format: both
  // would send anyone walking the value into endless recursion. One iterative pass finds them.
  void check_acyclic(size_t at) const {
    enum class Mark : char { kOpen, kDone };
    std::unordered_map<const PickleValue*, Mark> marks;
    struct Frame {
      const PickleValue* node;
      std::vector<const PickleValue*> children;
      size_t next = 0;
    };
    const auto children = [](const PickleValue* v) {
      std::vector<const PickleValue*> c(v->items);
      c.insert(c.end(), v->set_items.begin(), v->set_items.end());
      c.insert(c.end(), v->appended.begin(), v->appended.end());
      if (v->callable != nullptr) c.push_back(v->callable);
      if (v->state != nullptr) c.push_back(v->state);
      return c;
    };
    std::vector<Frame> path;
    path.push_back({result_.root_, children(result_.root_)});
    marks[result_.root_] = Mark::kOpen;
    while (!path.empty()) {
      Frame& frame = path.back();
      if (frame.next == frame.children.size()) {
        marks[frame.node] = Mark::kDone;
        path.pop_back();
        continue;
      }
      const PickleValue* child = frame.children[frame.next++];
      const auto it = marks.find(child);
      if (it != marks.end()) {
        MYRIAD_CHECK(it->second == Mark::kDone,
                     "{} is malformed: a {} contains itself (pickle ends at byte {})", what_,
                     child->kind_name(), at);
        continue;
      }
      MYRIAD_CHECK(static_cast<int>(path.size()) < Pickle::kMaxDepth,
                   "{}: values nested more than {} deep (pickle ends at byte {})", what_,
                   Pickle::kMaxDepth, at);
      marks[child] = Mark::kOpen;
      path.push_back({child, children(child)});
    }
  }

  const std::string& data_;
  std::string what_;
  const GlobalFilter& allowed_;
  size_t pos_ = 0;
  Pickle result_;
  std::vector<PickleValue*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<int64_t, PickleValue*> memo_;
};

Pickle unpickle(const std::string& data, const std::string& what, const GlobalFilter& allowed) {
  return Unpickler(data, what, allowed).run();
}

}  // namespace myriad
