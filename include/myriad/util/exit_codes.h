#pragma once

namespace myriad {

// Exit codes shared by every myriad executable.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
// A signal (SIGTERM, SIGUSR1, SIGINT) or --stop-at-step stopped training after a checkpoint was
// written: rerun with --resume auto to continue (EX_TEMPFAIL of sysexits.h).
constexpr int kExitStopped = 75;

}  // namespace myriad
