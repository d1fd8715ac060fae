// myriad-bench classifier: speed and memory of one training step of the sharded classifier
// (forward, backward, SGD-momentum update of the shard), or of the naive baseline with --naive.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "bench_commands.h"
#include "bench_common.h"
#include "myriad/classifier/margin_config.h"
#include "myriad/classifier/naive_softmax.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"
#include "myriad/train/train_config.h"
#include "myriad/util/cli.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/format.h"
#include "myriad/util/phase_timer.h"

namespace myriad {

namespace {

// The least time a step can take on this device: its GEMMs at the measured peak, or the weights
// and optimizer state read and written once at the measured bandwidth (the forward's GEMM reads
// the weights, the update reads and writes them with their state), whichever is longer.
struct Floor {
  double gemm_seconds;
  double memory_seconds;
  double seconds() const { return std::max(gemm_seconds, memory_seconds); }
};

Floor step_floor(const ShardedSoftmaxOptions& o, int64_t global_batch, int64_t active_rows,
                 double gemm_flops, double memory_bandwidth) {
  const double rows = static_cast<double>(active_rows);
  const double d = static_cast<double>(o.embedding_size);
  const double w = static_cast<double>(torch::elementSize(o.weight_dtype));
  const double states = o.optimizer.kind == OptimizerKind::kAdamW ? 2.0
                        : o.optimizer.momentum == 0.0             ? 0.0
                                                                  : 1.0;
  const double s = states * static_cast<double>(torch::elementSize(o.optimizer.state_dtype));
  return {6.0 * static_cast<double>(global_batch) * d * rows / gemm_flops,
          rows * d * (3.0 * w + 2.0 * s) / memory_bandwidth};
}

struct BenchConfig {
  ShardedSoftmaxOptions options;
  int64_t local_batch = 128;
  int steps = 20;
  int warmup = 5;
  bool naive = false;
};

// One classifier (myriad's or the naive baseline) and its step.
class Subject {
 public:
  Subject(Communicator& comm, const BenchConfig& config, const torch::Device& device)
      : device_(device) {
    if (config.naive) {
      naive_ = std::make_unique<NaiveShardedSoftmax>(comm, config.options, device);
    } else {
      sharded_ = std::make_unique<ShardedMarginSoftmax>(comm, config.options, device);
    }
    const int64_t classes = config.options.num_classes;
    features_ =
        torch::randn({config.local_batch, config.options.embedding_size}, torch::device(device));
    labels_ = torch::randint(0, classes, {config.local_batch},
                             torch::dtype(torch::kInt64).device(device));
  }

  void step() {
    if (naive_) {
      naive_->step(features_, labels_);
    } else {
      torch::Tensor x = features_.detach().requires_grad_(true);
      sharded_->forward(x, labels_).backward();
    }
  }

  const ChunkPlan* plan() const { return sharded_ ? &sharded_->last_plan() : nullptr; }
  std::string kernels() const { return sharded_ ? sharded_->kernels() : std::string(); }
  std::string kept_for_backward() const {
    return sharded_ ? sharded_->kept_for_backward() : std::string();
  }
  // What the next forward takes from the last update rather than making it.
  const char* rows_from_update() const {
    if (sharded_ && sharded_->copy_from_update()) return "the GEMMs' copy of the rows";
    if (sharded_ && sharded_->norms_from_update()) return "the rows' 1/|w|";
    return "nothing";
  }
  void set_phase_timer(PhaseTimer* timer) {
    if (sharded_) sharded_->set_phase_timer(timer);
  }

 private:
  torch::Device device_;
  std::unique_ptr<ShardedMarginSoftmax> sharded_;
  std::unique_ptr<NaiveShardedSoftmax> naive_;
  torch::Tensor features_, labels_;
};

// The largest class count whose shards, optimizer state and workspace fit on every rank: a
// prediction from the persistent bytes per class, then tries that allocate for real, shrinking
// by 5% until all ranks succeed (agreeing through MPI before any collective runs).
int64_t find_max_classes(ProcessContext& context, Communicator& comm, BenchConfig config,
                         const torch::Device& device) {
  const ShardedSoftmaxOptions& o = config.options;
  const int64_t state_bytes =
      o.optimizer.momentum == 0.0 ? 0 : torch::elementSize(o.optimizer.state_dtype);
  const int64_t persistent =
      o.embedding_size * (static_cast<int64_t>(torch::elementSize(o.weight_dtype)) + state_bytes);
  const DeviceMemory memory = device_memory(device);
  // Leave the workspace, CUDA's context and the allocator's fragmentation outside the estimate.
  const int64_t usable = memory.free - o.workspace_bytes - (int64_t{3} << 30);
  int64_t classes = std::max<int64_t>(comm.size(), usable / persistent * comm.size());
  for (int attempt = 0; attempt < 8; ++attempt) {
    config.options.num_classes = classes;
    std::unique_ptr<Subject> subject;
    bool fits = true;
    try {
      subject = std::make_unique<Subject>(comm, config, device);
      torch::Tensor probe =
          torch::empty({o.workspace_bytes}, torch::dtype(torch::kUInt8).device(device));
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      fits = false;
    }
    if (context.all_true(fits)) {
      subject->step();
      subject->step();
      synchronize_device(device);
      return classes;
    }
    subject.reset();
    release_cached_memory(device);
    classes = classes * 95 / 100;
  }
  return 0;
}

// The command line: the configuration to benchmark and what to report beyond its step.
struct ClassifierBenchOptions {
  BenchConfig config;
  bool find_max = false;
  bool profile = false;
  std::string device;
};

// `argv` into `b`, checked; false where it asked for help only.
bool parse_classifier_options(const ProcessContext& context, int argc, char** argv,
                              ClassifierBenchOptions& b) {
  po::options_description options("classifier options");
  std::string classes_text, dtype_name, workspace_text, state_name, weight_name, fused_name,
      fused_update_name;
  BenchConfig& config = b.config;
  ShardedSoftmaxOptions& o = config.options;
  // clang-format off
  options.add_options()
      ("num-classes", po::value(&classes_text)->default_value("1M"), "classes C over all ranks (e.g. 100K, 1M, 8M)")
      ("embedding-size", po::value(&o.embedding_size)->default_value(512), "embedding size D")
      ("batch-size", count_option(&config.local_batch), "samples per rank (e.g. 128 or 2K)")
      ("dtype", po::value(&dtype_name)->default_value("bf16"), "GEMM operands: fp32, bf16 or fp16")
      ("workspace", po::value(&workspace_text)->default_value("8G"), "classifier workspace budget (bytes, e.g. 4G)")
      ("sample-rate", po::value(&o.sample_rate)->default_value(1.0), "Partial FC negative sampling rate in (0, 1]")
      ("momentum-dtype", po::value(&state_name)->default_value("fp32"), "SGD momentum storage: fp32 or bf16")
      ("weight-dtype", po::value(&weight_name)->default_value("fp32"), "classifier weights: fp32, or bf16 with stochastic rounding")
      ("fused", po::value(&fused_name)->default_value("auto"), "the fused Hopper kernels: auto (where they apply), on (an error elsewhere) or off (GEMMs and softmax kernels)")
      ("fused-update", po::value(&fused_update_name)->default_value("auto"), str_format("SGD's update formed from the logits' gradient in one kernel, for bf16 weights where the fused kernels run: auto (at global batches up to {}, where it measures faster; docs/classifier.md), on (every batch; an error where it cannot run) or off", kFusedUpdateAutoMaxBatch).c_str())
      ("naive", po::bool_switch(&config.naive), "benchmark the naive baseline (logits gathered to rank 0)")
      ("steps", po::value(&config.steps)->default_value(20), "timed steps")
      ("warmup", po::value(&config.warmup)->default_value(5), "untimed steps first")
      ("find-max-classes", po::bool_switch(&b.find_max), "also find the largest C that trains on these ranks")
      ("profile", po::bool_switch(&b.profile), "also print the time of each phase of the step")
      ("device", po::value(&b.device)->default_value("auto"), "auto, cpu or cuda");
  // clang-format on
  add_margin_options(options);
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: mpirun -np W myriad-bench classifier [options]",
                          context.rank())) {
    return false;
  }
  if (config.steps < 1 || config.warmup < 0 || config.local_batch < 1 || o.embedding_size < 1) {
    throw UsageError(
        "--steps, --batch-size and --embedding-size must be positive, --warmup non-negative");
  }
  o.num_classes = parse_count(classes_text);
  o.margin = margin_from_options(values);
  o.gemm_dtype = parse_float_dtype(dtype_name);
  o.workspace_bytes = parse_byte_size(workspace_text);
  o.optimizer.lr = 0.1;
  o.optimizer.momentum = 0.9;
  o.optimizer.weight_decay = 5e-4;
  o.optimizer.state_dtype = parse_float_dtype(state_name);
  if (o.optimizer.state_dtype == torch::kFloat16)
    throw UsageError("--momentum-dtype must be fp32 or bf16");
  o.weight_dtype = parse_float_dtype(weight_name);
  if (o.weight_dtype == torch::kFloat16) throw UsageError("--weight-dtype must be fp32 or bf16");
  o.fused_kernels = fused_kernels_choice(parse_toggle("fused", fused_name));
  o.fused_update = fused_update_choice(parse_toggle("fused-update", fused_update_name));
  for (const auto& [name, value] :
       {std::pair{"--fused", &fused_name}, std::pair{"--fused-update", &fused_update_name}}) {
    if (*value == "on" && config.naive)
      throw UsageError(std::string(name) +
                       " on and --naive exclude each other: the naive baseline has no fused "
                       "kernels");
  }
  return true;
}

// Seconds per step on this rank, after the warmup steps; `timer` sees the timed steps only.
double time_steps(const ProcessContext& context, Subject& subject, const BenchConfig& config,
                  const torch::Device& device, PhaseTimer& timer) {
  for (int i = 0; i < config.warmup; ++i) subject.step();
  // Steady state, as in training: steps run back to back and the clock stops once the device has
  // finished them all.
  subject.set_phase_timer(&timer);
  const double per_step = seconds_per_call(
      context, device, config.steps, [&] { subject.step(); }, [&] { timer.stop(); });
  subject.set_phase_timer(nullptr);
  return per_step;
}

// The timed steps over all ranks, beside what the device allows.
struct StepResult {
  int64_t shard_rows = 0;
  int64_t global_batch = 0;
  std::optional<ChunkPlan> plan;  // myriad's classifier only
  std::string kernels, kept_for_backward;
  const char* rows_from_update = "";
  RankSpread step_ms, rate, peak;
  Floor floor{};
};

// Collective: the ranks' shards differ by a row at most, but their times and memory need not.
StepResult summarise(const ProcessContext& context, const Communicator& comm,
                     const BenchConfig& config, const Subject& subject, double per_step,
                     const Ceilings& ceilings, const torch::Device& device) {
  const ShardedSoftmaxOptions& o = config.options;
  StepResult r;
  r.shard_rows = ClassPartition(o.num_classes, comm.size()).size(comm.rank());
  r.global_batch = config.local_batch * comm.size();
  if (subject.plan() != nullptr) r.plan = *subject.plan();
  r.kernels = subject.kernels();
  r.kept_for_backward = subject.kept_for_backward();
  r.rows_from_update = subject.rows_from_update();
  r.step_ms = spread_over_ranks(per_step * 1e3, context);
  const double tflops = 6.0 * r.global_batch * o.embedding_size * r.shard_rows / (per_step * 1e12);
  r.rate = spread_over_ranks(tflops, context);
  r.peak = spread_over_ranks(static_cast<double>(peak_device_memory(device)), context);
  const int64_t active_rows = std::min<int64_t>(
      r.shard_rows,
      static_cast<int64_t>(std::ceil(static_cast<double>(r.shard_rows) * o.sample_rate)));
  r.floor = step_floor(o, r.global_batch, active_rows, ceilings.gemm_tflops * 1e12,
                       ceilings.memory_bandwidth);
  return r;
}

void print_configuration(const BenchConfig& config, const StepResult& r, int world,
                         const torch::Device& device) {
  const ShardedSoftmaxOptions& o = config.options;
  std::printf(
      "# classifier %s: C=%lld over %d rank(s) (%lld per rank), D=%lld, batch %lld per rank "
      "(%lld global), "
      "%s GEMMs, %s, sample rate %.3g, weights %s, momentum %s, workspace %s, device %s\n",
      config.naive ? "naive baseline" : "myriad", static_cast<long long>(o.num_classes), world,
      static_cast<long long>(r.shard_rows), static_cast<long long>(o.embedding_size),
      static_cast<long long>(config.local_batch), static_cast<long long>(r.global_batch),
      c10::toString(o.gemm_dtype), o.margin.describe().c_str(), o.sample_rate,
      c10::toString(o.weight_dtype), c10::toString(o.optimizer.state_dtype),
      format_bytes(o.workspace_bytes).c_str(), device.str().c_str());
  if (r.plan) {
    std::printf(
        "# plan: %s, %s, %lld chunk(s) of %lld classes; the next forward takes from the update: "
        "%s\n",
        r.kernels.c_str(), r.kept_for_backward.c_str(), static_cast<long long>(r.plan->chunks),
        static_cast<long long>(r.plan->chunk_rows), r.rows_from_update);
  }
}

// Rank 0's report of the timed steps.
void print_step_result(const BenchConfig& config, const StepResult& r, const Ceilings& ceilings,
                       const torch::Device& device) {
  const char* gemm_dtype = c10::toString(config.options.gemm_dtype);
  std::printf(
      "step time (mean of %d back-to-back steps): %.3f ms (min/avg/max over ranks %.3f / %.3f / "
      "%.3f)\n",
      config.steps, r.step_ms.max, r.step_ms.min, r.step_ms.avg, r.step_ms.max);
  std::printf(
      "effective rate 6*B*D*n_r/t: %.3g TFLOP/s per rank (min %.3g); %s GEMM peak measured: %.3g "
      "TFLOP/s "
      "(%.0f%%)\n",
      r.rate.avg, r.rate.min, gemm_dtype, ceilings.gemm_tflops,
      100.0 * r.rate.avg / ceilings.gemm_tflops);
  std::printf(
      "floor: %.3f ms (GEMMs at the measured peak %.3f ms; weights and state once at the "
      "measured %.0f GB/s %.3f ms); the step takes %.2fx the floor (%.0f%% of it)\n",
      r.floor.seconds() * 1e3, r.floor.gemm_seconds * 1e3, ceilings.memory_bandwidth / 1e9,
      r.floor.memory_seconds * 1e3, r.step_ms.max / (r.floor.seconds() * 1e3),
      100.0 * r.floor.seconds() * 1e3 / r.step_ms.max);
  if (device.is_cuda()) {
    std::printf("peak memory per rank: min %s, max %s, max/min %.3f; %.0f bytes per class\n",
                format_bytes(r.peak.min).c_str(), format_bytes(r.peak.max).c_str(),
                r.peak.max / std::max(1.0, r.peak.min),
                r.peak.max / static_cast<double>(r.shard_rows));
  }
  std::fflush(stdout);
}

// Collective: each phase's time per step, printed by rank 0.
void print_phases(const ProcessContext& context, PhaseTimer& timer, int steps) {
  for (const auto& [name, ms] : timer.totals()) {
    const RankSpread per_step = spread_over_ranks(ms / steps, context);
    if (context.rank() == 0)
      std::printf("phase %-32s %9.3f ms per step (max over ranks)\n", name.c_str(), per_step.max);
  }
}

// Collective, with no classifier left on the device.
void report_max_classes(ProcessContext& context, Communicator& comm, const BenchConfig& config,
                        const torch::Device& device) {
  const ShardedSoftmaxOptions& o = config.options;
  const int64_t largest = find_max_classes(context, comm, config, device);
  if (context.rank() == 0) {
    std::printf(
        "largest C that trains on %d rank(s) (workspace %s, weights %s, momentum %s): %lld "
        "classes (%.1fM)\n",
        comm.size(), format_bytes(o.workspace_bytes).c_str(), c10::toString(o.weight_dtype),
        c10::toString(o.optimizer.state_dtype), static_cast<long long>(largest), largest / 1e6);
  }
}

}  // namespace

int run_classifier_bench(ProcessContext& context, int argc, char** argv) {
  ClassifierBenchOptions b;
  if (!parse_classifier_options(context, argc, argv, b)) return kExitOk;
  const BenchConfig& config = b.config;
  const torch::Device device = context.select_device(parse_device_preference(b.device));
  CommFactory comms(context);
  Communicator& comm = comms.for_device(device);
  const Ceilings ceilings = measure_ceilings(device, config.options.gemm_dtype);

  auto subject = std::make_unique<Subject>(comm, config, device);
  PhaseTimer timer(device, b.profile);
  const double per_step = time_steps(context, *subject, config, device, timer);
  const StepResult result = summarise(context, comm, config, *subject, per_step, ceilings, device);
  if (context.rank() == 0) {
    print_configuration(config, result, comm.size(), device);
    print_step_result(config, result, ceilings, device);
  }
  if (b.profile) print_phases(context, timer, config.steps);
  if (b.find_max && device.is_cuda()) {
    subject.reset();
    release_cached_memory(device);
    report_max_classes(context, comm, config, device);
  }
  return kExitOk;
}

}  // namespace myriad
