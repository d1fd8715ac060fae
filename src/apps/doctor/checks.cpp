#include "checks.h"

#include <c10/util/Exception.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "interfaces.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/communicator.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/model/backbone.h"
#include "myriad/parallel/block_profile.h"
#include "myriad/parallel/gradient_sync.h"
#include "myriad/parallel/pipeline.h"
#include "myriad/train/graphs_choice.h"
#include "myriad/train/step_model.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"
#include "probes.h"
#include "text.h"

namespace myriad {

namespace {

namespace fs = std::filesystem;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Every rank's `value`, rank after rank (a collective call).
std::vector<double> per_rank(const ProcessContext& context, double value) {
  std::vector<double> all(static_cast<size_t>(context.size()));
  MYRIAD_CHECK_MPI(
      MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, context.world()));
  return all;
}

double lowest(const std::vector<double>& values) {
  return *std::min_element(values.begin(), values.end());
}

double highest(const std::vector<double>& values) {
  return *std::max_element(values.begin(), values.end());
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

// Runs `work` on every rank; where it fails, an error that names the hosts and the first failing
// rank's error. A collective call.
template <class Work>
Findings check_on_every_rank(const Survey& s, const std::string& what, Work&& work) {
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
  const std::vector<std::string> errors = s.context.all_gather_strings(error);
  std::vector<int> failed;
  for (int r = 0; r < s.context.size(); ++r) {
    if (!errors[r].empty()) failed.push_back(r);
  }
  if (failed.empty()) return {};
  return {{Severity::kError, str_format("{} failed on {}: {}", what,
                                        hosts_of(failed, s.host_of_rank), errors[failed.front()])}};
}

// Why a check that needs NCCL cannot run: ranks share a GPU (check_devices failed).
Findings skipped_without_nccl(const Survey& s) {
  if (s.shared_gpus.empty()) return {};
  return {{Severity::kSkipped, "it needs NCCL, which refuses ranks that share a GPU"}};
}

struct Profile {
  int64_t params = 0;
  double activation_bytes = 0.0;  // at --batch-size
};

// The configured backbone as myriad-train builds it, all of it on `device`.
std::shared_ptr<Backbone> backbone_on(const TrainConfig& config, const torch::Device& device) {
  const std::shared_ptr<Backbone> backbone = training_backbone(config, device);
  backbone->to(device);
  return backbone;
}

// The backbone's size and what its forward keeps for backward (block by block, as the pipeline
// balancer measures it), scaled from `profile_batch` images to --batch-size.
Profile profile_backbone(const TrainConfig& config, const torch::Device& device,
                         int64_t profile_batch) {
  const std::shared_ptr<Backbone> backbone = backbone_on(config, device);
  Profile p;
  for (const torch::Tensor& t : backbone->parameters()) p.params += t.numel();
  const Activations sample{
      torch::randn({profile_batch, config.input.channels, config.input.height, config.input.width}),
      torch::arange(profile_batch, torch::kInt64), torch::Tensor()};
  const double scale = static_cast<double>(config.batch_size) / static_cast<double>(profile_batch);
  for (const BlockCost& cost :
       profile_blocks(*backbone, sample, device, autocast_dtype(config.precision),
                      parameter_state_factor(config))) {
    p.activation_bytes += cost.activation_bytes * scale;
  }
  return p;
}

// This rank's backbone step as myriad-train runs it: the PipelineEngine of one stage over
// `profile_batch` images (--micro-batches of them), its gradients bucketed and all-reduced among
// all ranks on a communicator of their own (a collective call), timed over
// GraphsChoice::kTrialSteps steps after a first one, as --cuda-graphs auto times them: eagerly,
// and where graphs can run, replaying the graphs a further step recorded. Seconds per step, and
// of them what the all-reduce added after backward.
struct StepTimes {
  double eager = 0.0, eager_exposed = 0.0;
  double graphs = 0.0, graphs_exposed = 0.0;  // zero: not measured
};

StepTimes time_training_steps(const Survey& s, int64_t profile_batch) {
  const TrainConfig& config = s.config;
  const torch::Device& device = s.device;
  const std::shared_ptr<Backbone> backbone = backbone_on(config, device);
  PipelineLayout layout =
      pipeline_layout(s.context.size(), s.context.rank(), 1, config.micro_batches);
  layout.cut = {0, backbone->num_blocks()};
  PipelineEngine engine(layout, *backbone, nullptr, device, autocast_dtype(config.precision),
                        config.embedding_size);
  engine.place_stage();
  // Shared with the engine's CUDA graphs, which replay the all-reduces they recorded.
  const auto sync =
      std::make_shared<GradientSynchronizer>(engine.stage_parameters(), s.comms->create(device),
                                             config.bucket_bytes, config.grad_comm_dtype);
  const auto on_device = torch::TensorOptions().device(device);
  const torch::Tensor images = torch::randn(
      {profile_batch, config.input.channels, config.input.height, config.input.width}, on_device);
  const torch::Tensor keys = torch::arange(profile_batch, on_device.dtype(torch::kInt64));
  const torch::Tensor labels = torch::zeros({profile_batch}, on_device.dtype(torch::kInt64));
  const torch::Tensor direction = torch::randn({profile_batch, config.embedding_size}, on_device);
  // The classifier's place: a loss whose gradient reaches every embedding.
  const auto classify = [&](const torch::Tensor& embeddings, const torch::Tensor&) {
    const torch::Tensor loss = (embeddings * direction.narrow(0, 0, embeddings.size(0))).sum();
    loss.backward();
    return loss.detach();
  };
  const auto step = [&] {
    engine.train_step(images, keys, labels, classify, *sync);
    sync->finish();
    sync->clear_gradients();
  };
  // Seconds per step over the trial, and the exposed all-reduce of its last step.
  const auto trial = [&](double& seconds, double& exposed) {
    synchronize_device(device);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < GraphsChoice::kTrialSteps; ++i) step();
    synchronize_device(device);
    seconds = seconds_since(start) / GraphsChoice::kTrialSteps;
    exposed = 1e-3 * sync->last_stats().exposed_ms;
  };
  StepTimes times;
  step();  // cuDNN's search, NCCL's first collectives
  trial(times.eager, times.eager_exposed);
  if (config.cuda_graphs != Toggle::kOff && cuda_graphs_possible(config, device)) {
    engine.use_cuda_graphs(true);
    step();  // records (and falls back to eager, on every rank, when memory runs out)
    if (engine.cuda_graphs()) trial(times.graphs, times.graphs_exposed);
  }
  return times;
}

// The rows of the classifier's GEMM measurement: a chunk of classes whose logits take at most
// 1 GiB (32 MiB on CPUs).
int64_t gemm_rows(const Survey& s) {
  const int64_t batch = s.config.batch_size * s.context.size();
  const int64_t budget = s.device.is_cuda() ? int64_t{1} << 30 : int64_t{32} << 20;
  return std::clamp<int64_t>(std::min((s.classes + s.context.size() - 1) / s.context.size(),
                                      budget / (4 * batch + 4 * s.config.embedding_size)),
                             1, budget);
}

// The links between hosts, timed one at a time so that a slow host stands out: with two hosts
// the one link, with more a ring. Both directions of each; the slower counts.
std::vector<HostLink> time_links(const Survey& s, Communicator& world) {
  const int host_count = static_cast<int>(s.hosts.size());
  std::vector<HostLink> links;
  if (host_count == 2) links.push_back({0, 1});
  if (host_count > 2) {
    for (int h = 0; h < host_count; ++h) links.push_back({h, (h + 1) % host_count});
  }
  // Each direction measured by its sender.
  std::vector<double> seconds(2 * links.size(), 0.0);
  for (size_t l = 0; l < links.size(); ++l) {
    const int a = s.leaders[links[l].first];
    const int b = s.leaders[links[l].second];
    seconds[2 * l] = time_transfer(world, a, b, s.message, s.options.iters);
    seconds[2 * l + 1] = time_transfer(world, b, a, s.message, s.options.iters);
    wait_quietly(s.context);
  }
  if (!seconds.empty()) {
    MYRIAD_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, seconds.data(), static_cast<int>(seconds.size()),
                                   MPI_DOUBLE, MPI_MAX, s.context.world()));
  }
  for (size_t l = 0; l < links.size(); ++l) {
    links[l].rate = static_cast<double>(s.message) / std::max(seconds[2 * l], seconds[2 * l + 1]);
  }
  return links;
}

}  // namespace

Survey::Survey(ProcessContext& context, const TrainConfig& config, const DoctorOptions& options,
               const torch::Device& device, int64_t message)
    : context(context),
      config(config),
      options(options),
      device(device),
      message(message),
      host_of_rank(context.all_gather_strings(context.hostname())),
      host_index(host_of_rank.size()) {
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    const auto at = std::find(hosts.begin(), hosts.end(), host_of_rank[r]);
    host_index[r] = static_cast<int>(at - hosts.begin());
    if (at == hosts.end()) {
      hosts.push_back(host_of_rank[r]);
      leaders.push_back(static_cast<int>(r));
    }
  }
  placement = context.placement(device);
}

Survey::~Survey() = default;

Findings check_devices(Survey& s) {
  const DeviceIdentity id = identify_device(s.device);
  s.devices = s.context.all_gather_strings(id.device);
  s.uuids = s.context.all_gather_strings(id.uuid);
  s.versions = s.context.all_gather_strings(id.driver + " / " + id.cuda + " / " + id.nccl);
  Findings findings;
  for (const std::string& line : s.shared_gpus) findings.push_back({Severity::kError, line});
  std::map<std::string, std::vector<int>> ranks_of_version;
  for (int r = 0; r < s.context.size(); ++r) ranks_of_version[s.versions[r]].push_back(r);
  if (ranks_of_version.size() > 1) {
    std::vector<std::string> groups;
    for (const auto& [version, ranks] : ranks_of_version)
      groups.push_back(str_format("{} on {}", version, hosts_of(ranks, s.host_of_rank)));
    findings.push_back(
        {Severity::kError,
         str_format("driver / CUDA / NCCL versions differ between hosts: {}", join(groups, "; "))});
  }
  return findings;
}

Findings check_interfaces(Survey& s) {
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
  s.nccl_interface = s.context.all_gather_strings(nccl_text);
  s.mpi_interfaces =
      s.context.all_gather_strings(mpi_names.empty() ? "none" : join(mpi_names, ","));
  Findings findings;
  if (s.hosts.size() < 2) return findings;
  std::vector<int> local_nccl;
  std::vector<int> no_mpi;
  for (int r = 0; r < s.context.size(); ++r) {
    const std::string name = s.nccl_interface[r].substr(0, s.nccl_interface[r].find(' '));
    if (name == "none" || is_host_local_interface(name)) local_nccl.push_back(r);
    if (s.mpi_interfaces[r] == "none") no_mpi.push_back(r);
  }
  if (!local_nccl.empty()) {
    // Without GPUs the run does not use NCCL, and this is only a warning.
    findings.push_back(
        {s.device.is_cuda() ? Severity::kError : Severity::kWarning,
         str_format("NCCL would use a host-local interface (or none) on {} ({}): set "
                    "NCCL_SOCKET_IFNAME to the interface of the network between the hosts",
                    hosts_of(local_nccl, s.host_of_rank), s.nccl_interface[local_nccl.front()])});
  }
  if (!no_mpi.empty()) {
    findings.push_back(
        {Severity::kWarning,
         str_format("Open MPI's TCP transport has no interface on {} (OMPI_MCA_btl_tcp_if_include "
                    "/ _exclude); it needs another transport (UCX, InfiniBand) between the hosts",
                    hosts_of(no_mpi, s.host_of_rank))});
  }
  return findings;
}

Findings check_run_directory(Survey& s) {
  // The run directory and the checkpoint directory, when elsewhere. Rank 0's paths, so that every
  // rank checks the same ones.
  std::vector<std::string> directories;
  for (const std::string& path : {s.config.run_dir, s.config.checkpoint_dir}) {
    const std::string directory = s.context.all_gather_strings(existing_directory(path)).front();
    if (std::find(directories.begin(), directories.end(), directory) == directories.end())
      directories.push_back(directory);
  }
  const size_t host_count = s.hosts.size();
  Findings findings;
  for (const std::string& directory : directories) {
    const std::vector<std::string> seen =
        s.context.all_gather_strings(sees_shared_token(s.context, directory) ? "y" : "n");
    std::vector<int> blind;
    for (int r = 0; r < s.context.size(); ++r) {
      if (seen[r] != "y") blind.push_back(r);
    }
    if (blind.empty()) {
      s.directories.push_back(
          host_count > 1 ? str_format("'{}' is shared by all {} hosts", directory, host_count)
                         : str_format("'{}' is seen by every rank", directory));
      continue;
    }
    const std::string blind_hosts = hosts_of(blind, s.host_of_rank);
    findings.push_back(
        {Severity::kError,
         str_format("the run directory '{}' is not shared: {} {} not see the file rank 0 wrote "
                    "there on {}; put --run-dir (and --checkpoint-dir) on a file system every host "
                    "mounts",
                    directory, blind_hosts,
                    blind_hosts.find(',') == std::string::npos ? "does" : "do",
                    s.host_of_rank.front())});
    s.directories.push_back(str_format("'{}' is NOT shared", directory));
  }
  return findings;
}

Findings check_data(Survey& s) {
  if (uses_synthetic_data(s.config)) {
    s.classes = synthetic_classes(s.config);
    return {};
  }
  // From the data file when --num-classes does not give them; the file must open on every host.
  int64_t in_file = 0;
  Findings findings = check_on_every_rank(s, str_format("reading --data '{}'", s.config.data), [&] {
    in_file = Hdf5ImageDataset(s.config.data, true).info().num_classes;
  });
  MYRIAD_CHECK_MPI(
      MPI_Allreduce(MPI_IN_PLACE, &in_file, 1, MPI_INT64_T, MPI_MAX, s.context.world()));
  s.classes = s.config.num_classes > 0 ? s.config.num_classes : std::max<int64_t>(in_file, 1);
  return findings;
}

Findings check_compute(Survey& s) {
  const TrainConfig& config = s.config;
  s.profile_batch =
      s.options.profile_batch > 0
          ? s.options.profile_batch
          : (s.device.is_cuda() ? config.batch_size : std::min<int64_t>(config.batch_size, 8));
  Profile profile;
  double gemm_rate = 0.0;
  double memory_rate = 0.0;
  Findings findings =
      check_on_every_rank(s, "profiling the backbone and the classifier's GEMM", [&] {
        profile = profile_backbone(config, s.device, s.profile_batch);
        gemm_rate = measure_gemm_rate(s.device, compute_dtype(config.precision), gemm_rows(s),
                                      config.batch_size * s.context.size(), config.embedding_size);
        memory_rate = measure_memory_bandwidth(
            s.device, s.device.is_cuda() ? int64_t{1} << 30 : int64_t{64} << 20);
      });
  release_cached_memory(s.device);
  s.backbone_params = profile.params;
  s.activation_bytes = per_rank(s.context, profile.activation_bytes);
  s.gemm_rate = per_rank(s.context, gemm_rate);
  s.memory_rate = per_rank(s.context, memory_rate);
  return findings;
}

Findings check_network(Survey& s) {
  if (!s.shared_gpus.empty()) return skipped_without_nccl(s);
  // Within each host (all hosts at once), among all ranks, and each host's links.
  s.comms = std::make_unique<CommFactory>(s.context);
  Communicator& world = s.comms->for_device(s.device);
  s.backend = world.backend();
  s.host_comm = s.comms->create_split(s.device, s.host_index[s.context.rank()], s.context.rank());
  const CollectiveRates within = time_collectives(*s.host_comm, s.message, s.options.iters);
  const CollectiveRates among = time_collectives(world, s.message, s.options.iters);
  const CollectiveRates small = time_collectives(world, 4096, s.options.iters);
  s.links = time_links(s, world);

  const std::vector<double> host_reduce = per_rank(s.context, within.all_reduce_busbw);
  const std::vector<double> host_gather = per_rank(s.context, within.all_gather_busbw);
  s.host_ranks.assign(s.hosts.size(), 0);
  s.host_all_reduce.assign(s.hosts.size(), 0.0);
  s.host_all_gather.assign(s.hosts.size(), 0.0);
  for (int r = 0; r < s.context.size(); ++r) {
    const int h = s.host_index[r];
    const bool first = s.host_ranks[h]++ == 0;
    s.host_all_reduce[h] = first ? host_reduce[r] : std::min(s.host_all_reduce[h], host_reduce[r]);
    s.host_all_gather[h] = first ? host_gather[r] : std::min(s.host_all_gather[h], host_gather[r]);
  }
  s.world_all_reduce = lowest(per_rank(s.context, among.all_reduce_busbw));
  s.world_all_gather = lowest(per_rank(s.context, among.all_gather_busbw));
  s.world_latency = highest(per_rank(s.context, small.all_reduce_seconds));
  return {};
}

Findings check_step(Survey& s) {
  if (lowest(s.gemm_rate) <= 0.0 || !s.shared_gpus.empty()) {
    // The profile failed (check_compute said where): the step would fail the same way.
    s.backbone_seconds.assign(static_cast<size_t>(s.context.size()), 0.0);
    return skipped_without_nccl(s);
  }
  // The all-reduces inside make this collective: a rank's failure ends the run as a failed
  // collective does, rather than being gathered rank by rank.
  const StepTimes own = time_training_steps(s, s.profile_batch);
  release_cached_memory(s.device);
  const double scale =
      static_cast<double>(s.config.batch_size) / static_cast<double>(s.profile_batch);
  const std::vector<double> eager = per_rank(s.context, own.eager);
  const std::vector<double> graphs = per_rank(s.context, own.graphs);
  s.eager_step = highest(eager) * scale;
  s.graphs_step = lowest(graphs) > 0.0 ? highest(graphs) * scale : 0.0;
  // --cuda-graphs' choice, as the run takes it from the slowest rank's steps.
  s.graphs = s.graphs_step > 0.0 && (s.config.cuda_graphs == Toggle::kOn ||
                                     GraphsChoice::graphs_pay(s.graphs_step, s.eager_step));
  // The slowest rank's compute, and the rest of the slowest step as the all-reduce's exposed part
  // (a faster rank's exposure includes its wait for the slowest one, which compute counts).
  const double step = s.graphs ? own.graphs : own.eager;
  const double exposed = s.graphs ? own.graphs_exposed : own.eager_exposed;
  s.backbone_seconds = per_rank(s.context, (step - exposed) * scale);
  s.exposed_all_reduce =
      std::max(0.0, (s.graphs ? s.graphs_step : s.eager_step) - highest(s.backbone_seconds));
  return {};
}

Findings check_memory(Survey& s) {
  // The model of this rank's step, for its memory.
  StepShape shape = step_shape(s.config, s.context.size(), s.classes, s.backbone_params);
  const int rank = s.context.rank();
  shape.backbone_seconds = s.backbone_seconds[rank];
  shape.activation_bytes = s.activation_bytes[rank];
  const StepCost own =
      predict_step(shape, StepRates{s.gemm_rate[rank], s.memory_rate[rank], 1.0, 1.0, 0.0});
  release_cached_memory(s.device);
  s.free_memory =
      per_rank(s.context, static_cast<double>(free_memory(s.device, s.context.local_size())));
  s.needed_memory = per_rank(s.context, own.total_memory);
  std::vector<int> short_of_memory;
  for (int r = 0; r < s.context.size(); ++r) {
    if (s.needed_memory[r] > s.free_memory[r]) short_of_memory.push_back(r);
  }
  if (short_of_memory.empty()) return {};
  const int r = short_of_memory.front();
  return {
      {Severity::kError,
       str_format("not enough memory on {}: rank {} needs about {} and has {} free ({}); use "
                  "more GPUs, --classifier-state-dtype bf16, --classifier-weight-dtype bf16, "
                  "a smaller --classifier-workspace or --batch-size, or "
                  "--activation-checkpointing",
                  hosts_of(short_of_memory, s.host_of_rank), r, format_bytes(s.needed_memory[r]),
                  format_bytes(s.free_memory[r]), s.devices[r])}};
}

Findings check_links(Survey& s) {
  if (!s.shared_gpus.empty()) return skipped_without_nccl(s);
  if (s.links.empty()) return {};
  // Each host's better link to its neighbours: a host is slow when both of its links are, as a
  // slow neighbour slows only one.
  const int host_count = static_cast<int>(s.hosts.size());
  std::vector<double> host_link(host_count, 0.0);
  for (const HostLink& link : s.links) {
    for (const int h : {link.first, link.second}) host_link[h] = std::max(host_link[h], link.rate);
  }
  const double typical = median(host_link);
  const double floor = s.options.min_bandwidth * kGB;
  std::vector<std::string> references;
  if (host_count > 2) references.push_back("a median of " + rate_text(typical) + " over hosts");
  if (floor > 0.0)
    references.push_back(str_format("--min-bandwidth {} GB/s", s.options.min_bandwidth));
  std::vector<std::string> slow;
  for (int h = 0; h < host_count; ++h) {
    if ((host_count > 2 && host_link[h] < 0.5 * typical) || host_link[h] < floor) {
      slow.push_back(str_format("{} at {} ({})", s.hosts[h], rate_text(host_link[h]),
                                link_class(host_link[h])));
    }
  }
  if (slow.empty()) return {};
  return {{Severity::kError,
           str_format("slow network between hosts: {} to its neighbours, against {}; check that "
                      "host's interface, its link speed and NCCL_SOCKET_IFNAME / "
                      "OMPI_MCA_btl_tcp_if_include",
                      join(slow, ", "), join(references, " and "))}};
}

}  // namespace myriad
