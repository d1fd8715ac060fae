// TensorBoard event files: CRC-32C against the RFC 3720 test vectors and a bitwise reference,
// TFRecord framing, an Event's protobuf bytes spelled out from the wire format, and a written
// file read back frame by frame.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "myriad/train/tensorboard_writer.h"
#include "myriad/util/crc32c.h"
#include "myriad/util/remove_tree.h"
#include "support/test_files.h"

namespace myriad {
namespace {

uint32_t bitwise_crc32c(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t crc_of(const std::string& s) {
  return crc32c(s.data(), s.size());
}

TEST(Crc32c, MatchesTheRfc3720VectorsAndTheBitwiseDefinition) {
  std::string ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc_of(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc_of(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(crc_of(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc_of(descending), 0x113FDB5Cu);
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  const std::string random = testing::random_bytes(1000, 9);
  EXPECT_EQ(crc_of(random), bitwise_crc32c(random));
  const uint32_t crc = bitwise_crc32c(random);
  EXPECT_EQ(masked_crc32c(random.data(), random.size()), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

uint64_t u64_at(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

// The frames of a TFRecord stream, each checked against its length and data CRCs.
std::vector<std::string> frames_of(const std::string& stream) {
  std::vector<std::string> frames;
  for (size_t at = 0; at < stream.size();) {
    EXPECT_LE(at + 12, stream.size());
    const uint64_t length = u64_at(stream, at);
    const uint32_t masked_length = masked_crc32c(stream.data() + at, 8);
    EXPECT_EQ(u32_at(stream, at + 8), masked_length) << "length CRC of the frame at " << at;
    const std::string data = stream.substr(at + 12, length);
    EXPECT_EQ(u32_at(stream, at + 12 + length), masked_crc32c(data.data(), data.size()))
        << "data CRC of the frame at " << at;
    frames.push_back(data);
    at += 12 + length + 4;
  }
  return frames;
}

TEST(TensorBoard, ScalarEventBytesFollowTheProtobufWireFormat) {
  const std::string value = std::string("\x0a\x04loss\x15", 7) + std::string("\x00\x00\x00\x3f", 4);
  const std::string summary = std::string("\x0a\x0b", 2) + value;
  const std::string expected = std::string("\x09", 1) + std::string(8, '\0') +  // wall_time 0.0
                               std::string("\x10\x03", 2) +                     // step 3
                               std::string("\x2a\x0d", 2) + summary;            // summary
  EXPECT_EQ(scalar_event("loss", 0.5f, 3, 0.0), expected);
  // Steps above 127 take more than one varint byte: 300 = 0xac 0x02.
  EXPECT_EQ(scalar_event("loss", 0.5f, 300, 0.0).substr(9, 3), std::string("\x10\xac\x02", 3));
  EXPECT_EQ(file_version_event(0.0), std::string("\x09", 1) + std::string(8, '\0') +
                                         std::string("\x1a\x0d", 2) + "brain.Event:2");
}

TEST(TensorBoard, FramingCarriesLengthAndMaskedChecksums) {
  const std::string data = "an event";
  const std::string frame = tfrecord(data);
  ASSERT_EQ(frame.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(u64_at(frame, 0), data.size());
  const std::vector<std::string> frames = frames_of(frame);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0], data);
}

TEST(TensorBoard, WriterFileHoldsTheVersionThenTheScalars) {
  const std::string dir = testing::temp_file("tb");
  EXPECT_EQ(remove_tree(dir), "");
  std::string path;
  {
    TensorBoardWriter writer(dir);
    writer.add_scalar("train/loss", 2.5, 10);
    writer.add_scalar("train/lr", 0.125, 10);
    path = writer.path();
  }
  EXPECT_EQ(std::filesystem::path(path).parent_path(), std::filesystem::path(dir));
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  std::ifstream in(path, std::ios::binary);
  const std::string stream((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::string> frames = frames_of(stream);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_NE(frames[0].find("brain.Event:2"), std::string::npos);
  // Everything after the wall time is determined: step, tag and value.
  EXPECT_EQ(frames[1].substr(9), scalar_event("train/loss", 2.5f, 10, 0.0).substr(9));
  EXPECT_EQ(frames[2].substr(9), scalar_event("train/lr", 0.125f, 10, 0.0).substr(9));
}

}  // namespace
}  // namespace myriad
