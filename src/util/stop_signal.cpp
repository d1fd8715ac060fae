#include "myriad/util/stop_signal.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include "myriad/util/clock.h"
#include "myriad/util/process_info.h"

namespace myriad {

namespace {

volatile std::sig_atomic_t received = 0;

extern "C" void on_stop_signal(int signal) {
  if (received == 0) received = signal;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This process's start, in seconds since the epoch: its start in clock ticks since boot, and
// /proc/stat's btime is the boot.
double process_start() {
  const std::optional<uint64_t> ticks = process_start_ticks(static_cast<int>(getpid()));
  std::ifstream boot("/proc/stat");
  std::string key;
  long long btime = 0;
  while (boot >> key) {
    if (key == "btime") {
      boot >> btime;
      break;
    }
  }
  if (!ticks || *ticks == 0 || btime == 0) {
    return unix_seconds();
  }
  return static_cast<double>(btime) + static_cast<double>(*ticks) / sysconf(_SC_CLK_TCK);
}

}  // namespace

std::vector<std::string> install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // Slow system calls (MPI, file I/O) continue rather than fail with EINTR.
  action.sa_flags = SA_RESTART;
  sigset_t ours;
  sigemptyset(&ours);
  std::vector<std::string> replaced;
  for (int signal : {SIGTERM, SIGUSR1, SIGINT}) {
    struct sigaction previous {};
    sigaction(signal, &action, &previous);
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN &&
        previous.sa_handler != on_stop_signal) {
      replaced.push_back(strsignal(signal));
    }
    sigaddset(&ours, signal);
  }
  // A launcher may have blocked them; threads started later inherit this thread's mask.
  pthread_sigmask(SIG_UNBLOCK, &ours, nullptr);
  return replaced;
}

bool stop_requested() {
  return received != 0;
}

std::string stop_signal_name() {
  switch (received) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    default:
      return received == 0 ? "" : "signal " + std::to_string(received);
  }
}

StopFile::StopFile(std::string path, double since) : path_(std::move(path)), since_(since) {}

namespace {

// The file's modification time in seconds since the epoch; negative when it does not exist.
double modified(const std::string& path) {
  struct stat info {};
  if (path.empty() || ::stat(path.c_str(), &info) != 0) return -1.0;
  return static_cast<double>(info.st_mtim.tv_sec) +
         static_cast<double>(info.st_mtim.tv_nsec) * 1e-9;
}

}  // namespace

bool StopFile::requested() {
  if (requested_) return true;
  const double now = steady_seconds();
  if (now < next_check_) return false;
  next_check_ = now + 1.0;
  requested_ = modified(path_) >= since_;
  return requested_;
}

bool StopFile::clear_if_stale() const {
  const double time = modified(path_);
  if (time < 0 || time >= since_) return false;
  clear();
  return true;
}

void StopFile::clear() const {
  if (!path_.empty()) std::remove(path_.c_str());
}

StopFile default_stop_file(const std::string& run_dir) {
  const char* path = std::getenv("MYRIAD_STOP_FILE");
  const char* since = std::getenv("MYRIAD_STOP_SINCE");
  return StopFile(
      path != nullptr && *path != '\0' ? std::string(path) : run_dir + "/STOP",
      since != nullptr && *since != '\0' ? std::strtod(since, nullptr) : process_start());
}

}  // namespace myriad
