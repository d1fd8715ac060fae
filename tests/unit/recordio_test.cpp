// RecordIO reading against files written as dmlc-core writes them (tests/support/recordio_writer):
// whole and split records, image record headers, and a clear error for every kind of damage.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "myriad/data/recordio.h"
#include "myriad/util/error.h"
#include "support/recordio_writer.h"
#include "support/test_files.h"

namespace myriad {
namespace {

using testing::error_of;
using testing::pack_image_record;
using testing::random_bytes;
using testing::recordio_magic;
using testing::RecordIoWriter;
using testing::temp_file;

TEST(RecordIo, ReadsBackWhatWasWrittenIncludingRecordsSplitAtTheMagicWord) {
  const std::string rec = temp_file("round.rec"), idx = temp_file("round.idx");
  const std::string magic = recordio_magic();
  std::vector<std::string> records = {
      "",                           // empty
      "abc",                        // padded
      magic,                        // only the magic: two empty parts
      magic + random_bytes(13, 1),  // starts with it
      random_bytes(8, 2) + magic + random_bytes(9, 3) + magic + random_bytes(4, 4) + magic,
      random_bytes(5, 5) + magic + random_bytes(3, 6),  // unaligned: not split
      random_bytes(100000, 7),
  };
  {
    RecordIoWriter writer(rec, idx);
    // Keys need not follow file order.
    for (size_t i = 0; i < records.size(); ++i)
      writer.write(100 - static_cast<int64_t>(i), records[i]);
  }
  const RecordIoReader reader(rec, idx);
  ASSERT_EQ(reader.keys().size(), records.size());
  EXPECT_EQ(reader.keys().front(), 100);
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(reader.read(100 - static_cast<int64_t>(i)), records[i]) << "record " << i;
  }
  EXPECT_TRUE(reader.has(94));
  EXPECT_FALSE(reader.has(93));
  EXPECT_NE(error_of([&] { reader.read(7); }).find("has no record 7 in its index"),
            std::string::npos);
}

TEST(RecordIo, ImageRecordsWithScalarAndVectorLabels) {
  const std::string jpeg = "\xff\xd8\xff\xe0 pretend JPEG";
  ImageRecord r = parse_image_record(pack_image_record({17.0f}, true, 5, jpeg), "test");
  EXPECT_EQ(r.labels, std::vector<float>{17.0f});
  EXPECT_EQ(r.id, 5u);
  EXPECT_EQ(r.image, jpeg);
  r = parse_image_record(pack_image_record({3.0f, 9.0f, 2.5f}, false, 0, jpeg), "test");
  EXPECT_EQ(r.labels, (std::vector<float>{3.0f, 9.0f, 2.5f}));
  EXPECT_EQ(r.image, jpeg);
  EXPECT_NE(error_of([] { parse_image_record("short", "record 4"); }).find("record 4 is corrupt"),
            std::string::npos);
  // A header promising more labels than the record holds.
  std::string lying = pack_image_record({1.0f, 2.0f}, false, 0, "");
  lying[0] = 9;
  EXPECT_NE(error_of([&] { parse_image_record(lying, "record 4"); }).find("promises 9 labels"),
            std::string::npos);
}

class DamagedRecordIo : public ::testing::Test {
 protected:
  void SetUp() override {
    RecordIoWriter writer(rec_, idx_);
    for (int64_t key = 0; key < 4; ++key) {
      writer.write(key, random_bytes(64 + static_cast<size_t>(key), static_cast<uint32_t>(key)));
      offsets_.push_back(writer.bytes_written());
    }
  }
  void patch(int64_t at, const std::string& bytes) {
    std::fstream f(rec_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(at);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string rec_ = temp_file("damaged.rec"), idx_ = temp_file("damaged.idx");
  std::vector<int64_t> offsets_;  // end of each record
};

TEST_F(DamagedRecordIo, BadMagicNamesTheRecord) {
  patch(offsets_[1], "XXXX");  // record 2 starts where record 1 ends
  const RecordIoReader reader(rec_, idx_);
  EXPECT_EQ(reader.read(1).size(), 65u);
  EXPECT_NE(error_of([&] {
              reader.read(2);
            }).find("record 2 of '" + rec_ + "' is corrupt: no RecordIO magic"),
            std::string::npos);
}

TEST_F(DamagedRecordIo, ALengthPastTheEndIsTruncation) {
  std::filesystem::resize_file(rec_, offsets_[3] - 10);
  const RecordIoReader reader(rec_, idx_);
  EXPECT_NE(error_of([&] { reader.read(3); }).find("record 3 of '" + rec_ + "' is truncated"),
            std::string::npos);
}

TEST_F(DamagedRecordIo, AContinuationWithoutAStartIsCorrupt) {
  const uint32_t lrecord = (2u << 29) | 64u;
  patch(4, std::string(reinterpret_cast<const char*>(&lrecord), 4));
  const RecordIoReader reader(rec_, idx_);
  EXPECT_NE(error_of([&] { reader.read(0); }).find("part 0 has continuation flag 2"),
            std::string::npos);
}

TEST_F(DamagedRecordIo, TheIndexIsChecked) {
  const auto index_error = [&](const std::string& text) {
    testing::write_bytes(idx_, text);
    return error_of([&] { RecordIoReader(rec_, idx_); });
  };
  EXPECT_NE(index_error("0\t0\n1\t99999\n")
                .find("line 2: record 1 starts at byte 99999, past the end of"),
            std::string::npos);
  EXPECT_NE(index_error("0\t0\n0\t72\n").find("lists record 0 twice"), std::string::npos);
  EXPECT_NE(index_error("0\t0\nbanana\n").find("line 2: expected 'key<TAB>offset'"),
            std::string::npos);
  EXPECT_NE(index_error("\n").find("lists no records"), std::string::npos);
  EXPECT_NE(
      error_of([&] { RecordIoReader(rec_, temp_file("no.idx")); }).find("cannot open the index"),
      std::string::npos);
  EXPECT_NE(error_of([&] { RecordIoReader(temp_file("no.rec"), idx_); }).find("cannot open"),
            std::string::npos);
}

}  // namespace
}  // namespace myriad
