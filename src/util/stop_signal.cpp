#include "myriad/util/stop_signal.h"

#include <pthread.h>

#include <csignal>
#include <cstring>

namespace myriad {

namespace {

volatile std::sig_atomic_t received = 0;

extern "C" void on_stop_signal(int signal) {
  received = signal;
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

}  // namespace myriad
