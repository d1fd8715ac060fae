#include "myriad/util/run_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "myriad/util/atomic_output.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"
#include "myriad/util/process_info.h"

namespace myriad {

namespace {

namespace fs = std::filesystem;

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// Who holds a lock: the lock file's content. A process is the same one only on the same host,
// boot and pid namespace (containers on one machine share a hostname or a boot, not both with
// the namespace).
struct Holder {
  std::string host;
  std::string boot_id;
  std::string pid_namespace;
  int64_t pid = 0;
  uint64_t pid_start = 0;  // process_start_ticks
  std::string slurm_job_id;
  int64_t slurm_restart_count = 0;
  double since = 0;
  std::string nonce;  // tells two records of one process apart

  bool same_process_space(const Holder& other) const {
    return host == other.host && boot_id == other.boot_id && pid_namespace == other.pid_namespace;
  }
};

Holder this_process(const std::string& host) {
  Holder me;
  me.host = host;
  me.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  char target[256] = {};
  const ssize_t length = readlink("/proc/self/ns/pid", target, sizeof target - 1);
  if (length > 0) me.pid_namespace.assign(target, static_cast<size_t>(length));
  me.pid = getpid();
  me.pid_start = process_start_ticks(static_cast<int>(me.pid)).value_or(0);
  me.slurm_job_id = environment("SLURM_JOB_ID");
  me.slurm_restart_count = std::atoll(environment("SLURM_RESTART_COUNT").c_str());
  me.since = unix_seconds();
  me.nonce =
      str_format("{:016x}", std::random_device{}() * 0x100000000ull + std::random_device{}());
  return me;
}

std::string to_record(const Holder& h) {
  return nlohmann::json{{"host", h.host},
                        {"pid", h.pid},
                        {"pid_start", h.pid_start},
                        {"boot_id", h.boot_id},
                        {"pid_namespace", h.pid_namespace},
                        {"slurm_job_id", h.slurm_job_id},
                        {"slurm_restart_count", h.slurm_restart_count},
                        {"since", h.since},
                        {"since_utc", utc_text(h.since)},
                        {"nonce", h.nonce}}
             .dump() +
         "\n";
}

// A lock written by hand or by another program may lack fields; those it has must be right.
std::optional<Holder> from_record(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    Holder h;
    h.host = j.at("host").get<std::string>();
    h.pid = j.at("pid").get<int64_t>();
    h.pid_start = j.value("pid_start", uint64_t{0});
    h.boot_id = j.value("boot_id", std::string());
    h.pid_namespace = j.value("pid_namespace", std::string());
    h.slurm_job_id = j.value("slurm_job_id", std::string());
    h.slurm_restart_count = j.value("slurm_restart_count", int64_t{0});
    h.since = j.value("since", 0.0);
    return h;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string describe(const Holder& h) {
  std::string text = str_format("host {}, pid {}", h.host, h.pid);
  if (!h.slurm_job_id.empty())
    text += str_format(", Slurm job {} (start {})", h.slurm_job_id, h.slurm_restart_count + 1);
  return text + ", since " + utc_text(h.since);
}

// A lock file as found.
struct Found {
  bool exists = false;
  std::string text;
  std::optional<Holder> holder;  // nullopt: not a record (empty, by hand, damaged)
  double heartbeat = 0;          // modification time, seconds since the epoch
  dev_t device = 0;
  ino_t inode = 0;
};

Found read_lock(const std::string& file) {
  Found found;
  // open() makes an NFS client ask the server for the attributes (close-to-open consistency);
  // a stat() of the path may answer from a cache up to a minute old.
  const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    MYRIAD_CHECK(errno == ENOENT, "cannot read the lock '{}': {}", file, std::strerror(errno));
    return found;
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    MYRIAD_THROW("cannot read the lock '{}': {}", file, std::strerror(error));
  }
  char buffer[4096];
  ssize_t n = 0;
  while (found.text.size() < (1u << 16) && (n = read(fd, buffer, sizeof buffer)) > 0)
    found.text.append(buffer, static_cast<size_t>(n));
  const int error = errno;
  close(fd);
  MYRIAD_CHECK(n >= 0, "cannot read the lock '{}': {}", file, std::strerror(error));
  found.exists = true;
  found.holder = from_record(found.text);
  found.heartbeat = static_cast<double>(info.st_mtim.tv_sec) + 1e-9 * info.st_mtim.tv_nsec;
  found.device = info.st_dev;
  found.inode = info.st_ino;
  return found;
}

// Why the lock's holder is gone for sure, or "" while it may still run.
std::string why_gone(const Found& found, const Holder& me) {
  const double age = unix_seconds() - found.heartbeat;
  const bool silent = age > RunLock::kStaleSeconds;
  if (!found.holder) {
    return silent ? str_format("it names no holder and has had no heartbeat for {:.0f} s", age)
                  : "";
  }
  const Holder& h = *found.holder;
  if (!h.slurm_job_id.empty() && h.slurm_job_id == me.slurm_job_id &&
      me.slurm_restart_count > h.slurm_restart_count) {
    return str_format("Slurm restarted job {} (start {} now)", h.slurm_job_id,
                      me.slurm_restart_count + 1);
  }
  if (h.same_process_space(me)) {
    const std::optional<uint64_t> start = process_start_ticks(static_cast<int>(h.pid));
    // A record written by hand may lack the start time: then any process of that pid counts.
    const bool runs = start && (h.pid_start == 0 || *start == h.pid_start);
    return runs ? "" : str_format("process {} no longer runs", h.pid);
  }
  return silent ? str_format("no heartbeat for {:.0f} s", age) : "";
}

std::string refusal(const std::string& directory, const std::string& what, const Found& found) {
  const double age = std::max(0.0, unix_seconds() - found.heartbeat);
  const std::string holder =
      found.holder ? describe(*found.holder) : "a lock file that names no holder";
  return str_format(
      "the {} '{}' is in use by another job ({}; last heartbeat {:.0f} s ago): stop that job or "
      "wait for its end; once it is gone, its lock '{}/{}' is taken over by itself",
      what, directory, holder, age, directory, RunLock::kFileName);
}

// Renames the stale lock `found` out of the way. Two starters may both find it stale: the rename
// moves whatever is at `file`, and a lock put there since by the other starter (another inode)
// is put back. True when the stale one was removed.
bool remove_stale(const std::string& file, const Found& found, const std::string& moved) {
  if (std::rename(file.c_str(), moved.c_str()) != 0) {
    MYRIAD_CHECK(errno == ENOENT, "cannot move the stale lock '{}' away: {}", file,
                 std::strerror(errno));
    return false;
  }
  struct stat info {};
  const bool stale =
      stat(moved.c_str(), &info) == 0 && info.st_dev == found.device && info.st_ino == found.inode;
  // A third starter may have linked its own in the moment between: then the other's is lost,
  // and it stops at its next heartbeat.
  if (!stale && link(moved.c_str(), file.c_str()) != 0 && errno != EEXIST)
    log_warn("cannot put the lock '{}' back: {}", file, std::strerror(errno));
  unlink(moved.c_str());
  return stale;
}

void set_heartbeat(const std::string& file) {
  // The writer's clock, as readers on other hosts compare it with theirs (not the file server's).
  timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[1] = times[0];
  MYRIAD_CHECK(utimensat(AT_FDCWD, file.c_str(), times, 0) == 0, "cannot refresh the lock '{}': {}",
               file, std::strerror(errno));
}

// The path with symbolic links resolved as far as it exists.
fs::path resolved(const std::string& path) {
  std::error_code error;
  const fs::path canonical = fs::weakly_canonical(path, error);
  return error ? fs::absolute(path, error).lexically_normal() : canonical;
}

bool inside(const std::string& directory, const std::string& parent) {
  const fs::path relative = resolved(directory).lexically_relative(resolved(parent));
  return !relative.empty() && *relative.begin() != "..";
}

}  // namespace

RunLock::RunLock(const std::string& run_dir, const std::string& checkpoint_dir) {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  host_ = name;
  const Holder me = this_process(host_);
  record_ = to_record(me);
  held_.push_back({run_dir, (fs::path(run_dir) / kFileName).string()});
  const bool apart = !inside(checkpoint_dir, run_dir);
  if (apart) held_.push_back({checkpoint_dir, (fs::path(checkpoint_dir) / kFileName).string()});
  try {
    acquire(held_[0], "run directory");
    if (apart) acquire(held_[1], "checkpoint directory");
  } catch (...) {
    release();
    throw;
  }
  thread_ = std::thread([this] { heartbeat(); });
}

RunLock::~RunLock() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  release();
}

bool RunLock::place(const std::string& file) const {
  const std::string temporary = str_format("{}.{}.{}.new", file, host_, getpid());
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MYRIAD_CHECK(fd >= 0, "cannot create '{}': {}", temporary, std::strerror(errno));
  const bool written =
      write(fd, record_.data(), record_.size()) == static_cast<ssize_t>(record_.size()) &&
      fsync(fd) == 0;
  const int error = errno;
  close(fd);
  if (!written) {
    unlink(temporary.c_str());
    MYRIAD_THROW("cannot write '{}': {}", temporary, std::strerror(error));
  }
  // link() fails if `file` exists: the exclusive create, which NFS does atomically on the server.
  // A retransmitted NFS link may report EEXIST although it succeeded: two links then tell.
  bool linked = link(temporary.c_str(), file.c_str()) == 0;
  const int link_error = errno;
  struct stat info {};
  if (!linked && stat(temporary.c_str(), &info) == 0 && info.st_nlink == 2) linked = true;
  unlink(temporary.c_str());
  MYRIAD_CHECK(linked || link_error == EEXIST, "cannot create the lock '{}': {}", file,
               std::strerror(link_error));
  return linked;
}

void RunLock::acquire(Held& held, const std::string& what) {
  std::error_code error;
  held.created = fs::create_directories(held.directory, error);
  MYRIAD_CHECK(!error, "cannot create the {} '{}': {}", what, held.directory, error.message());
  const Holder me = *from_record(record_);
  const std::string moved = str_format("{}.{}.{}.stale", held.file, host_, getpid());
  std::string taken_over;
  // A lock in place is looked at before anything is written, so that a refused start changes
  // nothing. Each round then takes the lock, is refused, or moves a stale lock away; jobs starting
  // at the same moment can make a round fail only a few times.
  for (int round = 0;; ++round) {
    const Found found = read_lock(held.file);
    if (found.exists) {
      const std::string gone = why_gone(found, me);
      MYRIAD_CHECK(!gone.empty(), "{}", refusal(held.directory, what, found));
      MYRIAD_CHECK(round < 8, "cannot take over the stale lock '{}': other jobs keep taking it",
                   held.file);
      if (remove_stale(held.file, found, moved)) {
        taken_over = str_format("took over the lock '{}' of a job that is gone ({}): {}", held.file,
                                found.holder ? describe(*found.holder) : "no holder named", gone);
      }
    } else if (place(held.file)) {
      held.locked = true;
      if (!taken_over.empty()) log_warn("{}", taken_over);
      sync_path(held.directory);
      return;
    }
  }
}

void RunLock::heartbeat() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::seconds(kHeartbeatSeconds),
                         [this] { return stopping_; })) {
    for (const Held& held : held_) {
      if (held.locked) refresh(held);
    }
  }
}

void RunLock::refresh(const Held& held) {
  try {
    Found found = read_lock(held.file);
    if (!found.exists) {
      // Removed by hand, or moved aside for a moment by a starter checking whether it is stale.
      if (place(held.file)) {
        log_warn("the lock '{}' was removed while this job held it; placed again", held.file);
        return;
      }
      found = read_lock(held.file);
    }
    if (found.text == record_) {
      set_heartbeat(held.file);
      return;
    }
    if (!found.exists) return;  // gone again: the next heartbeat tells
    log_error(
        "lost the lock '{}' to another job ({}): stopping at once, so that two jobs never write "
        "one run",
        held.file, found.holder ? describe(*found.holder) : "no holder named");
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(kExitFailure);
  } catch (const Error& e) {
    // A file server that does not answer for a while: the next heartbeat tries again.
    log_warn("{}", e.message());
  }
}

void RunLock::release() {
  for (auto held = held_.rbegin(); held != held_.rend(); ++held) {
    if (held->locked) {
      try {
        // Only ours: a lock another job took over stays its own.
        if (read_lock(held->file).text == record_) unlink(held->file.c_str());
      } catch (const Error& e) {
        log_warn("{}", e.message());
      }
      held->locked = false;
    }
    if (held->created) rmdir(held->directory.c_str());  // fails, as meant, unless still empty
  }
}

}  // namespace myriad
