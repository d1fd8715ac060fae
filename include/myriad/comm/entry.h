#pragma once

#include <functional>
#include <string>
#include <vector>

#include "myriad/util/exit_codes.h"

namespace myriad {

class ProcessContext;

using EntryBody = std::function<int(ProcessContext& context, int argc, char** argv)>;

// Runs `body` as the whole program of one rank. An error raised identically on every rank
// (Error::collective(), UsageError) is reported once by rank 0 and every rank exits cleanly with
// kExitUsage or kExitFailure. Any other error is logged by the rank that hit it, which then calls
// MPI_Abort so that no other rank is left waiting in a collective (a single process just exits).
int run_entry(int argc, char** argv, const EntryBody& body);

// A `tool <command> [options]` executable: each command gets the arguments after its name.
struct SubCommand {
  const char* name;
  const char* summary;
  int (*run)(ProcessContext& context, int argc, char** argv);
};

// Dispatches argv[1] to its command; without one (or with --help) rank 0 prints `usage` and the
// commands. An unknown command is a UsageError.
int run_sub_command(ProcessContext& context, int argc, char** argv, const std::string& usage,
                    const std::vector<SubCommand>& commands);

}  // namespace myriad
