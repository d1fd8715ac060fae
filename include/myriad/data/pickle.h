#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace myriad {

// A value of the plain-data subset of Python's pickle format that datasets use.
struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kBytes, kString, kList, kTuple };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  std::string bytes;  // kBytes (Python 3 bytes, Python 2 str) and kString (UTF-8)
  std::vector<std::shared_ptr<PickleValue>> items;  // kList, kTuple

  const char* kind_name() const;
};

// Reads a pickle (protocols 0-5) of None, bools, ints, bytes, strings, lists and tuples, without
// running anything: opcodes that would import or call code are an Error, except the one call
// Python 3 writes for bytes under protocol 2 or lower (_codecs.encode(text, "latin1")), which is
// decoded, not called. A truncated or malformed pickle is an Error naming `what` and the byte.
std::shared_ptr<const PickleValue> unpickle(const std::string& data, const std::string& what);

}  // namespace myriad
