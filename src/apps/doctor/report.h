#pragma once

#include "checks.h"

namespace myriad {

// Prints what the checks found (rank 0 calls it): the table of ranks, the bandwidths, the run
// directory, the predicted step and memory, the warnings among `findings` and the verdict. The
// errors among them are the caller's to raise.
void print_report(const Survey& s, const Findings& findings);

}  // namespace myriad
