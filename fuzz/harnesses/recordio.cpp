// MXNet RecordIO as myriad-data from-rec reads it: the .idx text, the .rec records (magic,
// continuation flags, lengths), the image record header, and the image header behind it.

#include "myriad/data/recordio.h"
#include "fuzz_input.h"
#include "myriad/data/image_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  fuzz::FuzzInput input(data, size);
  const std::string dir = fuzz::scratch_directory();
  // The index first (its length from two bytes), the .rec the rest.
  const size_t index_bytes = input.byte() | (size_t{input.byte()} << 8);
  fuzz::write_file(dir + "/train.idx", input.bytes(index_bytes));
  fuzz::write_file(dir + "/train.rec", input.rest());
  fuzz::expect_clean([&] {
    const RecordIoReader reader(dir + "/train.rec", dir + "/train.idx");
    for (const int64_t key : reader.keys()) {
      fuzz::expect_clean([&] {
        const ImageRecord record = parse_image_record(reader.read(key), "record");
        decode_image_header(record.image, "record image");
      });
    }
  });
  return 0;
}
