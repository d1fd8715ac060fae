#pragma once

// What the myriad-bench commands share: clocks that time device work and a value's spread over
// the ranks.

#include <torch/types.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>

#include "myriad/comm/process_context.h"
#include "myriad/model/roofline.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"

namespace myriad {

// A value measured on each rank: its least, mean and largest over all ranks.
struct RankSpread {
  double min = 0, avg = 0, max = 0;
};

// Collective: every rank must call it, in the same order as the others.
RankSpread spread_over_ranks(double value, const ProcessContext& context);

// Whether `e` is an allocator's refusal: CUDA's out of memory, or the CPU allocator's.
bool is_out_of_memory(const std::exception& e);

// Runs `work` on every rank (collective). Where an allocation fails on any rank, every rank ends
// with one error line that names `what` and the `remedy`, instead of the job ending in one rank's
// MPI_Abort.
void fits_on_every_rank(const ProcessContext& context, const std::string& what,
                        const std::string& remedy, const std::function<void()>& work);

// What this device can do at best: the matrix-product rate in `gemm_dtype` and the bandwidth of
// a large copy. Measured before the benchmarked work takes its memory; the cached memory is then
// released and the peak reset.
Ceilings measure_ceilings(const torch::Device& device, torch::ScalarType gemm_dtype);

namespace bench_detail {

struct Nothing {
  void operator()() const {}
};

// The clock starts with the device idle (and, given `context`, all ranks at one barrier), so that
// neither earlier work nor a late rank is counted.
template <class Work, class Issued>
double seconds_of(const torch::Device& device, const ProcessContext* context, int reps, Work& work,
                  Issued& issued) {
  synchronize_device(device);
  if (context != nullptr) MYRIAD_CHECK_MPI(MPI_Barrier(context->world()));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) work();
  issued();
  synchronize_device(device);
  return seconds_since(start);
}

}  // namespace bench_detail

// Seconds that `reps` calls of `work`, issued back to back, take until this rank's device has
// finished them. `issued` runs once the last call is issued, before the wait: a device timer's
// end event belongs there, not after the device has gone idle.
template <class Work, class Issued = bench_detail::Nothing>
double device_seconds(const torch::Device& device, int reps, Work work, Issued issued = {}) {
  return bench_detail::seconds_of(device, nullptr, reps, work, issued);
}

// Seconds per call of `reps` calls of `work` issued back to back, as training issues its steps,
// from a start common to all ranks (collective) until this rank's device has finished them.
template <class Work, class Issued = bench_detail::Nothing>
double seconds_per_call(const ProcessContext& context, const torch::Device& device, int reps,
                        Work work, Issued issued = {}) {
  return bench_detail::seconds_of(device, &context, reps, work, issued) / reps;
}

// Wall time of `work` on all ranks (collective): from a common start to the last rank's end.
template <class Work>
double timed_collectively(const ProcessContext& context, Work work) {
  MYRIAD_CHECK_MPI(MPI_Barrier(context.world()));
  const auto start = std::chrono::steady_clock::now();
  work();
  MYRIAD_CHECK_MPI(MPI_Barrier(context.world()));
  return seconds_since(start);
}

}  // namespace myriad
