#include "myriad/data/verification_bin.h"

#include <fstream>
#include <iterator>

#include "myriad/data/pickle.h"
#include "myriad/util/error.h"

namespace myriad {

VerificationBin read_verification_bin(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MYRIAD_CHECK(in.good(), "cannot read '{}'", path);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string what = "'" + path + "'";
  const auto top = unpickle(data, what);
  using Kind = PickleValue::Kind;
  MYRIAD_CHECK((top->kind == Kind::kTuple || top->kind == Kind::kList) && top->items.size() == 2 &&
                   top->items[0]->kind == Kind::kList && top->items[1]->kind == Kind::kList,
               "{} is not an insightface verification set: expected (images, issame), found a {} "
               "of {} items",
               what, top->kind_name(), top->items.size());
  VerificationBin bin;
  for (const auto& image : top->items[0]->items) {
    MYRIAD_CHECK(image->kind == Kind::kBytes, "{}: image {} is a {}, not bytes", what,
                 bin.images.size(), image->kind_name());
    bin.images.push_back(image->bytes);
  }
  for (const auto& flag : top->items[1]->items) {
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
