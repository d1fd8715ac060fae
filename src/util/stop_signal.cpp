#include "myriad/util/stop_signal.h"

#include <csignal>

namespace myriad {

namespace {

volatile std::sig_atomic_t received = 0;

extern "C" void on_stop_signal(int signal) {
  received = signal;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // Slow system calls (MPI, file I/O) continue rather than fail with EINTR.
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGTERM, SIGUSR1, SIGINT}) sigaction(signal, &action, nullptr);
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
