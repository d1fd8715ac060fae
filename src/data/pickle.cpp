#include "myriad/data/pickle.h"

#include <cstring>
#include <unordered_map>

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
    case Kind::kBytes:
      return "bytes";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
  }
  return "?";
}

namespace {

using Value = std::shared_ptr<PickleValue>;

// What the stack holds: a value, or the one callable a plain-data pickle may name.
struct Item {
  Value value;
  bool codecs_encode = false;
};

class Unpickler {
 public:
  Unpickler(const std::string& data, std::string what) : data_(data), what_(std::move(what)) {}

  Value run() {
    while (true) {
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      switch (op) {
        case 0x80:
          take(1);
          break;  // PROTO
        case 0x95:
          take(8);
          break;  // FRAME
        case '.':
          return plain(pop(at), at);  // STOP
        case 'N':
          push(make(PickleValue::Kind::kNone));
          break;
        case 0x88:
          push(boolean(true));
          break;
        case 0x89:
          push(boolean(false));
          break;
        case 'I':
          push(text_int(line(), at));
          break;
        case 'L':
          push(integer(parse_int(line(), at)));
          break;
        case 'J':
          push(integer(static_cast<int32_t>(little_endian(4))));
          break;
        case 'K':
          push(integer(static_cast<int64_t>(little_endian(1))));
          break;
        case 'M':
          push(integer(static_cast<int64_t>(little_endian(2))));
          break;
        case 0x8a:
          push(integer(long1(at)));
          break;
        case 'U':
        case 'C':
          push(bytes(take(little_endian(1)), PickleValue::Kind::kBytes));
          break;
        case 'T':
        case 'B':
          push(bytes(take(little_endian(4)), PickleValue::Kind::kBytes));
          break;
        case 0x8e:
          push(bytes(take(little_endian(8)), PickleValue::Kind::kBytes));
          break;
        case 0x8c:
          push(bytes(take(little_endian(1)), PickleValue::Kind::kString));
          break;
        case 'X':
          push(bytes(take(little_endian(4)), PickleValue::Kind::kString));
          break;
        case 0x8d:
          push(bytes(take(little_endian(8)), PickleValue::Kind::kString));
          break;
        case 'V':
          push(bytes(line(), PickleValue::Kind::kString));
          break;
        case ']':
          push(make(PickleValue::Kind::kList));
          break;
        case ')':
          push(make(PickleValue::Kind::kTuple));
          break;
        case '(':
          marks_.push_back(stack_.size());
          break;
        case 'l':
          push(collect(PickleValue::Kind::kList, at));
          break;
        case 't':
          push(collect(PickleValue::Kind::kTuple, at));
          break;
        case 0x85:
          push(tuple_of(1, at));
          break;
        case 0x86:
          push(tuple_of(2, at));
          break;
        case 0x87:
          push(tuple_of(3, at));
          break;
        case 'a':
          append(1, at);
          break;
        case 'e':
          append(0, at);
          break;
        case 'q':
          memo_[little_endian(1)] = top(at);
          break;
        case 'r':
          memo_[little_endian(4)] = top(at);
          break;
        case 'p':
          memo_[parse_int(line(), at)] = top(at);
          break;
        case 0x94:
          memo_[static_cast<int64_t>(memo_.size())] = top(at);
          break;
        case 'h':
          stack_.push_back(recall(little_endian(1), at));
          break;
        case 'j':
          stack_.push_back(recall(little_endian(4), at));
          break;
        case 'g':
          stack_.push_back(recall(parse_int(line(), at), at));
          break;
        case 'c': {
          const std::string module = line();
          global(module, line(), at);
          break;
        }
        case 0x93: {
          const Value name = pop(at).value;
          const Value module = pop(at).value;
          global(module->bytes, name->bytes, at);
          break;
        }
        case 'R':
          reduce(at);
          break;
        default:
          MYRIAD_THROW(
              "{}: unsupported pickle opcode 0x{:x} at byte {}; myriad reads pickles of plain "
              "lists, tuples, bytes, strings, ints and bools",
              what_, static_cast<int>(op), at);
      }
    }
  }

 private:
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
    MYRIAD_THROW("{}: '{}' at byte {} is not an integer", what_, text, at);
  }
  int64_t long1(size_t at) {
    const int n = static_cast<int>(little_endian(1));
    MYRIAD_CHECK(n <= 8, "{}: an integer of {} bytes at byte {} is too large", what_, n, at);
    const uint64_t raw = n == 0 ? 0 : little_endian(n);
    if (n == 0 || n == 8) return static_cast<int64_t>(raw);
    const uint64_t sign = uint64_t{1} << (8 * n - 1);
    return static_cast<int64_t>((raw ^ sign) - sign);
  }

  static Value make(PickleValue::Kind kind) {
    auto v = std::make_shared<PickleValue>();
    v->kind = kind;
    return v;
  }
  static Value boolean(bool b) {
    Value v = make(PickleValue::Kind::kBool);
    v->boolean = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v = make(PickleValue::Kind::kInt);
    v->integer = i;
    return v;
  }
  static Value bytes(std::string b, PickleValue::Kind kind) {
    Value v = make(kind);
    v->bytes = std::move(b);
    return v;
  }
  // Protocol 0 writes True and False as the integers "01" and "00".
  Value text_int(const std::string& text, size_t at) const {
    if (text == "01" || text == "00") return boolean(text == "01");
    return integer(parse_int(text, at));
  }

  void push(Value v) { stack_.push_back({std::move(v), false}); }
  Item pop(size_t at) {
    MYRIAD_CHECK(!stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()),
                 "{} is malformed: nothing to take at byte {}", what_, at);
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }
  Item top(size_t at) const {
    MYRIAD_CHECK(!stack_.empty(), "{} is malformed: nothing to remember at byte {}", what_, at);
    return stack_.back();
  }
  Item recall(int64_t key, size_t at) const {
    const auto it = memo_.find(key);
    MYRIAD_CHECK(it != memo_.end(), "{} is malformed: memo {} at byte {} was never stored", what_,
                 key, at);
    return it->second;
  }
  // The items above the last mark, which is removed.
  std::vector<Value> since_mark(size_t at) {
    MYRIAD_CHECK(!marks_.empty(), "{} is malformed: no mark for the opcode at byte {}", what_, at);
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Value> items;
    for (size_t i = mark; i < stack_.size(); ++i) items.push_back(plain(stack_[i], at));
    stack_.resize(mark);
    return items;
  }
  Value plain(const Item& item, size_t at) const {
    MYRIAD_CHECK(!item.codecs_encode, "{}: a function used as data at byte {}", what_, at);
    return item.value;
  }
  Value collect(PickleValue::Kind kind, size_t at) {
    Value v = make(kind);
    v->items = since_mark(at);
    return v;
  }
  Value tuple_of(int n, size_t at) {
    Value v = make(PickleValue::Kind::kTuple);
    v->items.resize(static_cast<size_t>(n));
    for (int i = n - 1; i >= 0; --i) v->items[static_cast<size_t>(i)] = plain(pop(at), at);
    return v;
  }
  // APPEND (one item) or APPENDS (n == 0: the items since the mark) to the list below them.
  void append(int n, size_t at) {
    std::vector<Value> items = n == 1 ? std::vector<Value>{plain(pop(at), at)} : since_mark(at);
    const Value list = plain(top(at), at);
    MYRIAD_CHECK(list->kind == PickleValue::Kind::kList,
                 "{} is malformed: appending to a {} at byte {}", what_, list->kind_name(), at);
    list->items.insert(list->items.end(), items.begin(), items.end());
  }
  void global(const std::string& module, const std::string& name, size_t at) {
    MYRIAD_CHECK(module == "_codecs" && name == "encode",
                 "{} imports {}.{} at byte {}: myriad runs no code from pickles and reads only "
                 "plain lists, bytes and bools (NumPy arrays and objects are not read)",
                 what_, module, name, at);
    stack_.push_back({nullptr, true});
  }
  // _codecs.encode(text, "latin1"): Python 3's protocol-2 spelling of bytes.
  void reduce(size_t at) {
    const Value args = plain(pop(at), at);
    const Item callable = pop(at);
    MYRIAD_CHECK(callable.codecs_encode && args->kind == PickleValue::Kind::kTuple &&
                     args->items.size() == 2 &&
                     args->items[0]->kind == PickleValue::Kind::kString &&
                     args->items[1]->bytes == "latin1",
                 "{}: unsupported call at byte {}", what_, at);
    push(bytes(latin1_from_utf8(args->items[0]->bytes, at), PickleValue::Kind::kBytes));
  }
  std::string latin1_from_utf8(const std::string& text, size_t at) const {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c < 0x80) {
        out.push_back(static_cast<char>(c));
      } else {
        MYRIAD_CHECK((c & 0xE0) == 0xC0 && c <= 0xC3 && i + 1 < text.size(),
                     "{}: text at byte {} is not Latin-1 bytes", what_, at);
        out.push_back(static_cast<char>(((c & 0x1F) << 6) | (text[++i] & 0x3F)));
      }
    }
    return out;
  }

  const std::string& data_;
  std::string what_;
  size_t pos_ = 0;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<int64_t, Item> memo_;
};

}  // namespace

std::shared_ptr<const PickleValue> unpickle(const std::string& data, const std::string& what) {
  return Unpickler(data, what).run();
}

}  // namespace myriad
