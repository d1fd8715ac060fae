// Inputs that claim far more than they hold, or overflow what they claim: each reader must refuse
// them with its own message before allocating what they claim (fuzz/regressions/ keeps the
// fuzzers' versions of them).

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cstdint>
#include <limits>
#include <string>

#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/idx_file.h"
#include "myriad/data/image_codec.h"
#include "myriad/data/recordio.h"
#include "myriad/util/hdf5_file.h"
#include "support/test_files.h"

namespace myriad {
namespace {

using testing::error_of;
using testing::temp_file;
using testing::write_bytes;

std::string big_endian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string little_endian(uint32_t v) {
  return {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
          static_cast<char>(v >> 24)};
}

TEST(HostileInput, IdxHeadersThatOverflowOrPromiseGigabytes) {
  const std::string path = temp_file("hostile.idx");
  write_bytes(path, std::string("\0\0\x08\x04", 4) + big_endian(0xffffffffu) +
                        big_endian(0xffffffffu) + big_endian(0xffffffffu) +
                        big_endian(0xffffffffu));
  EXPECT_NE(error_of([&] { read_idx(path); }).find("claims more than"), std::string::npos);
  // 2^34 bytes promised, 0 present: refused as truncated after one block, not after 16 GiB.
  write_bytes(path, std::string("\0\0\x08\x02", 4) + big_endian(1u << 17) + big_endian(1u << 17));
  EXPECT_NE(error_of([&] { read_idx(path); }).find("is truncated: its data needs 67108864 bytes"),
            std::string::npos);
}

TEST(HostileInput, RecordIoOffsetsAndLengthsBeyondTheFile) {
  const std::string rec = temp_file("hostile.rec"), idx = temp_file("hostile.idx");
  write_bytes(rec, little_endian(0xced7230au) + std::string(8, '\0'));
  write_bytes(idx, "0\t9223372036854775800\n");
  EXPECT_NE(error_of([&] { RecordIoReader(rec, idx); }).find("past the end"), std::string::npos);
  // A part claiming 2^29 - 1 bytes in a file of 28.
  write_bytes(rec, little_endian(0xced7230au) + little_endian((1u << 29) - 1) + std::string(16, 0));
  write_bytes(idx, "0\t0\n");
  const RecordIoReader reader(rec, idx);
  EXPECT_NE(error_of([&] {
              reader.read(0);
            }).find("part 0 of 536870911 bytes at byte 0 runs past the end of the file"),
            std::string::npos);
}

std::string png_chunk(const std::string& type, const std::string& data) {
  const std::string body = type + data;
  const uLong crc = crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size());
  return big_endian(static_cast<uint32_t>(data.size())) + body +
         big_endian(static_cast<uint32_t>(crc));
}

TEST(HostileInput, ImageHeadersBeyondTheSideLimit) {
  const std::string header =
      big_endian(65535) + big_endian(65535) + std::string("\x08\x02\0\0\0", 5);
  // libpng reads up to the first IDAT before it reports the header.
  const std::string png = std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", header) +
                          png_chunk("IDAT", std::string("\x78\x9c\x03\x00\x00\x00\x00\x01", 8)) +
                          png_chunk("IEND", "");
  const std::string error = error_of([&] { decode_image_header(png, "huge.png"); });
  EXPECT_NE(error.find("huge.png: a PNG of 65535x65535 pixels is larger than myriad decodes"),
            std::string::npos)
      << error;
}

TEST(HostileInput, DatasetsDeclaredLargerThanWritten) {
  const std::string path = temp_file("declared.h5");
  {
    Hdf5File file(path, Hdf5File::Mode::kCreate);
    file.write("images", torch::zeros({4, 2, 2, 1}, torch::kUInt8));
    // 2^40 labels declared in a file of a few KiB: reading them would allocate 8 TiB.
    file.create("labels", torch::kInt64, {int64_t{1} << 40}, 1024);
  }
  EXPECT_NE(error_of([&] {
              Hdf5File(path, Hdf5File::Mode::kRead).read("labels");
            }).find("declared larger than what was written"),
            std::string::npos);
  // A height attribute beyond int, which a cast would have made 16.
  {
    Hdf5File writer(path, Hdf5File::Mode::kCreate);
    writer.create_bytes("images", 1, 1);
    writer.write("labels", torch::zeros({1}, torch::kInt64));
    writer.set_attribute("/", "height", (int64_t{1} << 32) + 16);
    writer.set_attribute("/", "width", int64_t{16});
    writer.set_attribute("/", "channels", int64_t{3});
  }
  EXPECT_NE(error_of([&] { Hdf5ImageDataset dataset(path); }).find("image size 4294967312x16"),
            std::string::npos);
}

// The largest int64 as a label and no num_classes attribute: counting the classes as the largest
// label + 1 overflowed (a fuzzing finding, fuzz/regressions/hdf5_dataset/largest-int64-label).
TEST(HostileInput, ALabelWithNoRoomForOneMoreClass) {
  const std::string path = temp_file("largest-label.h5");
  {
    Hdf5File file(path, Hdf5File::Mode::kCreate);
    file.write("images", torch::zeros({2, 2, 2, 1}, torch::kUInt8));
    file.write("labels", torch::tensor({int64_t{0}, std::numeric_limits<int64_t>::max()}));
  }
  EXPECT_NE(error_of([&] {
              Hdf5ImageDataset dataset(path);
            }).find("label 9223372036854775807 is too large, and there is no num_classes"),
            std::string::npos);
}

}  // namespace
}  // namespace myriad
