#pragma once

#include <string>
#include <vector>

namespace myriad {

// SIGTERM, SIGUSR1 and SIGINT (Slurm signals a job before its time limit or preemption) only set
// a flag; the training loop agrees on it across ranks at the next step boundary, checkpoints and
// exits with kExitStopped. Installing also unblocks them in the calling thread. Returns the
// signals whose handler someone else had installed since the last call (a library starting up),
// now replaced by ours.
std::vector<std::string> install_stop_handlers();
bool stop_requested();
// The signal that asked to stop: "SIGTERM", "SIGUSR1" or "SIGINT" ("" when none did).
std::string stop_signal_name();

}  // namespace myriad
