// myriad-bench loader: how many images per second the data pipeline delivers to one rank (read,
// decode, flip, normalise), to compare with what the GPU consumes.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "bench_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/data_loader.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/synthetic_dataset.h"
#include "myriad/model/backbone.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"

namespace myriad {

int run_loader_bench(ProcessContext& context, int argc, char** argv) {
  po::options_description options("loader options");
  std::string data, shape_text, resident_limit = "1G";
  int64_t batch = 256, steps = 50;
  int workers = LoaderOptions().workers;  // myriad-train's default too
  // clang-format off
  options.add_options()
      ("data", po::value(&data)->default_value("synthetic"), "HDF5 dataset (docs/data-format.md) or synthetic")
      ("input-shape", po::value(&shape_text)->default_value("3x112x112"), "CxHxW of synthetic images")
      ("batch-size", po::value(&batch)->default_value(batch), "images per batch and rank")
      ("workers", po::value(&workers)->default_value(workers), "loader threads per rank")
      ("resident-limit", po::value(&resident_limit)->default_value(resident_limit), "raw images of at most this size in all are held in memory (myriad-train's limit; 0: always read from the file)")
      ("steps", po::value(&steps)->default_value(steps), "batches to time (after 2 untimed)");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: [mpirun -np N] myriad-bench loader [options]", context.rank())) {
    return kExitOk;
  }
  if (batch < 1 || steps < 1 || workers < 1)
    throw UsageError("--batch-size, --steps and --workers must be positive");
  std::shared_ptr<const ImageSource> source;
  if (data == "synthetic") {
    const InputShape s = parse_input_shape(shape_text);
    source = std::make_shared<SyntheticDataset>(
        (steps + 2) * batch * context.size(), 1000, static_cast<int>(s.channels),
        static_cast<int>(s.height), static_cast<int>(s.width), 0);
  } else {
    source = std::make_shared<Hdf5ImageDataset>(data, true, parse_byte_size(resident_limit));
  }
  const DatasetInfo& info = source->info();
  auto sampler =
      std::make_shared<DistributedSampler>(info.size, batch * context.size(), context.size(), 0);
  LoaderOptions lo;
  lo.workers = workers;
  lo.prefetch = std::max(lo.prefetch, workers);
  lo.rank = context.rank();
  DataLoader loader(source, sampler, lo);
  for (int i = 0; i < 2; ++i) loader.next();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) loader.next();
  const double seconds = seconds_since(start);
  double rate = steps * batch / seconds;
  double total = rate;
  MYRIAD_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, context.world()));
  if (context.rank() == 0) {
    const auto* file = dynamic_cast<const Hdf5ImageDataset*>(source.get());
    std::printf("loader: %s (%lld images %dx%dx%d, %s), batch %lld, %d workers per rank\n",
                info.name.c_str(), static_cast<long long>(info.size), info.channels, info.height,
                info.width, file != nullptr ? file->read_path() : "generated",
                static_cast<long long>(batch), workers);
    std::printf("images/s per rank (rank 0): %.0f; all %d ranks: %.0f\n", rate, context.size(),
                total);
  }
  return kExitOk;
}

}  // namespace myriad
