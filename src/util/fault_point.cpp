#include "myriad/util/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <utility>

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

std::optional<int> fault_host_gpus() {
  const char* text = std::getenv("MYRIAD_FAULT_HOST_GPUS");
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long gpus = std::strtol(text, &end, 10);
  MYRIAD_CHECK(*end == '\0' && gpus >= 0 && gpus <= 1024,
               "MYRIAD_FAULT_HOST_GPUS must be a GPU count, not '{}'", text);
  return static_cast<int>(gpus);
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

void fault_stall(const char* phase, int rank) {
  struct Stall {
    int rank = -1;
    std::string phase;
    int64_t at = 0;
    int64_t reached = 0;
  };
  static Stall stall = [] {
    Stall s;
    const char* value = std::getenv("MYRIAD_FAULT_STALL_AT");
    if (value == nullptr) return s;
    std::cmatch match;
    MYRIAD_CHECK(std::regex_match(value, match, std::regex(R"(([0-9]+):([a-z_]+)@([0-9]+))")),
                 "MYRIAD_FAULT_STALL_AT must be RANK:PHASE@N (\"1:backward@30\"), not '{}'", value);
    s.rank = std::stoi(match[1].str());
    s.phase = match[2].str();
    s.at = std::stoll(match[3].str());
    return s;
  }();
  if (rank != stall.rank || stall.phase != phase || ++stall.reached != stall.at) return;
  std::fprintf(stderr, "fault injection: rank %d (pid %d) stopped at %s #%lld\n", rank,
               static_cast<int>(getpid()), phase, static_cast<long long>(stall.at));
  std::fflush(stderr);
  raise(SIGSTOP);
}

}  // namespace myriad
