#include "myriad/util/error.h"

#include <mutex>

namespace myriad {

namespace {

struct Identity {
  std::mutex mutex;
  int rank = -1;
  std::string host;
};

Identity& identity() {
  static Identity id;
  return id;
}

}  // namespace

void set_error_identity(int rank, const std::string& host) {
  Identity& id = identity();
  std::lock_guard<std::mutex> lock(id.mutex);
  id.rank = rank;
  id.host = host;
}

std::string error_location(const char* file, int line) {
  Identity& id = identity();
  std::lock_guard<std::mutex> lock(id.mutex);
  if (id.rank < 0) return str_format("{}:{}", file, line);
  return str_format("rank {} on {}, {}:{}", id.rank, id.host, file, line);
}

Error::Error(const std::string& message, const std::string& location, bool collective)
    : std::runtime_error(location.empty() ? message : message + " [" + location + "]"),
      message_(message),
      location_(location),
      collective_(collective) {}

void throw_error(const char* file, int line, const std::string& message, bool collective) {
  throw Error(message, error_location(file, line), collective);
}

}  // namespace myriad
