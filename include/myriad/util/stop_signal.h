#pragma once

#include <string>
#include <vector>

namespace myriad {

// SIGTERM, SIGUSR1 and SIGINT (Slurm signals a job before its time limit or preemption) only set
// a flag; the training loop agrees on it across ranks at the next step boundary, checkpoints and
// exits with kExitStopped. Later signals change nothing: a checkpoint under way is never cut short
// by a repeated request (SIGKILL, or a launcher's escalation to it, ends a rank at once).
// Installing also unblocks them in the calling thread. Returns the signals whose handler someone
// else had installed since the last call (a library starting up), now replaced by ours.
std::vector<std::string> install_stop_handlers();
bool stop_requested();
// The signal that asked to stop: "SIGTERM", "SIGUSR1" or "SIGINT" ("" when none did).
std::string stop_signal_name();

// A stop asked for by creating a file (docs/training.md, "Stopping"): launch/mpirun.sh creates it
// when it gets a signal, and anyone may create it by hand. A file last modified before `since`
// (seconds since the epoch: the launch, or this process's start) is left from an earlier run and
// ignored, so a resumed run never stops on an old request. The file system is asked at most once
// a second.
class StopFile {
 public:
  StopFile(std::string path, double since);
  const std::string& path() const { return path_; }
  bool requested();
  // Removes the file (once every rank has agreed to stop).
  void clear() const;
  // Removes a file left from an earlier run; true if there was one.
  bool clear_if_stale() const;

 private:
  std::string path_;
  double since_;
  double next_check_ = 0;  // steady-clock seconds
  bool requested_ = false;
};

// The stop file of a run in `run_dir`: $MYRIAD_STOP_FILE if a launcher set it, else RUN_DIR/STOP;
// requests count from $MYRIAD_STOP_SINCE if set, else from this process's start.
StopFile default_stop_file(const std::string& run_dir);

}  // namespace myriad
