#include "myriad/util/process_info.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace myriad {

std::optional<uint64_t> process_start_ticks(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  // The kernel's PF_EXITING and PF_DUMPCORE: a process that is ending (tearing down a large
  // address space or a GPU context, or writing a core) takes seconds to vanish.
  constexpr unsigned long kEnding = 0x4 | 0x200;
  for (int k = 3; k <= 22; ++k) {
    if (!(fields >> field)) return std::nullopt;
    // Field 3 is the state: a zombie has exited, only its parent has not collected it yet.
    if (k == 3 && (field == "Z" || field == "X")) return std::nullopt;
    // Field 9 holds the flags.
    if (k == 9 && (std::strtoul(field.c_str(), nullptr, 10) & kEnding) != 0) return std::nullopt;
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

std::optional<int64_t> available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    // "MemAvailable:   12345678 kB"
    if (line.rfind("MemAvailable:", 0) == 0)
      return std::strtoll(line.c_str() + 13, nullptr, 10) * 1024;
  }
  return std::nullopt;
}

}  // namespace myriad
