#include "myriad/util/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "myriad/util/error.h"

namespace myriad {

void fault_point(const std::string& phase, int64_t step) {
  const char* target = std::getenv("MYRIAD_FAULT_KILL_AT");
  if (target == nullptr) return;
  const std::string wanted = target;
  if (wanted != phase && wanted != phase + "@" + std::to_string(step)) return;
  std::fprintf(stderr, "fault injection: pid %d killed at %s of the checkpoint at step %lld\n",
               static_cast<int>(getpid()), phase.c_str(), static_cast<long long>(step));
  std::fflush(stderr);
  raise(SIGKILL);
}

std::optional<double> fault_graph_memory_fraction() {
  const char* text = std::getenv("MYRIAD_FAULT_GRAPH_MEMORY_FRACTION");
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const double fraction = std::strtod(text, &end);
  MYRIAD_CHECK(*end == '\0' && fraction > 0.0 && fraction <= 1.0,
               "MYRIAD_FAULT_GRAPH_MEMORY_FRACTION must be a number in (0, 1], not '{}'", text);
  return fraction;
}

}  // namespace myriad
