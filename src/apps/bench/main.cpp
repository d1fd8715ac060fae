// myriad-bench: benchmarks and parity checks, run under mpirun or srun.

#include "bench_commands.h"
#include "myriad/comm/entry.h"
#include "myriad/util/cli.h"

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, [](myriad::ProcessContext& context, int argc, char** argv) {
    return myriad::run_sub_command(
        context, argc, argv, "usage: myriad-bench <command> [options]   (run under mpirun or srun)",
        {{"collectives", "bandwidth of every collective, nccl-tests style",
          myriad::run_collectives_bench},
         {"classifier", "time and memory of a sharded classifier step (or --naive baseline)",
          myriad::run_classifier_bench},
         {"classifier-check", "loss and gradients of an HDF5 case, for parity checks",
          myriad::run_classifier_check},
         {"classifier-case", "write a random HDF5 case for classifier-check",
          myriad::run_classifier_case},
         {"backbone", "time of the backbone's forward and backward beside its roofline floor",
          myriad::run_backbone_bench},
         {"loader", "images per second the data pipeline delivers", myriad::run_loader_bench},
         {"checkpoint", "save and load throughput of a sharded checkpoint",
          myriad::run_checkpoint_bench}});
  });
}
