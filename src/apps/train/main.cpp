// myriad-train: one rank per GPU (or CPU process), started by mpirun or srun.

#include "myriad/comm/entry.h"
#include "myriad/comm/process_context.h"
#include "myriad/train/train_config.h"
#include "myriad/train/trainer.h"
#include "myriad/util/cli.h"

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, [](myriad::ProcessContext& context, int argc, char** argv) {
    myriad::TrainConfig config;
    const auto options = myriad::train_options(config);
    myriad::po::variables_map values;
    if (!myriad::parse_command_line_and_config(argc, argv, options, values,
                                               "usage: mpirun -np N myriad-train [options]   (or "
                                               "srun --mpi=pmix myriad-train [options])",
                                               context.rank(), "config")) {
      return myriad::kExitOk;
    }
    myriad::finish_train_config(values, config);
    const myriad::TrainResult result =
        myriad::train(context, config, myriad::config_as_ini(values));
    return result.stopped ? myriad::kExitStopped : myriad::kExitOk;
  });
}
