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

po::options_description sample_options(int* steps, double* lr, std::string* config) {
  po::options_description options("sample");
  options.add_options()
      ("config", po::value(config), "INI file")
      ("steps", po::value(steps)->default_value(10), "steps")
      ("lr", po::value(lr)->default_value(0.1), "learning rate");
  return options;
}

TEST(CommandLine, ParsesValuesAndDefaults) {
  int steps = 0;
  double lr = 0;
  std::string config;
  auto options = sample_options(&steps, &lr, &config);
  po::variables_map values;
  Argv args({"prog", "--steps", "25"});
  ASSERT_TRUE(parse_command_line(args.argc(), args.argv(), options, values, "usage", 1));
  EXPECT_EQ(steps, 25);
  EXPECT_DOUBLE_EQ(lr, 0.1);
}

TEST(CommandLine, UnknownOptionAndMalformedValueAreUsageErrors) {
  int steps = 0;
  double lr = 0;
  std::string config;
  auto options = sample_options(&steps, &lr, &config);
  {
    po::variables_map values;
    Argv args({"prog", "--stpes", "3"});
    try {
      parse_command_line(args.argc(), args.argv(), options, values, "usage", 1);
      FAIL() << "no error";
    } catch (const UsageError& e) {
      EXPECT_NE(e.message().find("stpes"), std::string::npos) << e.message();
    }
  }
  {
    po::variables_map values;
    Argv args({"prog", "--steps", "many"});
    EXPECT_THROW(parse_command_line(args.argc(), args.argv(), options, values, "usage", 1), UsageError);
  }
}

TEST(CommandLine, HelpReturnsFalse) {
  int steps = 0;
  double lr = 0;
  std::string config;
  auto options = sample_options(&steps, &lr, &config);
  po::variables_map values;
  Argv args({"prog", "--help"});
  EXPECT_FALSE(parse_command_line(args.argc(), args.argv(), options, values, "usage", 1));
}

TEST(CommandLine, ConfigFileIsOverriddenByCommandLine) {
  const std::string path = ::testing::TempDir() + "/myriad_cli_test.ini";
  {
    std::ofstream file(path);
    file << "steps = 7\nlr = 0.5\n";
  }
  int steps = 0;
  double lr = 0;
  std::string config;
  auto options = sample_options(&steps, &lr, &config);
  po::variables_map values;
  Argv args({"prog", "--config", path, "--lr", "0.25"});
  ASSERT_TRUE(parse_command_line_and_config(args.argc(), args.argv(), options, values, "usage", 1, "config"));
  EXPECT_EQ(steps, 7);
  EXPECT_DOUBLE_EQ(lr, 0.25);
  std::remove(path.c_str());
}

TEST(CommandLine, BadConfigFileIsAUsageError) {
  const std::string path = ::testing::TempDir() + "/myriad_cli_bad.ini";
  {
    std::ofstream file(path);
    file << "stepz = 7\n";
  }
  int steps = 0;
  double lr = 0;
  std::string config;
  auto options = sample_options(&steps, &lr, &config);
  po::variables_map values;
  Argv args({"prog", "--config", path});
  EXPECT_THROW(parse_command_line_and_config(args.argc(), args.argv(), options, values, "usage", 1, "config"),
               UsageError);
  Argv missing({"prog", "--config", "/nonexistent/x.ini"});
  po::variables_map values2;
  EXPECT_THROW(parse_command_line_and_config(missing.argc(), missing.argv(), options, values2, "usage", 1, "config"),
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

TEST(LogLevel, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::kWarn);
  EXPECT_THROW(parse_log_level("loud"), UsageError);
}

}  // namespace
}  // namespace myriad
