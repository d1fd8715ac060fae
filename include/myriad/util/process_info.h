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

// The memory that new allocations may take without swapping (MemAvailable of /proc/meminfo), in
// bytes; nullopt where the kernel does not say.
std::optional<int64_t> available_memory_bytes();

}  // namespace myriad
