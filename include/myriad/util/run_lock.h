#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace myriad {

// One job per run directory (docs/training.md, "One job per run directory"): a lock file, LOCK, in
// the run directory and in the checkpoint directory when that is not inside it. It relies on
// nothing but an atomic link() and rename() and on file modification times, which NFS and Lustre
// keep, and not on flock() or fcntl() locks, which such file systems refuse or keep per node.
//
// The file is created whole (written under another name, then linked into place: exactly one
// starter succeeds) and names its holder: host, pid, Slurm job and restart count, since when. The
// holder refreshes its modification time every kHeartbeatSeconds. A lock found in place is taken
// over, with one warning, once its holder is gone:
//  * the same Slurm job restarted (requeued): at once;
//  * the same host (hostname, boot and pid namespace): at once when its process no longer runs;
//  * another host: when its heartbeat is older than kStaleSeconds (clocks agreeing within tens of
//    seconds, as NTP keeps them).
// A holder that finds its lock taken over all the same (a node cut off longer than the bound,
// then back) exits at once, so that two jobs never go on writing one run.
class RunLock {
 public:
  static constexpr int kHeartbeatSeconds = 10;
  static constexpr int kStaleSeconds = 60;
  static constexpr const char* kFileName = "LOCK";

  // Creates the directories that do not exist and locks them, or none of them: an Error naming the
  // holder when a job that still runs holds one.
  RunLock(const std::string& run_dir, const std::string& checkpoint_dir);
  // Stops the heartbeat, removes the lock files, and removes the directories this lock created if
  // they are still empty (a start refused after the lock leaves nothing).
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  bool created_run_dir() const { return held_.front().created; }
  // False as well when the checkpoint directory is inside the run directory (not locked apart).
  bool created_checkpoint_dir() const { return held_.size() > 1 && held_.back().created; }

 private:
  struct Held {
    std::string directory;
    std::string file;  // DIRECTORY/LOCK
    bool created = false;
    bool locked = false;
  };

  void acquire(Held& held, const std::string& what);
  // Writes this holder's record under a name of its own and links it to `file`; false when a lock
  // is there already.
  bool place(const std::string& file) const;
  void heartbeat();
  void refresh(const Held& held);
  void release();

  std::string record_;  // the lock file's content: who holds it
  std::string host_;
  std::vector<Held> held_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace myriad
