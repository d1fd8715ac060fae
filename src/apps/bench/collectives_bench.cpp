// myriad-bench collectives: bandwidth of each collective through myriad's Communicator, reported
// the way nccl-tests reports it (algbw = bytes / time; busbw scales algbw by the fraction of the
// data each rank must move, so that it compares with the link bandwidth).

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "bench_common.h"
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

// The command line.
struct CollectivesOptions {
  std::string backend, checks;
  int64_t min_bytes = 0, max_bytes = 0;
  int factor = 2, iters = 20, warmup = 5;
  torch::ScalarType dtype = torch::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::vector<CollectiveInfo> collectives;
};

// `argv` into `o`, checked; false where it asked for help only.
bool parse_collectives_options(const ProcessContext& context, int argc, char** argv,
                               CollectivesOptions& o) {
  po::options_description options("collectives options");
  std::string min_size, max_size, dtype_name, op_name, which;
  // clang-format off
  options.add_options()
      ("backend", po::value(&o.backend)->default_value("mpi"), "mpi (CPU tensors) or nccl (CUDA tensors)")
      ("min-bytes", po::value(&min_size)->default_value("8"), "smallest message (e.g. 8, 64K, 1M)")
      ("max-bytes", po::value(&max_size)->default_value("64M"), "largest message")
      ("factor", po::value(&o.factor)->default_value(2), "message size multiplier between rows")
      ("iters", po::value(&o.iters)->default_value(20), "timed iterations per row")
      ("warmup", po::value(&o.warmup)->default_value(5), "untimed iterations per row")
      ("dtype", po::value(&dtype_name)->default_value("float32"), "float32, bfloat16, float16, float64, int64, int32")
      ("op", po::value(&op_name)->default_value("sum"), "reduction: sum, max or min")
      ("collectives", po::value(&which)->default_value("all"), "comma list: all, all_reduce, all_gather, reduce_scatter, broadcast")
      ("checks", po::value(&o.checks)->default_value("on"), "on: myriad's cross-rank argument agreement runs before each call, as in training; off: raw " "backend");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: mpirun -np N myriad-bench collectives [options]",
                          context.rank())) {
    return false;
  }
  if (o.backend != "mpi" && o.backend != "nccl") throw UsageError("--backend must be mpi or nccl");
  if (o.checks != "on" && o.checks != "off") throw UsageError("--checks must be on or off");
  if (o.factor < 2 || o.iters < 1 || o.warmup < 0)
    throw UsageError("--factor must be >= 2, --iters >= 1, --warmup >= 0");
  o.min_bytes = parse_byte_size(min_size);
  o.max_bytes = parse_byte_size(max_size);
  if (o.min_bytes <= 0 || o.max_bytes < o.min_bytes)
    throw UsageError("need 0 < --min-bytes <= --max-bytes");
  o.dtype = parse_dtype(dtype_name);
  o.op = parse_op(op_name);
  o.collectives = parse_collectives(which);
  return true;
}

void print_header(const CollectivesOptions& o, const Communicator& comm) {
  std::printf(
      "# myriad-bench collectives: backend %s, %d ranks, dtype %s, op %s, checks %s, %d iters\n",
      comm.backend(), comm.size(), c10::toString(o.dtype), reduce_op_name(o.op), o.checks.c_str(),
      o.iters);
  std::printf("# time: per call, min/avg/max over ranks; algbw and busbw from the slowest rank\n");
  std::printf("%-15s %12s %12s %9s %6s %10s %10s %10s %11s %11s %7s\n", "# collective", "size(B)",
              "count", "type", "redop", "min(us)", "avg(us)", "max(us)", "algbw(GB/s)",
              "busbw(GB/s)", "#wrong");
}

// One row of the table: a collective at one message size, over all ranks.
struct Row {
  int64_t bytes = 0;
  int64_t count = 0;
  double bus_factor = 1.0;
  int64_t wrong = 0;  // elements, on all ranks together
  RankSpread us;      // per call
};

// Collective: checks the result of one call, then times the calls after the warmup. Nothing for a
// message too small to give each rank an element.
std::optional<Row> measure_row(const ProcessContext& context, Communicator& comm,
                               const torch::Device& device, const CollectivesOptions& o,
                               Collective kind, int64_t bytes) {
  const Case c = make_case(kind, bytes, o.dtype, o.op, comm, device);
  if (c.count == 0) return std::nullopt;
  Row row;
  row.bytes = c.bytes;
  row.count = c.count;
  row.bus_factor = c.bus_factor;
  torch::Tensor work = c.input.clone();
  const torch::Tensor result = run_once(kind, comm, work, o.op);
  row.wrong = result.ne(c.expected).sum().item<int64_t>();
  MYRIAD_CHECK_MPI(
      MPI_Allreduce(MPI_IN_PLACE, &row.wrong, 1, MPI_INT64_T, MPI_SUM, context.world()));
  for (int i = 0; i < o.warmup; ++i) run_once(kind, comm, work, o.op);
  const double seconds =
      seconds_per_call(context, device, o.iters, [&] { run_once(kind, comm, work, o.op); });
  row.us = spread_over_ranks(seconds * 1e6, context);
  return row;
}

void print_row(const CollectivesOptions& o, const CollectiveInfo& collective, const Row& row) {
  const RankSpread& t = row.us;
  const double algbw = static_cast<double>(row.bytes) / (t.max * 1e-6) / 1e9;
  std::printf("%-15s %12lld %12lld %9s %6s %10.1f %10.1f %10.1f %11.2f %11.2f %7lld\n",
              collective.name, static_cast<long long>(row.bytes), static_cast<long long>(row.count),
              c10::toString(o.dtype), collective.reduces ? reduce_op_name(o.op) : "-", t.min, t.avg,
              t.max, algbw, algbw * row.bus_factor, static_cast<long long>(row.wrong));
  std::fflush(stdout);
}

}  // namespace

int run_collectives_bench(ProcessContext& context, int argc, char** argv) {
  CollectivesOptions o;
  if (!parse_collectives_options(context, argc, argv, o)) return kExitOk;
  if (o.checks == "off") setenv("MYRIAD_COMM_CHECKS", "0", 1);
  const torch::Device device =
      context.select_device(o.backend == "nccl" ? DevicePreference::kCuda : DevicePreference::kCpu);
  CommFactory comms(context);
  Communicator& comm = comms.for_device(device);
  if (context.rank() == 0) print_header(o, comm);
  int64_t total_wrong = 0;
  for (const CollectiveInfo& collective : o.collectives) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
      const std::optional<Row> row = measure_row(context, comm, device, o, collective.kind, bytes);
      if (!row) continue;
      total_wrong += row->wrong;
      if (context.rank() == 0) print_row(o, collective, *row);
    }
  }
  if (context.rank() == 0) {
    std::printf("# %s: %lld wrong elements in total\n", total_wrong == 0 ? "OK" : "FAILED",
                static_cast<long long>(total_wrong));
  }
  return total_wrong == 0 ? kExitOk : kExitFailure;
}

}  // namespace myriad
