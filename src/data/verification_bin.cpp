#include "myriad/data/verification_bin.h"

#include <fstream>
#include <iterator>
#include <optional>

#include "myriad/data/pickle.h"
#include "myriad/util/error.h"

namespace myriad {

VerificationBin read_verification_bin(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MYRIAD_CHECK(in.good(), "cannot read '{}'", path);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string what = "'" + path + "'";
  // Python 3 writes bytes at protocol 2 as _codecs.encode(text, "latin1"): the one global allowed.
  const Pickle pickle = unpickle(data, what, allow_codecs_encode);
  const PickleValue* top = &pickle.root();
  using Kind = PickleValue::Kind;
  MYRIAD_CHECK((top->kind == Kind::kTuple || top->kind == Kind::kList) && top->items.size() == 2 &&
                   top->items[0]->kind == Kind::kList && top->items[1]->kind == Kind::kList,
               "{} is not an insightface verification set: expected (images, issame), found a {} "
               "of {} items",
               what, top->kind_name(), top->items.size());
  VerificationBin bin;
  for (const PickleValue* image : top->items[0]->items) {
    std::optional<std::string> bytes = pickled_bytes(*image);
    MYRIAD_CHECK(bytes.has_value(), "{}: image {} is a {}, not bytes", what, bin.images.size(),
                 image->kind_name());
    bin.images.push_back(std::move(*bytes));
  }
  for (const PickleValue* flag : top->items[1]->items) {
    MYRIAD_CHECK(flag->kind == Kind::kBool ||
                     (flag->kind == Kind::kInt && flag->integer >= 0 && flag->integer <= 1),
                 "{}: issame entry {} is a {}, not a bool", what, bin.issame.size(),
                 flag->kind_name());
    bin.issame.push_back(flag->kind == Kind::kBool ? flag->boolean : flag->integer == 1);
  }
  MYRIAD_CHECK(!bin.issame.empty() && bin.images.size() == 2 * bin.issame.size(),
               "{}: {} images for {} pairs (each pair needs 2)", what, bin.images.size(),
               bin.issame.size());
  return bin;
}

}  // namespace myriad
