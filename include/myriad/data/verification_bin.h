#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// An insightface verification set (lfw.bin, cfp_fp.bin, agedb_30.bin, ...): a pickle of the
// tuple (list of 2P encoded images, list of P "same identity" flags); pair i is images 2i and
// 2i+1. Read without running any code from the file.
struct VerificationBin {
  std::vector<std::string> images;
  std::vector<uint8_t> issame;
};

// A file that is not such a pickle, or whose counts disagree, is an Error naming it.
VerificationBin read_verification_bin(const std::string& path);

}  // namespace myriad
