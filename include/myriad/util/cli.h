#pragma once

#include <boost/program_options.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace myriad {

namespace po = boost::program_options;

// Parses `argv` against `options` plus the logging options every command takes (--log-level,
// --log-all-ranks, applied at once). An unknown option or a malformed value becomes a UsageError
// naming it. Returns false when --help was given; rank 0 has then printed `usage` and the options.
bool parse_command_line(int argc, char** argv, const po::options_description& options,
                        po::variables_map& values, const std::string& usage, int rank,
                        const po::positional_options_description* positional = nullptr);

// Like parse_command_line, then reads the INI file named by option `config_option` when set;
// the command line wins over the file.
bool parse_command_line_and_config(int argc, char** argv, const po::options_description& options,
                                   po::variables_map& values, const std::string& usage, int rank,
                                   const std::string& config_option);

// Whether the command line (or configuration file) set option `name`, rather than its default.
bool option_given(const po::variables_map& values, const std::string& name);

// "4096", "64K", "256M", "2G" (powers of 1024; a trailing B or iB is allowed). UsageError
// otherwise.
int64_t parse_byte_size(const std::string& text);

// "1000000", "1M", "8M", "500K", "1G" (powers of 1000). UsageError otherwise.
int64_t parse_count(const std::string& text);
// The same, or nothing for text that is not such a count or too large for int64.
std::optional<int64_t> try_parse_count(const std::string& text);

// An option of a count bound to `store`, taking parse_count's suffixes: --num-classes 10M. Its
// default is `store`'s value.
po::typed_value<int64_t>* count_option(int64_t* store);

// An option of a real number bound to `store`, whose default (`store`'s value) --help prints as
// written: 0.1, not 0.10000000000000001.
po::typed_value<double>* real_option(double* store);

}  // namespace myriad
