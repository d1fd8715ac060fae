#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace myriad {

// Runs fn(i) for every i in [0, n) on `workers` threads, in no particular order. The first
// exception stops the remaining work and is rethrown, unchanged, on the calling thread.
template <class Fn>
void parallel_for(int64_t n, int workers, Fn fn) {
  std::atomic<int64_t> next{0};
  std::mutex mutex;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (int64_t i = next++; i < n; i = next++) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mutex);
          if (!error) error = std::current_exception();
          next = n;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace myriad
