#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/log.h"

namespace myriad {
namespace {

struct Argv {
  explicit Argv(std::vector<std::string> args) : storage(std::move(args)) {
    for (auto& a : storage) pointers.push_back(a.data());
  }
  int argc() { return static_cast<int>(pointers.size()); }
  char** argv() { return pointers.data(); }
  std::vector<std::string> storage;
  std::vector<char*> pointers;
};

// Three options and the variables they fill.
struct SampleOptions {
  int steps = 0;
  double lr = 0;
  std::string config;
  po::options_description options{"sample"};
  po::variables_map values;

  SampleOptions() {
    // clang-format off
    options.add_options()
        ("config", po::value(&config), "INI file")
        ("steps", po::value(&steps)->default_value(10), "steps")
        ("lr", po::value(&lr)->default_value(0.1), "learning rate");
    // clang-format on
  }
  bool parse(std::vector<std::string> args) {
    Argv argv(std::move(args));
    return parse_command_line(argv.argc(), argv.argv(), options, values, "usage", 1);
  }
  bool parse_with_config(std::vector<std::string> args) {
    Argv argv(std::move(args));
    return parse_command_line_and_config(argv.argc(), argv.argv(), options, values, "usage", 1,
                                         "config");
  }
};

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(CommandLine, ParsesValuesAndDefaults) {
  SampleOptions o;
  ASSERT_TRUE(o.parse({"prog", "--steps", "25"}));
  EXPECT_EQ(o.steps, 25);
  EXPECT_DOUBLE_EQ(o.lr, 0.1);
}

TEST(CommandLine, UnknownOptionAndMalformedValueAreUsageErrors) {
  try {
    SampleOptions().parse({"prog", "--stpes", "3"});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(e.message().find("stpes"), std::string::npos) << e.message();
  }
  EXPECT_THROW(SampleOptions().parse({"prog", "--steps", "many"}), UsageError);
}

TEST(CommandLine, HelpReturnsFalse) {
  EXPECT_FALSE(SampleOptions().parse({"prog", "--help"}));
}

TEST(CommandLine, ConfigFileIsOverriddenByCommandLine) {
  const std::string path = write_file("myriad_cli_test.ini", "steps = 7\nlr = 0.5\n");
  SampleOptions o;
  ASSERT_TRUE(o.parse_with_config({"prog", "--config", path, "--lr", "0.25"}));
  EXPECT_EQ(o.steps, 7);
  EXPECT_DOUBLE_EQ(o.lr, 0.25);
  std::remove(path.c_str());
}

TEST(CommandLine, BadConfigFileIsAUsageError) {
  const std::string path = write_file("myriad_cli_bad.ini", "stepz = 7\n");
  EXPECT_THROW(SampleOptions().parse_with_config({"prog", "--config", path}), UsageError);
  EXPECT_THROW(SampleOptions().parse_with_config({"prog", "--config", "/nonexistent/x.ini"}),
               UsageError);
  std::remove(path.c_str());
}

TEST(ByteSize, ParsesSuffixes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096);
  EXPECT_EQ(parse_byte_size("64K"), 64 << 10);
  EXPECT_EQ(parse_byte_size("256M"), int64_t{256} << 20);
  EXPECT_EQ(parse_byte_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("3MB"), int64_t{3} << 20);
  EXPECT_THROW(parse_byte_size("lots"), UsageError);
  EXPECT_THROW(parse_byte_size("5X"), UsageError);
  EXPECT_THROW(parse_byte_size("5KX"), UsageError);
}

TEST(Count, ParsesDecimalSuffixes) {
  EXPECT_EQ(parse_count("1000"), 1000);
  EXPECT_EQ(parse_count("500K"), 500000);
  EXPECT_EQ(parse_count("8M"), 8000000);
  EXPECT_EQ(parse_count("1G"), 1000000000);
  EXPECT_THROW(parse_count("M"), UsageError);
  EXPECT_THROW(parse_count("8X"), UsageError);
  EXPECT_THROW(parse_count("8MB"), UsageError);
}

TEST(LogLevel, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::kWarn);
  EXPECT_THROW(parse_log_level("loud"), UsageError);
}

}  // namespace
}  // namespace myriad
