#include <gtest/gtest.h>

#include "myriad/util/error.h"
#include "myriad/util/format.h"

namespace myriad {
namespace {

TEST(Format, ReplacesPlaceholdersInOrder) {
  EXPECT_EQ(str_format("{} + {} = {}", 1, 2.5, "x"), "1 + 2.5 = x");
  EXPECT_EQ(str_format("no placeholders"), "no placeholders");
}

TEST(Format, AppliesWidthPrecisionFillAndAlignment) {
  EXPECT_EQ(str_format("[{:.3f}]", 3.14159), "[3.142]");
  EXPECT_EQ(str_format("[{:03}]", 7), "[007]");
  EXPECT_EQ(str_format("[{:<5}]", "ab"), "[ab   ]");
  EXPECT_EQ(str_format("[{:6.2f}]", 1.5), "[  1.50]");
  EXPECT_EQ(str_format("{:02x}{:02x} {}", 8, 255, 10), "08ff 10");
  // A spec does not leak into the next argument.
  EXPECT_EQ(str_format("{:.1f} {}", 1.25, 1.25), "1.2 1.25");
}

TEST(Format, ExtraArgumentsAreAppendedNotLost) {
  EXPECT_EQ(str_format("value", 5), "value 5");
}

TEST(Format, ByteSizes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(64.0 * 1024 * 1024), "64.0 MiB");
  EXPECT_EQ(format_bytes(300.0 * 1024 * 1024 * 1024), "300 GiB");
}

TEST(Error, CarriesLocationAndCollectiveFlag) {
  try {
    MYRIAD_CHECK(1 + 1 == 3, "arithmetic is broken: {}", 42);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "arithmetic is broken: 42");
    EXPECT_NE(std::string(e.what()).find("format_test.cpp:"), std::string::npos) << e.what();
    EXPECT_FALSE(e.collective());
  }
  try {
    MYRIAD_THROW_COLLECTIVE("all ranks agree");
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
  }
}

}  // namespace
}  // namespace myriad
