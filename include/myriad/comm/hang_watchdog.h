#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace myriad {

// The hang watchdog (--hang-timeout): a thread that ends the whole job when this rank stops making
// progress, so that a dead host or a cut link costs minutes instead of the allocation.
//
// It keeps two clocks (docs/multi-node.md, "A hung job"):
// - the wait clock runs while the rank is blocked on other ranks: inside a collective, a
//   point-to-point transfer or an agreement (WaitScope, placed by Communicator and
//   ProcessContext). Local work is never on it, so a rank that writes its checkpoint shard or runs
//   cuDNN's algorithm search for long is not stopped; only a peer that waits for it longer than
//   the timeout is, and ranks do the same local work.
// - the step clock runs from one step's start to the next (step_started), and catches what no
//   wait scope sees: NCCL work that never completes blocks the host in a device synchronisation,
//   and data that never arrives. It is off during the first step after start-up (cuDNN's search,
//   lazy initialisation, NCCL communicators being made) and while a LocalWork scope is open
//   (a checkpoint being written, an evaluation).
//
// When a clock passes the timeout, the rank logs one line (its rank and host, what it waited in,
// for how long, at which step), waits a few seconds so that the ranks stuck in the same collective
// print theirs, aborts the registered NCCL communicators and calls MPI_Abort, so that every rank
// exits non-zero. If MPI_Abort cannot reach the launcher (this host's link is down), the rank
// exits on its own shortly after.
//
// The bookkeeping is a few relaxed atomic stores per scope; the monitor wakes once a second.
class HangWatchdog {
 public:
  static HangWatchdog& instance();

  // Starts the monitor with this timeout in seconds; 0 leaves it off.
  void start(double timeout_seconds);
  void stop();
  bool running() const;
  double timeout_seconds() const;
  // Seconds this process has spent blocked on other ranks in wait scopes that have ended, whether
  // or not the monitor runs: what a step took minus what it waited is its own work.
  double waited_seconds() const;

  // Step `step` (counted from 0) begins. The step clock is armed from the second call on.
  void step_started(int64_t step);

  // Called when the watchdog fires, before MPI_Abort: NcclCommunicator registers its abort so that
  // no rank stays blocked inside NCCL, and `describe`, which says what of its work the GPU has not
  // finished (empty: nothing), for the watchdog's line. Returns an id for unregister_abort.
  int register_abort(std::function<void()> abort, std::function<std::string()> describe = {});
  void unregister_abort(int id);

  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

 private:
  HangWatchdog();
  ~HangWatchdog();
  friend class WaitScope;
  friend class LocalWork;
  struct State;
  State* state_;
};

// The watchdog runs with `timeout_seconds` (HangWatchdog::start) from construction to destruction,
// so that it stops however a run or a preflight ends, an exception included.
class WatchdogSession {
 public:
  explicit WatchdogSession(double timeout_seconds);
  ~WatchdogSession();
  WatchdogSession(const WatchdogSession&) = delete;
  WatchdogSession& operator=(const WatchdogSession&) = delete;
};

// This rank is blocked on others from construction to destruction. `what` names the operation
// ("all_reduce") and `detail` where it runs ("mpi, 4 ranks"); both must outlive the scope. Nested
// scopes report the outermost one.
class WaitScope {
 public:
  WaitScope(const char* what, const char* detail, int ranks);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  bool outermost_;
};

// Long local work during which no step starts (`what` names it, and must outlive the scope): the
// step clock stops, wait scopes inside are still timed.
class LocalWork {
 public:
  explicit LocalWork(const char* what);
  ~LocalWork();
  LocalWork(const LocalWork&) = delete;
  LocalWork& operator=(const LocalWork&) = delete;
};

}  // namespace myriad
