// myriad-doctor: a preflight for multi-node runs (docs/multi-node.md). It runs under the same
// mpirun or srun as myriad-train, with the same options, checks what breaks or slows a run across
// hosts (devices, versions, interfaces, the shared run directory, memory, bandwidth), prints one
// table and predicts the step time of the configuration.

#include <cstdio>
#include <string>
#include <vector>

#include "checks.h"
#include "model_table.h"
#include "myriad/comm/entry.h"
#include "myriad/comm/hang_watchdog.h"
#include "myriad/comm/process_context.h"
#include "myriad/model/batch_norm.h"
#include "myriad/train/train_config.h"
#include "myriad/util/cli.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "options.h"
#include "report.h"
#include "text.h"

namespace myriad {

namespace {

po::options_description doctor_options(DoctorOptions& o) {
  po::options_description options("myriad-doctor options");
  // clang-format off
  options.add_options()
      ("min-bandwidth", po::value(&o.min_bandwidth)->default_value(o.min_bandwidth), "GB/s a host's link to the other hosts must reach (0: only flag a host below half the median of the hosts)")
      ("message-size", po::value(&o.message_size)->default_value(o.message_size), "bytes of each bandwidth measurement (auto: 64M on GPUs, 4M on CPUs)")
      ("iters", po::value(&o.iters)->default_value(o.iters), "timed repetitions of each measurement")
      ("profile-batch", po::value(&o.profile_batch)->default_value(0), "images of the backbone profile, scaled to --batch-size (0: --batch-size on GPUs, at most 8 on CPUs)")
      ("model-table", po::bool_switch(&o.model_table), "print the model's predicted step time and memory per GPU for 8 to 512 GPUs and 10M to 1B classes, on the machine the following options describe, and exit (no checks)")
      ("gemm-tflops", po::value(&o.gemm_tflops)->default_value(o.gemm_tflops), "--model-table: GEMM rate of the classifier's dtype, TFLOP/s")
      ("memory-tbps", po::value(&o.memory_tbps)->default_value(o.memory_tbps), "--model-table: GPU memory bandwidth, TB/s")
      ("backbone-tflops", po::value(&o.backbone_tflops)->default_value(o.backbone_tflops), "--model-table: the backbone's training rate, TFLOP/s (6 x multiply-adds per image)")
      ("host-busbw", po::value(&o.host_busbw)->default_value(o.host_busbw), "--model-table: all-reduce bus bandwidth within a host (NVLink), GB/s")
      ("nic-gbits", po::value(&o.nic_gbits)->default_value(o.nic_gbits), "--model-table: network bandwidth per GPU between hosts, Gb/s")
      ("latency-us", po::value(&o.latency_us)->default_value(o.latency_us), "--model-table: time of one small collective, microseconds")
      ("gpus-per-host", po::value(&o.gpus_per_host)->default_value(o.gpus_per_host), "--model-table: GPUs per host")
      ("gpu-memory", po::value(&o.gpu_memory)->default_value(o.gpu_memory), "--model-table: memory per GPU (79G: an H100 80GB)")
      ("table-gpus", po::value(&o.table_gpus)->default_value(o.table_gpus), "--model-table: the GPU counts of its rows")
      ("table-classes", po::value(&o.table_classes)->default_value(o.table_classes), "--model-table: the class counts of its columns")
      ("activation-per-image", po::value(&o.activation_per_image)->default_value(o.activation_per_image), "--model-table: backbone activation bytes per image (55M: iresnet100 in bf16, measured on an H200)");
  // clang-format on
  return options;
}

int run(ProcessContext& context, int argc, char** argv) {
  TrainConfig config;
  DoctorOptions o;
  po::options_description options = train_options(config);
  options.add(doctor_options(o));
  po::variables_map values;
  if (!parse_command_line_and_config(
          argc, argv, options, values,
          "usage: mpirun -np N myriad-doctor [myriad-train options] [--min-bandwidth GB/s]   (or "
          "srun --mpi=pmix myriad-doctor ...; --model-table alone prints the model's table)",
          context.rank(), "config")) {
    return kExitOk;
  }
  finish_train_config(values, config);
  if (o.iters < 1) throw UsageError("--iters must be positive");
  if (o.min_bandwidth < 0.0) throw UsageError("--min-bandwidth must not be negative");
  if (o.profile_batch < 0) throw UsageError("--profile-batch must not be negative");
  if (o.model_table) {
    print_model_table(config, o, context.rank());
    return kExitOk;
  }
  // A host or link that dies during the checks ends the job as it would end training.
  const WatchdogSession watchdog(config.hang_timeout);
  set_torch_threads(config.threads, context.local_size());
  // Ranks that would share a GPU are a failed check here, not the end of the preflight.
  const GpuPlan plan = config.device == DevicePreference::kCpu ? GpuPlan{} : context.plan_gpus();
  const torch::Device device = context.use_device(config.device, plan);
  config.precision = resolve_precision(config.precision, device);
  // The blocks' timings predict training's step: the same convolution engines.
  use_convolution_engines(convolution_engines(config.deterministic, config.cudnn_benchmark, device),
                          device);
  use_convolution_statistics(
      convolution_statistics(conv_statistics_request(config, device), device));
  const int64_t message = o.message_size == "auto"
                              ? (device.is_cuda() ? int64_t{64} << 20 : int64_t{4} << 20)
                              : parse_byte_size(o.message_size);
  MYRIAD_CHECK_COLLECTIVE(message >= 1024, "--message-size must be at least 1K");
  Survey survey(context, config, o, device, message);
  survey.shared_gpus = plan.conflicts;
  std::vector<CheckOutcome> outcomes;
  for (const Check& check : kChecks) outcomes.push_back({check.name, check.run(survey)});
  if (context.rank() == 0) print_report(survey, outcomes);
  std::vector<std::string> errors;
  for (const CheckOutcome& outcome : outcomes) {
    for (const Finding& f : outcome.findings) {
      if (f.severity == Severity::kError) errors.push_back(f.line);
    }
  }
  if (!errors.empty())
    MYRIAD_THROW_COLLECTIVE("{} check(s) failed: {}", errors.size(), join(errors, "; "));
  if (context.rank() == 0) std::printf("myriad-doctor: all checks passed\n");
  return kExitOk;
}

}  // namespace

}  // namespace myriad

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, myriad::run);
}
