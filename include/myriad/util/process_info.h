#pragma once

#include <cstdint>
#include <optional>

namespace myriad {

// When process `pid` started, in clock ticks since the boot (field 22 of /proc/PID/stat); nullopt
// when no such process runs (none, one that is ending, or one that has exited and waits to be
// collected: a zombie).
// With the pid it names one process for good: pids are reused, start times on the same boot are
// not.
std::optional<uint64_t> process_start_ticks(int pid);

}  // namespace myriad
