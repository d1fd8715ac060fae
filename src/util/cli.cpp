#include "myriad/util/cli.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <utility>

#include "myriad/util/error.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

bool wants_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return true;
  }
  return false;
}

// Options every command takes: logging, which overrides MYRIAD_LOG_LEVEL / MYRIAD_LOG_ALL_RANKS.
po::options_description with_logging_options(const po::options_description& options) {
  po::options_description logging("logging");
  // clang-format off
  logging.add_options()
      ("log-level", po::value<std::string>(), "debug, info, warn, error or off (default: MYRIAD_LOG_LEVEL, else info)")
      ("log-all-ranks", po::bool_switch(), "every rank logs, not only rank 0 (default: MYRIAD_LOG_ALL_RANKS)");
  // clang-format on
  po::options_description all;
  all.add(options).add(logging);
  return all;
}

void apply_logging_options(const po::variables_map& values) {
  LogConfig config = logging_config();
  if (values.count("log-level") > 0)
    config.level = parse_log_level(values["log-level"].as<std::string>());
  if (values.count("log-all-ranks") > 0 && values["log-all-ranks"].as<bool>())
    config.all_ranks = true;
  configure_logging(config);
}

void print_help(const po::options_description& options, const std::string& usage, int rank) {
  if (rank != 0) return;
  std::cout << usage << "\n\n" << options << std::endl;
}

}  // namespace

bool parse_command_line(int argc, char** argv, const po::options_description& options,
                        po::variables_map& values, const std::string& usage, int rank,
                        const po::positional_options_description* positional) {
  const po::options_description all = with_logging_options(options);
  if (wants_help(argc, argv)) {
    print_help(all, usage, rank);
    return false;
  }
  try {
    po::command_line_parser parser(argc, argv);
    parser.options(all);
    if (positional != nullptr) parser.positional(*positional);
    po::store(parser.run(), values);
    po::notify(values);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  apply_logging_options(values);
  return true;
}

bool parse_command_line_and_config(int argc, char** argv, const po::options_description& options,
                                   po::variables_map& values, const std::string& usage, int rank,
                                   const std::string& config_option) {
  const po::options_description all = with_logging_options(options);
  if (wants_help(argc, argv)) {
    print_help(all, usage, rank);
    return false;
  }
  try {
    po::store(po::command_line_parser(argc, argv).options(all).run(), values);
    if (values.count(config_option) > 0) {
      const std::string path = values[config_option].as<std::string>();
      std::ifstream file(path);
      if (!file) throw UsageError(str_format("cannot open config file '{}'", path));
      try {
        po::store(po::parse_config_file(file, all, false), values);
      } catch (const po::error& e) {
        throw UsageError(str_format("config file '{}': {}", path, e.what()));
      }
    }
    po::notify(values);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  apply_logging_options(values);
  return true;
}

bool option_given(const po::variables_map& values, const std::string& name) {
  return values.count(name) > 0 && !values[name].defaulted();
}

int64_t parse_byte_size(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos == 0)
    throw UsageError(str_format("'{}' is not a byte size (e.g. 4096, 64K, 256M, 2G)", text));
  int64_t value = std::stoll(text.substr(0, pos));
  std::string unit = text.substr(pos);
  if (unit.size() > 1 && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();
  if (unit.empty() || unit == "B" || unit == "b") return value;
  static const std::string kUnits = "KMGT";
  const size_t power = unit.size() == 1
                           ? kUnits.find(std::toupper(static_cast<unsigned char>(unit[0])))
                           : std::string::npos;
  if (power != std::string::npos) return value << (10 * (power + 1));
  throw UsageError(str_format("'{}' is not a byte size (e.g. 4096, 64K, 256M, 2G)", text));
}

namespace {

// A count with parse_count's suffixes; a malformed one is boost's error naming the option.
class CountValue : public po::typed_value<int64_t> {
 public:
  explicit CountValue(int64_t* store) : po::typed_value<int64_t>(store) {}
  void xparse(boost::any& value, const std::vector<std::string>& tokens) const override {
    if (tokens.size() != 1) throw po::invalid_option_value(tokens.empty() ? "" : tokens.back());
    try {
      value = parse_count(tokens[0]);
    } catch (const UsageError&) {
      throw po::invalid_option_value(tokens[0]);
    }
  }
};

// The shortest decimal that reads back as `value`.
std::string shortest_text(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15)
    return std::to_string(static_cast<int64_t>(value));
  for (int digits = 1; digits < 17; ++digits) {
    std::ostringstream out;
    out << std::setprecision(digits) << value;
    if (std::stod(out.str()) == value) return out.str();
  }
  std::ostringstream out;
  out << std::setprecision(17) << value;
  return out.str();
}

}  // namespace

po::typed_value<int64_t>* count_option(int64_t* store) {
  auto* option = new CountValue(store);
  option->default_value(*store);
  return option;
}

po::typed_value<double>* real_option(double* store) {
  return po::value(store)->default_value(*store, shortest_text(*store));
}

namespace {

// The digits and the unit's multiplier of a count; a multiplier of 0 when it is none.
std::pair<size_t, int64_t> count_parts(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  int64_t multiplier = 0;
  if (unit.empty()) multiplier = 1;
  if (unit == "K" || unit == "k") multiplier = 1000;
  if (unit == "M" || unit == "m") multiplier = 1000 * 1000;
  if (unit == "G" || unit == "g") multiplier = 1000 * 1000 * 1000;
  return {digits, digits == 0 ? 0 : multiplier};
}

bool count_fits(const std::string& text, size_t digits, int64_t multiplier) {
  return digits <= 18 &&
         std::stoll(text.substr(0, digits)) <= std::numeric_limits<int64_t>::max() / multiplier;
}

}  // namespace

int64_t parse_count(const std::string& text) {
  const auto [digits, multiplier] = count_parts(text);
  if (multiplier == 0) {
    throw UsageError(str_format("'{}' is not a count (e.g. 1000, 500K, 8M)", text));
  }
  if (!count_fits(text, digits, multiplier)) {
    throw UsageError(str_format("'{}' is too large a count", text));
  }
  return std::stoll(text.substr(0, digits)) * multiplier;
}

std::optional<int64_t> try_parse_count(const std::string& text) {
  const auto [digits, multiplier] = count_parts(text);
  if (multiplier == 0 || !count_fits(text, digits, multiplier)) return std::nullopt;
  return std::stoll(text.substr(0, digits)) * multiplier;
}

}  // namespace myriad
