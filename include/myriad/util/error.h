#pragma once

#include <stdexcept>
#include <string>

#include "myriad/util/format.h"

namespace myriad {

// Stamps every later error with the rank and host that raised it.
void set_error_identity(int rank, const std::string& host);

// "rank 1 on node7, src/comm/mpi_communicator.cpp:42"
std::string error_location(const char* file, int line);

// The one error type of myriad. `collective` marks an error that every rank raises at the same
// point of the program (all ranks saw the same gathered data, or the same command line), so the
// program can exit cleanly on all ranks instead of aborting the job.
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const std::string& location, bool collective = false);

  const std::string& message() const { return message_; }
  const std::string& location() const { return location_; }
  bool collective() const { return collective_; }

 private:
  std::string message_;
  std::string location_;
  bool collective_;
};

// A bad command line or configuration. Always collective: every rank parses the same input.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message, "", true) {}
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message,
                              bool collective = false);

}  // namespace myriad

#define MYRIAD_THROW(...) \
  ::myriad::throw_error(__FILE__, __LINE__, ::myriad::str_format(__VA_ARGS__))

#define MYRIAD_CHECK(cond, ...)             \
  do {                                      \
    if (!(cond)) MYRIAD_THROW(__VA_ARGS__); \
  } while (0)

// For errors detected identically on every rank (see Error::collective).
#define MYRIAD_THROW_COLLECTIVE(...) \
  ::myriad::throw_error(__FILE__, __LINE__, ::myriad::str_format(__VA_ARGS__), true)

#define MYRIAD_CHECK_COLLECTIVE(cond, ...)             \
  do {                                                 \
    if (!(cond)) MYRIAD_THROW_COLLECTIVE(__VA_ARGS__); \
  } while (0)
