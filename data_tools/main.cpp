// myriad-data: converts image collections into myriad's HDF5 format and inspects such files.

#include <cstring>
#include <iostream>
#include <string>

#include "data_commands.h"
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
    {"from-idx", "MNIST / Fashion-MNIST IDX files (.gz or plain) to HDF5", myriad::run_from_idx},
    {"from-folder", "a class-per-directory tree of JPEG/PNG files to HDF5 (bytes kept as they are)",
     myriad::run_from_folder},
    {"inspect", "images, shape, encoding, classes and their histogram; validates labels and images",
     myriad::run_inspect},
};

std::string usage() {
  std::string text = "usage: myriad-data <command> [options]\n\ncommands:\n";
  for (const Command& c : kCommands) text += std::string("  ") + c.name + "  " + c.summary + "\n";
  return text + "\n`myriad-data <command> --help` lists a command's options; docs/data-format.md describes the files.";
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
