#pragma once

namespace myriad {

class ProcessContext;

// Each `myriad-bench <command>` is one function taking the arguments after the command name.
int run_collectives_bench(ProcessContext& context, int argc, char** argv);
int run_classifier_bench(ProcessContext& context, int argc, char** argv);
int run_classifier_check(ProcessContext& context, int argc, char** argv);
int run_classifier_case(ProcessContext& context, int argc, char** argv);
int run_backbone_bench(ProcessContext& context, int argc, char** argv);
int run_loader_bench(ProcessContext& context, int argc, char** argv);
int run_checkpoint_bench(ProcessContext& context, int argc, char** argv);

}  // namespace myriad
