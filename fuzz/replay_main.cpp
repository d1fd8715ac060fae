// Replays a harness on files, without libFuzzer: CTest runs every harness on its committed corpus
// and regression inputs (fuzz/CMakeLists.txt) with the normal compiler, so that CI stays quick
// and every earlier finding stays fixed.
//
//   fuzz-replay-NAME PATH...   (files, or directories of them)
//
// An input that runs longer than kSecondsPerInput ends the replay by SIGALRM: a hang that fuzzing
// found (libFuzzer's -timeout) must stay fixed too.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
// Twice scripts/fuzz.sh's -timeout, for slower machines; a finding of libFuzzer's took 70 s here.
constexpr unsigned kSecondsPerInput = 20;
}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path path = argv[i];
    if (fs::is_directory(path)) {
      for (const auto& entry : fs::directory_iterator(path)) {
        if (entry.is_regular_file()) inputs.push_back(entry.path());
      }
    } else if (fs::is_regular_file(path)) {
      inputs.push_back(path);
    } else {
      std::fprintf(stderr, "%s: '%s' is not a file or directory\n", argv[0], argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // A crash names the input through the last line printed.
    std::printf("%s\n", path.c_str());
    std::fflush(stdout);
    alarm(kSecondsPerInput);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    alarm(0);
  }
  std::printf("replayed %zu inputs\n", inputs.size());
  return inputs.empty() ? 1 : 0;
}
