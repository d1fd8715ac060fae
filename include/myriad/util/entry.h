#pragma once

#include <functional>

namespace myriad {

class ProcessContext;

// Exit codes shared by every myriad executable.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
// A signal (SIGTERM, SIGUSR1, SIGINT) or --stop-at-step stopped training after a checkpoint was
// written: rerun with --resume auto to continue (EX_TEMPFAIL of sysexits.h).
constexpr int kExitStopped = 75;

using EntryBody = std::function<int(ProcessContext& context, int argc, char** argv)>;

// Runs `body` as the whole program of one rank. An error raised identically on every rank
// (Error::collective(), UsageError) is reported once by rank 0 and every rank exits cleanly with
// kExitUsage or kExitFailure. Any other error is logged by the rank that hit it, which then calls
// MPI_Abort so that no other rank is left waiting in a collective (a single process just exits).
int run_entry(int argc, char** argv, const EntryBody& body);

}  // namespace myriad
