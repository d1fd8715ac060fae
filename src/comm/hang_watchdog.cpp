#include "myriad/comm/hang_watchdog.h"

#include <mpi.h>

#include <errno.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// After the line: time for the ranks stuck in the same collective to print theirs, and then for
// MPI_Abort to end the job before this rank exits on its own.
constexpr double kPeerGraceSeconds = 3.0;
constexpr double kAbortGraceSeconds = 10.0;

}  // namespace

struct HangWatchdog::State {
  std::mutex mutex;  // the monitor thread's start and stop, and the abort hooks
  std::condition_variable wake;
  std::thread monitor;
  bool stopping = false;
  std::atomic<bool> running{false};
  std::atomic<double> timeout{0.0};

  // The wait clock: the outermost WaitScope open now (SERIALIZED MPI: one thread at a time).
  std::atomic<int> wait_depth{0};
  std::atomic<int64_t> wait_since{0};
  std::atomic<const char*> wait_what{nullptr};
  std::atomic<const char*> wait_detail{nullptr};
  std::atomic<int> wait_ranks{0};
  // Nanoseconds spent in outermost scopes that have ended, for the straggler report.
  std::atomic<int64_t> waited_ns{0};
  // The last wait entered, for a step that hangs outside any scope (a device synchronisation).
  std::atomic<int64_t> last_wait_at{0};

  // The step clock; 0 when not armed.
  std::atomic<int64_t> step{-1};
  std::atomic<int64_t> steps_seen{0};
  std::atomic<int64_t> step_since{0};
  std::atomic<int> local_depth{0};
  std::atomic<const char*> local_what{nullptr};

  struct Hooks {
    std::function<void()> abort;
    std::function<std::string()> describe;
  };
  std::map<int, Hooks> hooks;
  int next_abort_id = 0;

  void run();
  [[noreturn]] void fire(const std::string& where, double seconds);
  std::string device_progress() const;
};

HangWatchdog::HangWatchdog() : state_(new State) {}

// Never destroyed: scopes in static destructors and the monitor may still touch it at exit.
HangWatchdog::~HangWatchdog() = default;

HangWatchdog& HangWatchdog::instance() {
  static HangWatchdog* watchdog = new HangWatchdog();
  return *watchdog;
}

void HangWatchdog::start(double timeout_seconds) {
  MYRIAD_CHECK(timeout_seconds >= 0, "the hang timeout must not be negative, got {}",
               timeout_seconds);
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->running.load()) {
    MYRIAD_CHECK(state_->timeout.load() == timeout_seconds,
                 "the hang watchdog already runs with another timeout");
    return;
  }
  if (timeout_seconds == 0) return;
  state_->timeout = timeout_seconds;
  state_->stopping = false;
  state_->steps_seen = 0;
  state_->step_since = 0;
  state_->running = true;
  state_->monitor = std::thread([s = state_] { s->run(); });
}

void HangWatchdog::stop() {
  std::thread monitor;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->running.load()) return;
    state_->stopping = true;
    state_->running = false;
    monitor = std::move(state_->monitor);
  }
  state_->wake.notify_all();
  monitor.join();
}

WatchdogSession::WatchdogSession(double timeout_seconds) {
  HangWatchdog::instance().start(timeout_seconds);
}

WatchdogSession::~WatchdogSession() {
  HangWatchdog::instance().stop();
}

bool HangWatchdog::running() const {
  return state_->running.load();
}

double HangWatchdog::timeout_seconds() const {
  return state_->timeout.load();
}

double HangWatchdog::waited_seconds() const {
  return state_->waited_ns.load(std::memory_order_relaxed) / 1e9;
}

void HangWatchdog::step_started(int64_t step) {
  state_->step.store(step, std::memory_order_relaxed);
  // The first step of a start (cuDNN's search, lazy initialisation) is not timed.
  if (state_->steps_seen.fetch_add(1, std::memory_order_relaxed) > 0)
    state_->step_since.store(now_ns(), std::memory_order_relaxed);
}

int HangWatchdog::register_abort(std::function<void()> abort,
                                 std::function<std::string()> describe) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const int id = state_->next_abort_id++;
  state_->hooks[id] = {std::move(abort), std::move(describe)};
  return id;
}

void HangWatchdog::unregister_abort(int id) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->hooks.erase(id);
}

void HangWatchdog::State::run() {
  std::unique_lock<std::mutex> lock(mutex);
  const double period = std::min(1.0, timeout.load() / 4);
  while (!wake.wait_for(lock, std::chrono::duration<double>(period), [this] { return stopping; })) {
    const int64_t now = now_ns();
    const bool waiting = wait_depth.load(std::memory_order_acquire) > 0;
    const double waited = waiting ? (now - wait_since.load()) / 1e9 : 0.0;
    const int64_t since = step_since.load(std::memory_order_relaxed);
    const bool step_timed = since != 0 && local_depth.load(std::memory_order_acquire) == 0;
    const double stalled = step_timed ? (now - since) / 1e9 : 0.0;
    if (std::max(waited, stalled) <= timeout.load()) continue;
    // Whichever clock ran out, the collective a rank is blocked in is what the user must see.
    std::string where;
    if (waiting) {
      const char* during = local_depth.load() > 0 ? local_what.load() : nullptr;
      where =
          str_format("waiting in {} ({}, {} ranks){}", wait_what.load(), wait_detail.load(),
                     wait_ranks.load(), during != nullptr ? str_format(" during {}", during) : "");
    } else if (last_wait_at.load() != 0) {
      where = str_format("in the step (the last collective it entered: {} ({}), {:.0f} s ago)",
                         wait_what.load(), wait_detail.load(), (now - last_wait_at.load()) / 1e9);
    } else {
      where = "in the step, outside any collective";
    }
    fire(where, std::max(waited, stalled));
  }
}

void HangWatchdog::State::fire(const std::string& where, double seconds) {
  const int64_t at = step.load();
  // The backstop first: what follows (the device's progress, ncclCommAbort, MPI_Abort) calls into
  // CUDA, NCCL and MPI, any of which may never return on a wedged GPU or where this host cannot
  // reach the launcher.
  std::thread([] {
    std::this_thread::sleep_for(
        std::chrono::duration<double>(kPeerGraceSeconds + kAbortGraceSeconds));
    std::_Exit(kExitFailure);
  }).detach();
  log_write_this_rank(
      LogLevel::kError,
      str_format("{}: error: no progress for {:.0f} s {}{}{}; aborting the job (--hang-timeout "
                 "{:g}; a dead host, a cut link or a hung GPU: see docs/multi-node.md) [{}]",
                 program_invocation_short_name, seconds, where,
                 at >= 0 ? str_format(" at step {}", at + 1) : std::string(), device_progress(),
                 timeout.load(), error_location(__FILE__, __LINE__)));
  std::fflush(nullptr);
  std::this_thread::sleep_for(std::chrono::duration<double>(kPeerGraceSeconds));
  for (auto& [id, hook] : hooks) hook.abort();
  MPI_Abort(MPI_COMM_WORLD, kExitFailure);
  std::_Exit(kExitFailure);
}

// What the GPU has not finished, from the hooks: the host's view may be a later collective, or a
// device synchronisation that waits for it (replayed CUDA graphs enqueue many at once). A hook
// that fails leaves its part out: the line and the abort matter more.
std::string HangWatchdog::State::device_progress() const {
  std::string device;
  for (const auto& [id, hook] : hooks) {
    try {
      const std::string text = hook.describe ? hook.describe() : std::string();
      if (!text.empty()) device += "; " + text;
    } catch (...) {
    }
  }
  return device;
}

WaitScope::WaitScope(const char* what, const char* detail, int ranks) {
  HangWatchdog::State& s = *HangWatchdog::instance().state_;
  outermost_ = s.wait_depth.load(std::memory_order_relaxed) == 0;
  if (outermost_) {
    const int64_t now = now_ns();
    s.wait_what.store(what, std::memory_order_relaxed);
    s.wait_detail.store(detail, std::memory_order_relaxed);
    s.wait_ranks.store(ranks, std::memory_order_relaxed);
    s.wait_since.store(now, std::memory_order_relaxed);
    s.last_wait_at.store(now, std::memory_order_relaxed);
  }
  s.wait_depth.fetch_add(1, std::memory_order_release);
}

WaitScope::~WaitScope() {
  HangWatchdog::State& s = *HangWatchdog::instance().state_;
  if (outermost_) {
    s.waited_ns.fetch_add(now_ns() - s.wait_since.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
  }
  s.wait_depth.fetch_sub(1, std::memory_order_release);
}

LocalWork::LocalWork(const char* what) {
  HangWatchdog::State& s = *HangWatchdog::instance().state_;
  s.local_what.store(what, std::memory_order_relaxed);
  s.local_depth.fetch_add(1, std::memory_order_release);
}

LocalWork::~LocalWork() {
  HangWatchdog::State& s = *HangWatchdog::instance().state_;
  // The step clock starts afresh: the work's time is not the next step's.
  if (s.local_depth.fetch_sub(1, std::memory_order_release) == 1 &&
      s.step_since.load(std::memory_order_relaxed) != 0)
    s.step_since.store(now_ns(), std::memory_order_relaxed);
}

}  // namespace myriad
