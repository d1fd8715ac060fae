// myriad-eval: face-recognition benchmarks of a trained backbone, on any number of ranks
// (docs/evaluation.md).

#include "eval_commands.h"
#include "myriad/comm/entry.h"

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, [](myriad::ProcessContext& context, int argc, char** argv) {
    return myriad::run_sub_command(
        context, argc, argv,
        "usage: mpirun -np N myriad-eval <command> [options]   (docs/evaluation.md)",
        {{"ijb", "IJB-B/C 1:1 verification (TAR at FAR), insightface's protocol",
          myriad::run_ijb}});
  });
}
