// insightface's .bin verification sets: the restricted unpickler and the (images, issame) reader
// on top of it.

#include "myriad/data/pickle.h"
#include "fuzz_input.h"
#include "myriad/data/verification_bin.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean([&] {
    // Whatever the pickle holds, walking it must stay inside the nodes it made.
    const Pickle pickle = unpickle(bytes, "input", allow_codecs_encode);
    pickled_bytes(pickle.root());
  });
  const std::string path = fuzz::scratch_directory() + "/set.bin";
  fuzz::write_file(path, bytes);
  fuzz::expect_clean([&] { read_verification_bin(path); });
  return 0;
}
