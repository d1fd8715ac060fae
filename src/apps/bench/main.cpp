#include <cstring>
#include <iostream>
#include <string>

#include "bench_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/util/entry.h"
#include "myriad/util/error.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(myriad::ProcessContext&, int, char**);
};

const Command kCommands[] = {
    {"collectives", "bandwidth of every collective, nccl-tests style",
     myriad::run_collectives_bench},
    {"classifier", "time and memory of a sharded classifier step (or --naive baseline)",
     myriad::run_classifier_bench},
    {"classifier-check", "loss and gradients of an HDF5 case, for parity checks",
     myriad::run_classifier_check},
    {"classifier-case", "write a random HDF5 case for classifier-check",
     myriad::run_classifier_case},
    {"loader", "images per second the data pipeline delivers", myriad::run_loader_bench},
};

std::string usage() {
  std::string text =
      "usage: myriad-bench <command> [options]   (run under mpirun or srun)\n\ncommands:\n";
  for (const Command& c : kCommands) text += std::string("  ") + c.name + "  " + c.summary + "\n";
  return text + "\n`myriad-bench <command> --help` lists a command's options.";
}

}  // namespace

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, [](myriad::ProcessContext& context, int argc, char** argv) {
    if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
      if (context.rank() == 0) std::cout << usage() << std::endl;
      return argc < 2 ? myriad::kExitUsage : myriad::kExitOk;
    }
    for (const Command& c : kCommands) {
      if (std::strcmp(argv[1], c.name) == 0) return c.run(context, argc - 1, argv + 1);
    }
    throw myriad::UsageError(myriad::str_format("unknown command '{}'", argv[1]));
  });
}
