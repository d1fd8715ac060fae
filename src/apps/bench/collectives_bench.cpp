// myriad-bench collectives: bandwidth of each collective through myriad's Communicator, reported
// the way nccl-tests reports it (algbw = bytes / time; busbw scales algbw by the fraction of the
// data each rank must move, so that it compares with the link bandwidth).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"
#include "myriad/train/step_model.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/cli.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast };

struct CollectiveInfo {
  Collective kind;
  const char* name;
  bool reduces;
};

const CollectiveInfo kCollectives[] = {
    {Collective::kAllReduce, "all_reduce", true},
    {Collective::kAllGather, "all_gather", false},
    {Collective::kReduceScatter, "reduce_scatter", true},
    {Collective::kBroadcast, "broadcast", false},
};

torch::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return torch::kFloat32;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  if (name == "float16" || name == "fp16") return torch::kFloat16;
  if (name == "float64" || name == "fp64") return torch::kFloat64;
  if (name == "int64") return torch::kInt64;
  if (name == "int32") return torch::kInt32;
  throw UsageError(
      str_format("unknown dtype '{}' (float32, bfloat16, float16, float64, int64, int32)", name));
}

ReduceOp parse_op(const std::string& name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "max") return ReduceOp::kMax;
  if (name == "min") return ReduceOp::kMin;
  throw UsageError(str_format("unknown reduction '{}' (sum, max, min)", name));
}

std::vector<CollectiveInfo> parse_collectives(const std::string& list) {
  std::vector<CollectiveInfo> chosen;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    bool found = false;
    for (const CollectiveInfo& c : kCollectives) {
      if (item == c.name || item == "all") {
        chosen.push_back(c);
        found = true;
      }
    }
    if (!found) {
      throw UsageError(str_format(
          "unknown collective '{}' (all, all_reduce, all_gather, reduce_scatter, broadcast)",
          item));
    }
  }
  return chosen;
}

// Small integers, exact in every dtype after summing over up to 16 ranks. Built on the device:
// gigabyte messages would take longer to build and check on the host than to move.
torch::Tensor pattern(int64_t count, int64_t offset, int64_t scale, torch::ScalarType dtype,
                      const torch::Device& device) {
  torch::Tensor v =
      torch::arange(offset, offset + count, torch::dtype(torch::kInt64).device(device));
  return v.remainder_(7).add_(1).mul_(scale).to(dtype);
}

struct Case {
  torch::Tensor input;     // what this rank passes
  torch::Tensor expected;  // what it must get back
  int64_t bytes = 0;       // nccl-tests' "size"
  int64_t count = 0;       // nccl-tests' "count"
  double bus_factor = 1.0;
};

Case make_case(Collective kind, int64_t bytes, torch::ScalarType dtype, ReduceOp op,
               const Communicator& comm, const torch::Device& device) {
  const int64_t world = comm.size();
  const int64_t rank = comm.rank();
  const int64_t element = torch::elementSize(dtype);
  const int64_t sum_of_scales = world * (world + 1) / 2;
  const int64_t reduced_scale = op == ReduceOp::kSum   ? sum_of_scales
                                : op == ReduceOp::kMax ? world
                                                       : 1;
  Case c;
  switch (kind) {
    case Collective::kAllReduce:
      c.count = bytes / element;
      c.input = pattern(c.count, 0, rank + 1, dtype, device);
      c.expected = pattern(c.count, 0, reduced_scale, dtype, device);
      c.bus_factor = all_reduce_bus_factor(world);
      break;
    case Collective::kAllGather: {
      const int64_t per_rank = bytes / element / world;
      c.count = per_rank * world;
      c.input = pattern(per_rank, rank * per_rank, rank + 1, dtype, device);
      std::vector<torch::Tensor> blocks;
      for (int64_t r = 0; r < world; ++r)
        blocks.push_back(pattern(per_rank, r * per_rank, r + 1, dtype, device));
      c.expected = torch::cat(blocks);
      c.bus_factor = all_gather_bus_factor(world);
      break;
    }
    case Collective::kReduceScatter: {
      const int64_t per_rank = bytes / element / world;
      c.count = per_rank * world;
      c.input = pattern(c.count, 0, rank + 1, dtype, device);
      c.expected = pattern(per_rank, rank * per_rank, reduced_scale, dtype, device);
      c.bus_factor = all_gather_bus_factor(world);
      break;
    }
    case Collective::kBroadcast:
      c.count = bytes / element;
      c.input = pattern(c.count, 0, 1, dtype, device);
      if (rank != 0) c.input.zero_();
      c.expected = pattern(c.count, 0, 1, dtype, device);
      c.bus_factor = 1.0;
      break;
  }
  c.bytes = c.count * element;
  return c;
}

torch::Tensor run_once(Collective kind, Communicator& comm, torch::Tensor& tensor, ReduceOp op) {
  switch (kind) {
    case Collective::kAllReduce:
      comm.all_reduce(tensor, op);
      return tensor;
    case Collective::kAllGather:
      return comm.all_gather(tensor);
    case Collective::kReduceScatter:
      return comm.reduce_scatter(tensor, op);
    case Collective::kBroadcast:
      comm.broadcast(tensor, 0);
      return tensor;
  }
  return tensor;
}

struct RankSpread {
  double min = 0, avg = 0, max = 0;
};

RankSpread spread_over_ranks(double value, MPI_Comm comm, int world) {
  RankSpread s;
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.min, 1, MPI_DOUBLE, MPI_MIN, comm));
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.max, 1, MPI_DOUBLE, MPI_MAX, comm));
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.avg, 1, MPI_DOUBLE, MPI_SUM, comm));
  s.avg /= world;
  return s;
}

}  // namespace

int run_collectives_bench(ProcessContext& context, int argc, char** argv) {
  po::options_description options("collectives options");
  std::string backend, min_size, max_size, dtype_name, op_name, which, checks;
  int factor = 2, iters = 20, warmup = 5;
  // clang-format off
  options.add_options()
      ("backend", po::value(&backend)->default_value("mpi"), "mpi (CPU tensors) or nccl (CUDA tensors)")
      ("min-bytes", po::value(&min_size)->default_value("8"), "smallest message (e.g. 8, 64K, 1M)")
      ("max-bytes", po::value(&max_size)->default_value("64M"), "largest message")
      ("factor", po::value(&factor)->default_value(2), "message size multiplier between rows")
      ("iters", po::value(&iters)->default_value(20), "timed iterations per row")
      ("warmup", po::value(&warmup)->default_value(5), "untimed iterations per row")
      ("dtype", po::value(&dtype_name)->default_value("float32"), "float32, bfloat16, float16, float64, int64, int32")
      ("op", po::value(&op_name)->default_value("sum"), "reduction: sum, max or min")
      ("collectives", po::value(&which)->default_value("all"), "comma list: all, all_reduce, all_gather, reduce_scatter, broadcast")
      ("checks", po::value(&checks)->default_value("on"), "on: myriad's cross-rank argument agreement runs before each call, as in training; off: raw " "backend");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: mpirun -np N myriad-bench collectives [options]",
                          context.rank())) {
    return kExitOk;
  }
  if (backend != "mpi" && backend != "nccl") throw UsageError("--backend must be mpi or nccl");
  if (checks != "on" && checks != "off") throw UsageError("--checks must be on or off");
  if (factor < 2 || iters < 1 || warmup < 0)
    throw UsageError("--factor must be >= 2, --iters >= 1, --warmup >= 0");
  const int64_t min_bytes = parse_byte_size(min_size);
  const int64_t max_bytes = parse_byte_size(max_size);
  if (min_bytes <= 0 || max_bytes < min_bytes)
    throw UsageError("need 0 < --min-bytes <= --max-bytes");
  const torch::ScalarType dtype = parse_dtype(dtype_name);
  const ReduceOp op = parse_op(op_name);
  const std::vector<CollectiveInfo> collectives = parse_collectives(which);
  if (checks == "off") setenv("MYRIAD_COMM_CHECKS", "0", 1);

  const torch::Device device =
      context.select_device(backend == "nccl" ? DevicePreference::kCuda : DevicePreference::kCpu);
  CommFactory comms(context);
  Communicator& comm = comms.for_device(device);
  const int world = comm.size();

  if (context.rank() == 0) {
    std::printf(
        "# myriad-bench collectives: backend %s, %d ranks, dtype %s, op %s, checks %s, %d iters\n",
        comm.backend(), world, c10::toString(dtype), reduce_op_name(op), checks.c_str(), iters);
    std::printf(
        "# time: per call, min/avg/max over ranks; algbw and busbw from the slowest rank\n");
    std::printf("%-15s %12s %12s %9s %6s %10s %10s %10s %11s %11s %7s\n", "# collective", "size(B)",
                "count", "type", "redop", "min(us)", "avg(us)", "max(us)", "algbw(GB/s)",
                "busbw(GB/s)", "#wrong");
  }
  int64_t total_wrong = 0;
  for (const CollectiveInfo& collective : collectives) {
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
      Case c = make_case(collective.kind, bytes, dtype, op, comm, device);
      if (c.count == 0) continue;
      torch::Tensor work = c.input.clone();
      const torch::Tensor result = run_once(collective.kind, comm, work, op);
      int64_t wrong = result.ne(c.expected).sum().item<int64_t>();
      MYRIAD_CHECK_MPI(
          MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, context.world()));
      total_wrong += wrong;

      for (int i = 0; i < warmup; ++i) run_once(collective.kind, comm, work, op);
      synchronize_device(device);
      MYRIAD_CHECK_MPI(MPI_Barrier(context.world()));
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run_once(collective.kind, comm, work, op);
      synchronize_device(device);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count() /
          iters;
      const RankSpread t = spread_over_ranks(us, context.world(), world);
      if (context.rank() == 0) {
        const double algbw = static_cast<double>(c.bytes) / (t.max * 1e-6) / 1e9;
        std::printf("%-15s %12lld %12lld %9s %6s %10.1f %10.1f %10.1f %11.2f %11.2f %7lld\n",
                    collective.name, static_cast<long long>(c.bytes),
                    static_cast<long long>(c.count), c10::toString(dtype),
                    collective.reduces ? reduce_op_name(op) : "-", t.min, t.avg, t.max, algbw,
                    algbw * c.bus_factor, static_cast<long long>(wrong));
        std::fflush(stdout);
      }
    }
  }
  if (context.rank() == 0) {
    std::printf("# %s: %lld wrong elements in total\n", total_wrong == 0 ? "OK" : "FAILED",
                static_cast<long long>(total_wrong));
  }
  return total_wrong == 0 ? kExitOk : kExitFailure;
}

}  // namespace myriad
