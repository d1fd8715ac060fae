#include "myriad/util/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

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

}  // namespace myriad
