#include "myriad/comm/entry.h"

#include <c10/util/Exception.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <string>

#include "myriad/comm/process_context.h"
#include "myriad/util/error.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

std::string program_name(const char* argv0) {
  const char* slash = std::strrchr(argv0, '/');
  return slash != nullptr ? slash + 1 : argv0;
}

// Reports an error only this rank may have seen. With other ranks, MPI_Abort brings them down
// too, whatever collective they wait in; alone, the process just exits.
int fail_rank(const std::string& program, const std::string& what, int world_size) {
  log_write_this_rank(LogLevel::kError, str_format("{}: error: {}", program, what));
  std::fflush(stdout);
  std::fflush(stderr);
  if (world_size > 1) {
    MPI_Abort(MPI_COMM_WORLD, kExitFailure);
    std::_Exit(kExitFailure);
  }
  return kExitFailure;
}

}  // namespace

int run_entry(int argc, char** argv, const EntryBody& body) {
  const std::string program = program_name(argc > 0 ? argv[0] : "myriad");
  std::unique_ptr<ProcessContext> context;
  try {
    context = std::make_unique<ProcessContext>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return kExitFailure;
  }
  try {
    return body(*context, argc, argv);
  } catch (const UsageError& e) {
    if (context->rank() == 0) {
      log_write_this_rank(LogLevel::kError, str_format("{}: error: {} (see {} --help)", program,
                                                       e.message(), program));
    }
    return kExitUsage;
  } catch (const Error& e) {
    if (!e.collective()) return fail_rank(program, e.what(), context->size());
    if (context->rank() == 0) {
      log_write_this_rank(LogLevel::kError, str_format("{}: error: {}", program, e.what()));
    }
    return kExitFailure;
  } catch (const c10::Error& e) {
    return fail_rank(program, e.what_without_backtrace(), context->size());
  } catch (const std::exception& e) {
    return fail_rank(program, e.what(), context->size());
  }
}

int run_sub_command(ProcessContext& context, int argc, char** argv, const std::string& usage,
                    const std::vector<SubCommand>& commands) {
  const bool help = argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h";
  if (help) {
    if (context.rank() == 0) {
      std::cout << usage << "\n\ncommands:\n";
      for (const SubCommand& c : commands) std::cout << "  " << c.name << "  " << c.summary << "\n";
      std::cout << "\n`<command> --help` lists a command's options." << std::endl;
    }
    return argc < 2 ? kExitUsage : kExitOk;
  }
  for (const SubCommand& c : commands) {
    if (argv[1] == std::string(c.name)) return c.run(context, argc - 1, argv + 1);
  }
  throw UsageError(str_format("unknown command '{}'", argv[1]));
}

}  // namespace myriad
