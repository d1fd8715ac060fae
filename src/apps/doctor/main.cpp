// myriad-doctor: a preflight for multi-node runs (docs/multi-node.md). It runs under the same
// mpirun or srun as myriad-train, with the same options, checks what breaks or slows a run across
// hosts (devices, versions, interfaces, the shared run directory, memory, bandwidth), prints one
// table and predicts the step time of the configuration.

#include <c10/util/Exception.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "interfaces.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/entry.h"
#include "myriad/comm/hang_watchdog.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/model/backbone.h"
#include "myriad/train/pipeline.h"
#include "myriad/train/step_model.h"
#include "myriad/train/train_config.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/cli.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "probes.h"

namespace myriad {

namespace {

namespace fs = std::filesystem;

struct DoctorOptions {
  double min_bandwidth = 0.0;  // GB/s between hosts; 0: only the comparison between hosts
  std::string message_size = "auto";
  int iters = 3;
  int64_t profile_batch = 0;
  bool model_table = false;
  // --model-table's machine.
  double gemm_tflops = 780.0;
  double memory_tbps = 4.0;
  double backbone_tflops = 200.0;
  double host_busbw = 350.0;  // GB/s
  double nic_gbits = 400.0;   // per GPU
  double latency_us = 30.0;
  int gpus_per_host = 8;
  std::string gpu_memory = "79G";
  std::string table_gpus = "8,16,32,64,128,256,512";
  std::string table_classes = "10M,30M,100M,300M,1G";
  std::string activation_per_image = "55M";
};

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

constexpr double kGB = 1e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string rate_text(double bytes_per_second) {
  if (bytes_per_second >= kGB) return str_format("{:.2f} GB/s", bytes_per_second / kGB);
  return str_format("{:.1f} MB/s", bytes_per_second / 1e6);
}

// The nominal link a figure corresponds to: "about 10 GbE", "below 1 GbE".
std::string link_class(double bytes_per_second) {
  const double gbits = bytes_per_second * 8.0 / kGB;
  for (const double nominal : {0.1, 1.0, 10.0, 25.0, 40.0, 100.0, 200.0, 400.0, 800.0}) {
    if (gbits > 1.15 * nominal) continue;
    const std::string name = nominal < 1.0      ? "100 Mb Ethernet"
                             : nominal <= 100.0 ? str_format("{} GbE", nominal)
                                                : str_format("{} Gb/s", nominal);
    return (gbits >= 0.5 * nominal ? "about " : "below ") + name;
  }
  return "NVLink or shared-memory class";
}

std::string classes_text(int64_t classes) {
  if (classes >= 1000000000 && classes % 1000000000 == 0)
    return str_format("{}B", classes / 1000000000);
  if (classes >= 1000000 && classes % 100000 == 0)
    return str_format("{}M", static_cast<double>(classes) / 1e6);
  if (classes >= 1000 && classes % 100 == 0)
    return str_format("{}K", static_cast<double>(classes) / 1e3);
  return std::to_string(classes);
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

// Columns padded to their widest cell.
void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

// "8,16,1M": positive counts (parse_count's units); anything else is a UsageError naming `option`.
std::vector<int64_t> parse_counts(const std::string& text, const std::string& option) {
  std::vector<int64_t> counts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    counts.push_back(parse_count(item));
    if (counts.back() <= 0) throw UsageError(str_format("--{} must list positive counts", option));
  }
  if (counts.empty()) throw UsageError(str_format("--{} must list positive counts", option));
  return counts;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Every rank's doubles, rank after rank (a collective call).
std::vector<double> all_gather_doubles(const ProcessContext& context,
                                       const std::vector<double>& local) {
  std::vector<double> all(local.size() * static_cast<size_t>(context.size()));
  MYRIAD_CHECK_MPI(MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_DOUBLE,
                                 all.data(), static_cast<int>(local.size()), MPI_DOUBLE,
                                 context.world()));
  return all;
}

// The hosts of `ranks`, each once, in rank order: "myrh2, myrh3".
std::string hosts_of(const std::vector<int>& ranks, const std::vector<std::string>& host_of_rank) {
  std::vector<std::string> hosts;
  for (const int r : ranks) {
    if (std::find(hosts.begin(), hosts.end(), host_of_rank[r]) == hosts.end())
      hosts.push_back(host_of_rank[r]);
  }
  return join(hosts, ", ");
}

// The directory a run would write into first: --run-dir itself, or its nearest existing parent
// (training creates the rest).
std::string existing_directory(const std::string& path) {
  fs::path p = fs::absolute(path);
  std::error_code error;
  while (!fs::is_directory(p, error) && p.has_relative_path()) p = p.parent_path();
  return p.string();
}

// Runs `work` on every rank; where it fails, `failures` gets one entry naming the hosts and the
// first failing rank's error. A collective call.
template <class Work>
void check_on_every_rank(const ProcessContext& context,
                         const std::vector<std::string>& host_of_rank, const std::string& what,
                         std::vector<std::string>& failures, Work&& work) {
  std::string error;
  try {
    work();
  } catch (const Error& e) {
    error = e.message();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::vector<std::string> errors = context.all_gather_strings(error);
  std::vector<int> failed;
  for (int r = 0; r < context.size(); ++r) {
    if (!errors[r].empty()) failed.push_back(r);
  }
  if (!failed.empty()) {
    failures.push_back(str_format("{} failed on {}: {}", what, hosts_of(failed, host_of_rank),
                                  errors[failed.front()]));
  }
}

struct Profile {
  int64_t params = 0;
  double seconds = 0.0;           // forward + backward of --batch-size images
  double activation_bytes = 0.0;  // at --batch-size
};

// A few forward and backward passes of the configured backbone on this rank's device.
Profile profile_backbone(const TrainConfig& config, const torch::Device& device,
                         int64_t profile_batch) {
  const std::shared_ptr<Backbone> backbone = make_backbone(backbone_options(config));
  backbone->to(device);
  backbone->set_channels_last(use_channels_last(config, device));
  backbone->train();
  Profile p;
  for (const torch::Tensor& t : backbone->parameters()) p.params += t.numel();
  const Activations sample{
      torch::randn({profile_batch, config.input.channels, config.input.height, config.input.width}),
      torch::arange(profile_batch, torch::kInt64), torch::Tensor()};
  std::optional<torch::ScalarType> autocast;
  if (config.precision != "fp32") autocast = parse_float_dtype(config.precision);
  const double scale = static_cast<double>(config.batch_size) / static_cast<double>(profile_batch);
  for (const BlockCost& cost :
       profile_blocks(*backbone, sample, device, autocast, parameter_state_factor(config))) {
    p.seconds += cost.seconds * scale;
    p.activation_bytes += cost.activation_bytes * scale;
  }
  return p;
}

// --model-table: the model over GPU counts and class counts on an assumed machine. Every rank
// computes it (a bad option fails them all alike); rank 0 prints it.
void print_model_table(TrainConfig config, const DoctorOptions& o, int rank) {
  // The table is of GPUs, where auto means bf16.
  if (config.precision == "auto") config.precision = "bf16";
  const std::shared_ptr<Backbone> backbone = make_backbone(backbone_options(config));
  int64_t params = 0;
  for (const torch::Tensor& t : backbone->parameters()) params += t.numel();
  const double per_image = static_cast<double>(parse_byte_size(o.activation_per_image));
  const double capacity = static_cast<double>(parse_byte_size(o.gpu_memory));
  const double across = std::min(o.host_busbw, o.gpus_per_host * o.nic_gbits / 8.0);
  const std::vector<int64_t> classes = parse_counts(o.table_classes, "table-classes");
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"GPUs"});
  for (const int64_t c : classes) rows.back().push_back("C = " + classes_text(c));
  for (const int64_t gpus : parse_counts(o.table_gpus, "table-gpus")) {
    std::vector<std::string> row = {std::to_string(gpus)};
    StepRates rates;
    rates.gemm_flops = o.gemm_tflops * 1e12;
    rates.memory_bandwidth = o.memory_tbps * 1e12;
    rates.all_reduce_busbw = (gpus <= o.gpus_per_host ? o.host_busbw : across) * kGB;
    rates.all_gather_busbw = rates.all_reduce_busbw;
    rates.collective_latency = o.latency_us * 1e-6;
    for (const int64_t c : classes) {
      StepShape shape = step_shape(config, gpus, c, params);
      shape.backbone_seconds = 6.0 * static_cast<double>(backbone->multiply_adds()) *
                               static_cast<double>(config.batch_size) / (o.backbone_tflops * 1e12);
      shape.activation_bytes = per_image * static_cast<double>(config.batch_size);
      const StepCost cost = predict_step(shape, rates);
      row.push_back(
          cost.total_memory > capacity
              ? str_format("does not fit ({:.0f} GiB)", cost.total_memory / kGiB)
              : str_format("{:.0f} ms, {:.1f} GiB", 1e3 * cost.step, cost.total_memory / kGiB));
    }
    rows.push_back(row);
  }
  if (rank != 0) return;
  std::printf(
      "# myriad-doctor --model-table: %s (%.1fM parameters, %.2fG multiply-adds per image), %lld "
      "images per GPU, D = %lld, %s, %s with %s state, sample rate %g, workspace %s, gradient "
      "all-reduce in %s\n",
      config.backbone.c_str(), static_cast<double>(params) / 1e6,
      static_cast<double>(backbone->multiply_adds()) / 1e9,
      static_cast<long long>(config.batch_size), static_cast<long long>(config.embedding_size),
      config.precision.c_str(), config.optimizer.c_str(), config.classifier_state_dtype.c_str(),
      config.sample_rate, format_bytes(static_cast<double>(config.classifier_workspace)).c_str(),
      config.grad_comm_dtype.c_str());
  std::printf(
      "# machine: GEMM %g TFLOP/s, memory %g TB/s, backbone %g TFLOP/s, %d GPUs per host, "
      "all-reduce busbw %g GB/s within a host and %.3g GB/s across hosts (%g Gb/s per GPU), "
      "%g us per small collective, activations %s per image, %s per GPU\n",
      o.gemm_tflops, o.memory_tbps, o.backbone_tflops, o.gpus_per_host, o.host_busbw, across,
      o.nic_gbits, o.latency_us, format_bytes(per_image).c_str(), format_bytes(capacity).c_str());
  std::printf("# each cell: predicted step time, memory per GPU (\"does not fit\" above %s)\n",
              format_bytes(capacity).c_str());
  print_table(rows);
}

// What every rank measured, gathered: one row per rank.
enum Measure {
  kFreeMemory,
  kNeededMemory,
  kBackboneSeconds,
  kActivationBytes,
  kGemmRate,
  kMemoryRate,
  kHostAllReduce,
  kHostAllGather,
  kWorldAllReduce,
  kWorldAllGather,
  kWorldLatency,
  kMeasures
};

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
  const torch::Device device = context.select_device(parse_device_preference(config.device));
  config.precision = resolve_precision(config.precision, device);
  MYRIAD_CHECK_COLLECTIVE(config.precision != "fp16" || device.is_cuda(),
                          "--precision fp16 needs GPUs");
  const int64_t message = o.message_size == "auto"
                              ? (device.is_cuda() ? int64_t{64} << 20 : int64_t{4} << 20)
                              : parse_byte_size(o.message_size);
  MYRIAD_CHECK_COLLECTIVE(message >= 1024, "--message-size must be at least 1K");
  std::vector<std::string> failures;
  std::vector<std::string> warnings;

  // Where every rank runs.
  const std::vector<std::string> host_of_rank = context.all_gather_strings(context.hostname());
  std::vector<std::string> hosts;
  std::vector<int> host_index(host_of_rank.size());
  std::vector<int> leaders;  // the first rank of each host
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    const auto at = std::find(hosts.begin(), hosts.end(), host_of_rank[r]);
    host_index[r] = static_cast<int>(at - hosts.begin());
    if (at == hosts.end()) {
      hosts.push_back(host_of_rank[r]);
      leaders.push_back(static_cast<int>(r));
    }
  }
  const int host_count = static_cast<int>(hosts.size());
  const std::string placement = context.placement(device);

  const DeviceIdentity id = identify_device(device);
  const std::vector<std::string> devices = context.all_gather_strings(id.device);
  const std::vector<std::string> uuids = context.all_gather_strings(id.uuid);
  const std::vector<std::string> versions =
      context.all_gather_strings(id.driver + " / " + id.cuda + " / " + id.nccl);
  std::map<std::string, std::vector<int>> ranks_of_gpu;
  for (int r = 0; r < context.size(); ++r) {
    if (!uuids[r].empty()) ranks_of_gpu[uuids[r]].push_back(r);
  }
  for (const auto& [uuid, ranks] : ranks_of_gpu) {
    if (ranks.size() < 2) continue;
    std::vector<std::string> names;
    for (const int r : ranks) names.push_back(std::to_string(r));
    failures.push_back(
        str_format("ranks {} on {} share GPU {}: give each rank its own GPU (one rank per GPU: "
                   "launch/mpirun.sh --gpus-per-node, srun --gpus-per-task=1)",
                   join(names, ", "), host_of_rank[ranks.front()], uuid));
  }
  std::map<std::string, std::vector<int>> ranks_of_version;
  for (int r = 0; r < context.size(); ++r) ranks_of_version[versions[r]].push_back(r);
  if (ranks_of_version.size() > 1) {
    std::vector<std::string> groups;
    for (const auto& [version, ranks] : ranks_of_version)
      groups.push_back(str_format("{} on {}", version, hosts_of(ranks, host_of_rank)));
    failures.push_back(
        str_format("driver / CUDA / NCCL versions differ between hosts: {}", join(groups, "; ")));
  }

  // The interfaces NCCL and Open MPI will take.
  const std::vector<NetInterface> interfaces = list_interfaces();
  const std::vector<NetInterface> nccl =
      nccl_interfaces(interfaces, std::getenv("NCCL_SOCKET_IFNAME"));
  const std::vector<NetInterface> mpi =
      mpi_interfaces(interfaces, std::getenv("OMPI_MCA_btl_tcp_if_include"),
                     std::getenv("OMPI_MCA_btl_tcp_if_exclude"));
  std::string nccl_text = "none";
  if (!nccl.empty()) {
    const int64_t speed = link_speed_mbps(nccl.front().name);
    nccl_text = str_format("{} {} ({})", nccl.front().name, nccl.front().address,
                           speed > 0 ? str_format("{} Gb/s", static_cast<double>(speed) / 1e3)
                                     : std::string("speed unknown"));
  }
  std::vector<std::string> mpi_names;
  for (const NetInterface& i : mpi) mpi_names.push_back(i.name);
  const std::vector<std::string> nccl_of_rank = context.all_gather_strings(nccl_text);
  const std::vector<std::string> mpi_of_rank =
      context.all_gather_strings(mpi_names.empty() ? "none" : join(mpi_names, ","));
  if (host_count > 1) {
    std::vector<int> local_nccl;
    std::vector<int> no_mpi;
    for (int r = 0; r < context.size(); ++r) {
      const std::string name = nccl_of_rank[r].substr(0, nccl_of_rank[r].find(' '));
      if (name == "none" || is_host_local_interface(name)) local_nccl.push_back(r);
      if (mpi_of_rank[r] == "none") no_mpi.push_back(r);
    }
    if (!local_nccl.empty()) {
      const std::string problem = str_format(
          "NCCL would use a host-local interface (or none) on {} ({}): set NCCL_SOCKET_IFNAME to "
          "the interface of the network between the hosts",
          hosts_of(local_nccl, host_of_rank), nccl_of_rank[local_nccl.front()]);
      (device.is_cuda() ? failures : warnings).push_back(problem);
    }
    if (!no_mpi.empty()) {
      warnings.push_back(str_format(
          "Open MPI's TCP transport has no interface on {} (OMPI_MCA_btl_tcp_if_include / "
          "_exclude); it needs another transport (UCX, InfiniBand) between the hosts",
          hosts_of(no_mpi, host_of_rank)));
    }
  }

  // The run directory (and the checkpoint directory, when elsewhere) seen by every host.
  // Rank 0's paths, so that every rank checks the same ones.
  std::vector<std::string> directories;
  for (const std::string& path : {config.run_dir, config.checkpoint_dir}) {
    const std::string directory = context.all_gather_strings(existing_directory(path)).front();
    if (std::find(directories.begin(), directories.end(), directory) == directories.end())
      directories.push_back(directory);
  }
  std::vector<std::string> shared_text;
  for (const std::string& directory : directories) {
    const std::vector<std::string> seen =
        context.all_gather_strings(sees_shared_token(context, directory) ? "y" : "n");
    std::vector<int> blind;
    for (int r = 0; r < context.size(); ++r) {
      if (seen[r] != "y") blind.push_back(r);
    }
    if (blind.empty()) {
      shared_text.push_back(
          host_count > 1 ? str_format("'{}' is shared by all {} hosts", directory, host_count)
                         : str_format("'{}' is seen by every rank", directory));
    } else {
      const std::string blind_hosts = hosts_of(blind, host_of_rank);
      failures.push_back(str_format(
          "the run directory '{}' is not shared: {} {} not see the file rank 0 wrote there on "
          "{}; put --run-dir (and --checkpoint-dir) on a file system every host mounts",
          directory, blind_hosts, blind_hosts.find(',') == std::string::npos ? "does" : "do",
          host_of_rank.front()));
      shared_text.push_back(str_format("'{}' is NOT shared", directory));
    }
  }

  // The classes, from the data file when --num-classes does not give them; the file must open on
  // every host.
  int64_t classes = config.num_classes;
  if (uses_synthetic_data(config)) {
    classes = synthetic_classes(config);
  } else {
    int64_t in_file = 0;
    check_on_every_rank(context, host_of_rank, str_format("reading --data '{}'", config.data),
                        failures,
                        [&] { in_file = Hdf5ImageDataset(config.data, true).info().num_classes; });
    MYRIAD_CHECK_MPI(
        MPI_Allreduce(MPI_IN_PLACE, &in_file, 1, MPI_INT64_T, MPI_MAX, context.world()));
    if (classes == 0) classes = std::max<int64_t>(in_file, 1);
  }

  // This rank's compute: the backbone, the classifier's GEMM and memory traffic.
  const int64_t profile_batch =
      o.profile_batch > 0
          ? o.profile_batch
          : (device.is_cuda() ? config.batch_size : std::min<int64_t>(config.batch_size, 8));
  Profile profile;
  double gemm_rate = 0.0;
  double memory_rate = 0.0;
  check_on_every_rank(
      context, host_of_rank, "profiling the backbone and the classifier's GEMM", failures, [&] {
        profile = profile_backbone(config, device, profile_batch);
        // A chunk of classes whose logits take at most 1 GiB (32 MiB on CPUs).
        const int64_t batch = config.batch_size * context.size();
        const int64_t budget = device.is_cuda() ? int64_t{1} << 30 : int64_t{32} << 20;
        const int64_t rows =
            std::clamp<int64_t>(std::min((classes + context.size() - 1) / context.size(),
                                         budget / (4 * batch + 4 * config.embedding_size)),
                                1, budget);
        gemm_rate = measure_gemm_rate(device, parse_float_dtype(config.precision), rows, batch,
                                      config.embedding_size);
        memory_rate = measure_memory_bandwidth(
            device, device.is_cuda() ? int64_t{1} << 30 : int64_t{64} << 20);
      });
  release_cached_memory(device);

  // Bandwidth within each host (all hosts at once), among all ranks, and of each host's link to
  // the next host, one link at a time so that a slow host stands out.
  CommFactory comms(context);
  Communicator& world = comms.for_device(device);
  const std::unique_ptr<Communicator> host =
      comms.create_split(device, host_index[context.rank()], context.rank());
  const CollectiveRates within = time_collectives(*host, message, o.iters);
  const CollectiveRates among = time_collectives(world, message, o.iters);
  const CollectiveRates small = time_collectives(world, 4096, o.iters);
  std::vector<std::pair<int, int>> links;
  if (host_count == 2) links.emplace_back(0, 1);
  if (host_count > 2) {
    for (int h = 0; h < host_count; ++h) links.emplace_back(h, (h + 1) % host_count);
  }
  // Both directions of each link; each measured by its sender.
  std::vector<double> link_seconds(2 * links.size(), 0.0);
  for (size_t l = 0; l < links.size(); ++l) {
    const int a = leaders[links[l].first];
    const int b = leaders[links[l].second];
    link_seconds[2 * l] = time_transfer(world, a, b, message, o.iters);
    link_seconds[2 * l + 1] = time_transfer(world, b, a, message, o.iters);
    wait_quietly(context);
  }
  if (!link_seconds.empty()) {
    MYRIAD_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, link_seconds.data(),
                                   static_cast<int>(link_seconds.size()), MPI_DOUBLE, MPI_MAX,
                                   context.world()));
  }

  // The model of this rank's step, for its memory; the prediction below takes the slowest rank.
  StepShape shape = step_shape(config, context.size(), classes, profile.params);
  shape.backbone_seconds = profile.seconds;
  shape.activation_bytes = profile.activation_bytes;
  const StepCost own = predict_step(shape, StepRates{gemm_rate, memory_rate, 1.0, 1.0, 0.0});
  std::vector<double> local(kMeasures, 0.0);
  release_cached_memory(device);
  local[kFreeMemory] = static_cast<double>(free_memory(device, context.local_size()));
  local[kNeededMemory] = own.total_memory;
  local[kBackboneSeconds] = profile.seconds;
  local[kActivationBytes] = profile.activation_bytes;
  local[kGemmRate] = gemm_rate;
  local[kMemoryRate] = memory_rate;
  local[kHostAllReduce] = within.all_reduce_busbw;
  local[kHostAllGather] = within.all_gather_busbw;
  local[kWorldAllReduce] = among.all_reduce_busbw;
  local[kWorldAllGather] = among.all_gather_busbw;
  local[kWorldLatency] = small.all_reduce_seconds;
  const std::vector<double> all = all_gather_doubles(context, local);
  const auto at = [&](int r, Measure m) { return all[static_cast<size_t>(r) * kMeasures + m]; };
  const auto highest = [&](Measure m) {
    double v = 0.0;
    for (int r = 0; r < context.size(); ++r) v = std::max(v, at(r, m));
    return v;
  };
  const auto lowest = [&](Measure m) {
    double v = at(0, m);
    for (int r = 1; r < context.size(); ++r) v = std::min(v, at(r, m));
    return v;
  };

  std::vector<int> short_of_memory;
  for (int r = 0; r < context.size(); ++r) {
    if (at(r, kNeededMemory) > at(r, kFreeMemory)) short_of_memory.push_back(r);
  }
  if (!short_of_memory.empty()) {
    const int r = short_of_memory.front();
    failures.push_back(str_format(
        "not enough memory on {}: rank {} needs about {} and has {} free ({}); use more GPUs, "
        "--classifier-state-dtype bf16, --classifier-weight-dtype bf16, a smaller "
        "--classifier-workspace or --batch-size, or "
        "--activation-checkpointing",
        hosts_of(short_of_memory, host_of_rank), r, format_bytes(at(r, kNeededMemory)),
        format_bytes(at(r, kFreeMemory)), devices[r]));
  }

  // Per host: its collectives within, and the better of its links to its neighbours.
  std::vector<double> host_reduce(host_count, 0.0);
  std::vector<double> host_gather(host_count, 0.0);
  std::vector<int> host_ranks(host_count, 0);
  for (int r = 0; r < context.size(); ++r) {
    const int h = host_index[r];
    const bool first = host_ranks[h]++ == 0;
    host_reduce[h] =
        first ? at(r, kHostAllReduce) : std::min(host_reduce[h], at(r, kHostAllReduce));
    host_gather[h] =
        first ? at(r, kHostAllGather) : std::min(host_gather[h], at(r, kHostAllGather));
  }
  std::vector<double> link_rate(links.size(), 0.0);
  std::vector<double> host_link(host_count, 0.0);
  for (size_t l = 0; l < links.size(); ++l) {
    link_rate[l] =
        static_cast<double>(message) / std::max(link_seconds[2 * l], link_seconds[2 * l + 1]);
    for (const int h : {links[l].first, links[l].second})
      host_link[h] = std::max(host_link[h], link_rate[l]);
  }
  if (!links.empty()) {
    // A host is slow when both of its links are: a slow neighbour slows only one.
    const double typical = median(host_link);
    const double floor = o.min_bandwidth * kGB;
    std::vector<std::string> references;
    if (host_count > 2) references.push_back("a median of " + rate_text(typical) + " over hosts");
    if (floor > 0.0) references.push_back(str_format("--min-bandwidth {} GB/s", o.min_bandwidth));
    std::vector<std::string> slow;
    for (int h = 0; h < host_count; ++h) {
      if ((host_count > 2 && host_link[h] < 0.5 * typical) || host_link[h] < floor) {
        slow.push_back(str_format("{} at {} ({})", hosts[h], rate_text(host_link[h]),
                                  link_class(host_link[h])));
      }
    }
    if (!slow.empty()) {
      failures.push_back(str_format(
          "slow network between hosts: {} to its neighbours, against {}; check that host's "
          "interface, its link speed and NCCL_SOCKET_IFNAME / OMPI_MCA_btl_tcp_if_include",
          join(slow, ", "), join(references, " and ")));
    }
  }

  // The prediction, from the slowest rank and the bandwidth among all ranks.
  StepRates rates;
  rates.gemm_flops = lowest(kGemmRate);
  rates.memory_bandwidth = lowest(kMemoryRate);
  const int world_size = context.size();
  rates.all_reduce_busbw = lowest(kWorldAllReduce);
  rates.all_gather_busbw = lowest(kWorldAllGather);
  rates.collective_latency = highest(kWorldLatency);
  shape.backbone_seconds = highest(kBackboneSeconds);
  shape.activation_bytes = highest(kActivationBytes);
  const StepCost cost = predict_step(shape, rates);

  if (context.rank() == 0) {
    std::printf("# myriad-doctor: %s; %s\n", placement.c_str(),
                world.backend() == std::string("nccl") ? "NCCL" : "MPI (CPU tensors)");
    std::vector<std::vector<std::string>> rows = {
        {"rank", "host", "device", "driver / CUDA / NCCL", "NCCL interface", "MPI interfaces",
         "free memory", "needs", "backbone", "GEMM", "memory"}};
    for (int r = 0; r < context.size(); ++r) {
      rows.push_back(
          {std::to_string(r), host_of_rank[r],
           devices[r] + (uuids[r].empty() ? "" : " " + uuids[r]), versions[r], nccl_of_rank[r],
           mpi_of_rank[r], format_bytes(at(r, kFreeMemory)), format_bytes(at(r, kNeededMemory)),
           str_format("{:.1f} ms", 1e3 * at(r, kBackboneSeconds)),
           str_format("{:.2f} TFLOP/s", at(r, kGemmRate) / 1e12), rate_text(at(r, kMemoryRate))});
    }
    print_table(rows);
    std::printf("# bandwidth: busbw as nccl-tests defines it, %s messages, %s backend\n",
                format_bytes(static_cast<double>(message)).c_str(), world.backend());
    for (int h = 0; h < host_count; ++h) {
      if (host_ranks[h] < 2) continue;
      std::printf("within %s (%d ranks): all_reduce %s, all_gather %s\n", hosts[h].c_str(),
                  host_ranks[h], rate_text(host_reduce[h]).c_str(),
                  rate_text(host_gather[h]).c_str());
    }
    if (world_size > 1) {
      std::printf("%s (%d ranks): all_reduce %s, all_gather %s, small all_reduce %.0f us\n",
                  host_count > 1 ? "across hosts" : "among all ranks", world_size,
                  rate_text(rates.all_reduce_busbw).c_str(),
                  rate_text(rates.all_gather_busbw).c_str(), 1e6 * rates.collective_latency);
    }
    for (size_t l = 0; l < links.size(); ++l) {
      std::printf("link %s <-> %s (first ranks %d and %d, slower direction): %s (%s)\n",
                  hosts[links[l].first].c_str(), hosts[links[l].second].c_str(),
                  leaders[links[l].first], leaders[links[l].second],
                  rate_text(link_rate[l]).c_str(), link_class(link_rate[l]).c_str());
    }
    std::printf("# run directory: %s\n", join(shared_text, "; ").c_str());
    std::printf(
        "# predicted step for this configuration (%s, C = %s, %lld per rank, %s, gradients in "
        "%s): %.1f ms = backbone %.1f (profiled at %lld images, slowest rank) + classifier %.1f "
        "(GEMM %.1f, memory traffic %.1f) + exposed all-reduce %.1f (of %.1f: %s) + features "
        "%.1f + softmax statistics %.1f\n",
        config.backbone.c_str(), classes_text(classes).c_str(),
        static_cast<long long>(config.batch_size), config.precision.c_str(),
        config.grad_comm_dtype.c_str(), 1e3 * cost.step, 1e3 * cost.backbone,
        static_cast<long long>(profile_batch), 1e3 * cost.classifier(), 1e3 * cost.classifier_gemm,
        1e3 * cost.classifier_memory, 1e3 * cost.exposed_all_reduce, 1e3 * cost.grad_all_reduce,
        format_bytes(cost.grad_all_reduce_bytes).c_str(), 1e3 * cost.feature_comm,
        1e3 * cost.stats_comm);
    std::printf(
        "# predicted memory per rank: %s = classifier weight %s + optimizer state %s + workspace "
        "%s + backbone state %s + activations %s%s\n",
        format_bytes(cost.total_memory).c_str(),
        format_bytes(cost.classifier_weight_memory).c_str(),
        format_bytes(cost.classifier_state_memory).c_str(),
        format_bytes(cost.workspace_memory).c_str(),
        format_bytes(cost.backbone_state_memory).c_str(),
        format_bytes(cost.activation_memory).c_str(),
        device.is_cuda() ? "" : " (on CPUs activations count the blocks' outputs only)");
    for (const std::string& w : warnings) std::printf("warning: %s\n", w.c_str());
    if (config.pipeline_stages > 1)
      std::printf("warning: the prediction assumes one pipeline stage\n");

    const double communication = cost.communication();
    if (!(std::isfinite(cost.step) && rates.gemm_flops > 0.0)) {
      std::printf("verdict: none (the profile failed; see the error below)\n");
    } else if (world_size > 1 && communication > 0.25 * cost.step) {
      std::printf(
          "verdict: %s %s (%s): %s at C = %s would spend %.0f ms of a %.0f ms step in "
          "communication (%.0f ms in the gradient all-reduce); %scheck NCCL_SOCKET_IFNAME\n",
          host_count > 1 ? "across hosts" : "among the ranks",
          rate_text(rates.all_reduce_busbw).c_str(), link_class(rates.all_reduce_busbw).c_str(),
          config.backbone.c_str(), classes_text(classes).c_str(), 1e3 * communication,
          1e3 * cost.step, 1e3 * cost.exposed_all_reduce,
          config.grad_comm_dtype == "fp32" ? "set --grad-comm-dtype bf16 or " : "");
    } else {
      std::printf(
          "verdict: compute-bound: backbone and classifier take %.0f%% of the predicted %.1f ms "
          "step\n",
          100.0 * (cost.backbone + cost.classifier()) / cost.step, 1e3 * cost.step);
    }
    std::fflush(stdout);
  }
  if (!failures.empty())
    MYRIAD_THROW_COLLECTIVE("{} check(s) failed: {}", failures.size(), join(failures, "; "));
  if (context.rank() == 0) std::printf("myriad-doctor: all checks passed\n");
  return kExitOk;
}

}  // namespace

}  // namespace myriad

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, myriad::run);
}
