#include "myriad/util/entry.h"

#include <c10/util/Exception.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
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

}  // namespace myriad
