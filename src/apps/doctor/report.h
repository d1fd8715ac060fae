#pragma once

#include "checks.h"

namespace myriad {

// Prints what the checks found (rank 0 calls it): the table of ranks, the bandwidths, the run
// directory, the predicted step and memory, a row per check (passed, failed, skipped), the
// warnings and the verdict. The errors are the caller's to raise.
void print_report(const Survey& s, const std::vector<CheckOutcome>& outcomes);

}  // namespace myriad
