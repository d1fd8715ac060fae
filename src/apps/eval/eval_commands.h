#pragma once

namespace myriad {

class ProcessContext;

// Each `myriad-eval <command>` takes the arguments after the command name.
int run_ijb(ProcessContext& context, int argc, char** argv);

}  // namespace myriad
