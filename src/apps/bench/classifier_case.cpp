// myriad-bench classifier-case: a random case for classifier-check, written by rank 0.

#include "bench_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"

namespace myriad {

int run_classifier_case(ProcessContext& context, int argc, char** argv) {
  po::options_description options("classifier-case options");
  std::string output;
  int64_t samples = 0, classes = 0, dim = 0;
  uint64_t seed = 0;
  // clang-format off
  options.add_options()
      ("output", po::value(&output)->required(), "HDF5 file to write")
      ("samples", po::value(&samples)->default_value(64), "rows N")
      ("classes", po::value(&classes)->default_value(1000), "classes C")
      ("embedding-size", po::value(&dim)->default_value(64), "embedding size D")
      ("seed", po::value(&seed)->default_value(0), "random seed");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-bench classifier-case --output case.h5 [options]",
                          context.rank())) {
    return kExitOk;
  }
  if (samples < 1 || classes < 1 || dim < 1)
    throw UsageError("--samples, --classes and --embedding-size must be positive");
  if (context.rank() != 0) return kExitOk;
  torch::manual_seed(seed);
  AtomicOutput out(output);
  {
    Hdf5File file(out.temporary_path(), Hdf5File::Mode::kCreate);
    file.write("features", torch::randn({samples, dim}));
    file.write("labels", torch::randint(0, classes, {samples}, torch::kInt64));
    file.write("weight", torch::randn({classes, dim}) * 0.05);
  }
  out.commit();
  log_info("wrote {}: features [{}, {}], labels [{}], weight [{}, {}]", output, samples, dim,
           samples, classes, dim);
  return kExitOk;
}

}  // namespace myriad
