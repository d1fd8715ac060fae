#pragma once

namespace myriad {

class ProcessContext;

// Each `myriad-data <command>` takes the arguments after the command name.
int run_from_idx(ProcessContext& context, int argc, char** argv);
int run_from_folder(ProcessContext& context, int argc, char** argv);
int run_from_rec(ProcessContext& context, int argc, char** argv);
int run_from_bin(ProcessContext& context, int argc, char** argv);
int run_from_ijb(ProcessContext& context, int argc, char** argv);
int run_inspect(ProcessContext& context, int argc, char** argv);
int run_synthetic(ProcessContext& context, int argc, char** argv);
int run_pairs(ProcessContext& context, int argc, char** argv);
int run_synthetic_ijb(ProcessContext& context, int argc, char** argv);

}  // namespace myriad
