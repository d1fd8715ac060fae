#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace myriad {

// Crash testing: a rank whose $MYRIAD_FAULT_KILL_AT names `phase` ("write") or `phase@step`
// ("write@8") sends itself SIGKILL when it gets there, after one line on stderr, as a node that
// dies at that moment would. Tests use it to prove that no moment of a checkpoint loses the
// previous one (tests/e2e/async_checkpoint.sh).
void fault_point(const std::string& phase, int64_t step);

// Memory testing: $MYRIAD_FAULT_GRAPH_MEMORY_FRACTION (a number in (0, 1]) is the fraction of the
// device's memory that this process's CUDA allocator may hold while CUDA graphs record
// (StageGraphs), so that a test makes the recording run out of memory where eager steps fit.
std::optional<double> fault_graph_memory_fraction();

// Straggler testing: $MYRIAD_FAULT_SLOW_RANK="rank:seconds" ("2:0.2") makes that rank sleep so
// long in each step, as a slow GPU would compute (tests/e2e/straggler_report.sh). Malformed values
// are an Error. Every other rank returns at once.
void fault_slow_step(int rank);

// Hang testing: $MYRIAD_FAULT_STALL_AT="rank:phase@n" ("1:backward@30") stops that rank (SIGSTOP,
// after one line on stderr) the n-th time it reaches `phase` (counted from 1), as a host that
// stops at a known moment would: its peers' GPUs then wait in a collective that it never enqueues
// (tests/e2e/cuda_graphs_gpu.sh). Malformed values are an Error. Every other rank returns at once.
void fault_stall(const char* phase, int rank);

// Device testing: $MYRIAD_FAULT_HOST_GPUS=N makes this rank report N GPUs of its host (named
// "fault-gpu-HOST-i") when the ranks agree which GPU each drives, so that a test without GPUs can
// start more ranks than a host has GPUs (tests/mpi, tests/e2e/doctor.sh). Malformed values are an
// Error; unset, nullopt.
std::optional<int> fault_host_gpus();

}  // namespace myriad
