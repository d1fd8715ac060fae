#include "myriad/util/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <thread>

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

void fault_slow_step(int rank) {
  // Read once: the step loop calls this every step.
  static const std::pair<int, double> slow = [] {
    const char* value = std::getenv("MYRIAD_FAULT_SLOW_RANK");
    if (value == nullptr) return std::make_pair(-1, 0.0);
    std::cmatch match;
    MYRIAD_CHECK(std::regex_match(value, match, std::regex(R"(([0-9]+):([0-9]*\.?[0-9]+))")),
                 "MYRIAD_FAULT_SLOW_RANK must be RANK:SECONDS (\"2:0.2\"), not '{}'", value);
    return std::make_pair(std::stoi(match[1].str()), std::stod(match[2].str()));
  }();
  if (rank != slow.first) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(slow.second));
}

}  // namespace myriad
