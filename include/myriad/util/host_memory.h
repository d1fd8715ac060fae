#pragma once

namespace myriad {

// Keeps the host memory a process frees for its next allocations instead of handing it back to
// the kernel. glibc serves every allocation above 32 MB with a fresh mapping, so a run on the CPU
// would fault in and zero each of its step's large tensors again (half the classifier's step at
// 1M classes a rank: docs/benchmarks.md). Freed memory stays with the process, up to its peak.
// Does nothing where the C library is not glibc.
void keep_freed_host_memory();

}  // namespace myriad
