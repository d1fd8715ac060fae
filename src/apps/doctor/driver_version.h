#pragma once

#include <string>

namespace myriad {

// The kernel driver's version ("580.95.05") in the text of /proc/driver/nvidia/version: the first
// word of its "NVRM version" line made of numbers and dots. The proprietary module's line reads
// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ...", the open one's "NVRM version:
// NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ...". Empty when there is
// no such line (a container without the file).
std::string driver_version_from_proc(const std::string& text);

}  // namespace myriad
