#include "myriad/comm/process_context.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "myriad/comm/hang_watchdog.h"
#include "myriad/util/check_cuda.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/error.h"
#include "myriad/util/fault_point.h"
#include "myriad/util/format.h"
#include "myriad/util/host_memory.h"
#include "myriad/util/log.h"
#include "myriad/util/strings.h"

namespace myriad {

namespace {

// "cpu", "cuda:0-3" or, for devices of several kinds, each one.
std::string devices_text(const std::vector<std::string>& devices) {
  std::vector<int> indices;
  for (const std::string& d : devices) {
    if (d.rfind("cuda:", 0) != 0) {
      const bool same = std::all_of(devices.begin(), devices.end(),
                                    [&](const std::string& other) { return other == d; });
      if (same) return d;
      std::string all;
      for (const std::string& each : devices) all += (all.empty() ? "" : ",") + each;
      return all;
    }
    indices.push_back(std::stoi(d.substr(5)));
  }
  std::sort(indices.begin(), indices.end());
  return ranges_text(indices, "cuda:");
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown";
  }
}

// The CPU, for a process whose tensors will live there.
torch::Device cpu_device() {
  keep_freed_host_memory();
  return torch::kCPU;
}

}  // namespace

ProcessContext::ProcessContext(int* argc, char*** argv) {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown-host");
  hostname_ = host;

  int initialized = 0;
  MYRIAD_CHECK_MPI(MPI_Initialized(&initialized));
  MYRIAD_CHECK(!initialized, "MPI was already initialised; create one ProcessContext per process");
  // Communication happens from one thread at a time (the training loop, or the autograd
  // engine's thread during backward), never concurrently.
  const int required = MPI_THREAD_SERIALIZED;
  const int rc = MPI_Init_thread(argc, argv, required, &thread_level_);
  if (rc != MPI_SUCCESS) {
    throw Error(str_format("MPI_Init_thread failed with code {}", rc), hostname_);
  }
  MYRIAD_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MYRIAD_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MYRIAD_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  set_error_identity(rank_, hostname_);
  configure_logging(log_config_from_env(rank_, size_));
  MYRIAD_CHECK(thread_level_ >= required, "MPI provides {} but myriad needs {}",
               thread_level_name(thread_level_), thread_level_name(required));

  MPI_Comm node = MPI_COMM_NULL;
  MYRIAD_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MYRIAD_CHECK_MPI(MPI_Comm_rank(node, &local_rank_));
  MYRIAD_CHECK_MPI(MPI_Comm_size(node, &local_size_));
  MYRIAD_CHECK_MPI(MPI_Comm_free(&node));
  log_debug("rank {} of {} on {} (local rank {} of {}), {}", rank_, size_, hostname_, local_rank_,
            local_size_, thread_level_name(thread_level_));
}

ProcessContext::~ProcessContext() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

bool ProcessContext::all_true(bool local) const {
  const WaitScope wait("an agreement of all ranks", "mpi", size_);
  int value = local ? 1 : 0;
  int result = 0;
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &result, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
  return result != 0;
}

std::vector<std::string> ProcessContext::all_gather_strings(const std::string& local) const {
  const WaitScope wait("an exchange of all ranks' results", "mpi", size_);
  const int length = static_cast<int>(local.size());
  std::vector<int> lengths(size_);
  MYRIAD_CHECK_MPI(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::vector<int> displacements(size_, 0);
  for (int r = 1; r < size_; ++r) displacements[r] = displacements[r - 1] + lengths[r - 1];
  std::string all(static_cast<size_t>(displacements.back() + lengths.back()), '\0');
  MYRIAD_CHECK_MPI(MPI_Allgatherv(local.data(), length, MPI_CHAR, all.data(), lengths.data(),
                                  displacements.data(), MPI_CHAR, MPI_COMM_WORLD));
  std::vector<std::string> strings(size_);
  for (int r = 0; r < size_; ++r) strings[r] = all.substr(displacements[r], lengths[r]);
  return strings;
}

std::string describe_placement(const std::vector<std::string>& hosts,
                               const std::vector<std::string>& devices) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<std::vector<int>, std::vector<std::string>>> by_host;
  for (size_t r = 0; r < hosts.size(); ++r) {
    auto& [ranks, host_devices] = by_host[hosts[r]];
    if (ranks.empty()) order.push_back(hosts[r]);
    ranks.push_back(static_cast<int>(r));
    host_devices.push_back(devices[r]);
  }
  std::string text =
      str_format("{} rank{} on {} host{}:", hosts.size(), hosts.size() == 1 ? "" : "s",
                 order.size(), order.size() == 1 ? "" : "s");
  for (size_t h = 0; h < order.size(); ++h) {
    const auto& [ranks, host_devices] = by_host[order[h]];
    text += str_format("{} {} rank{} {} on {}", h == 0 ? "" : ",", order[h],
                       ranks.size() == 1 ? "" : "s", ranges_text(ranks, ""),
                       devices_text(host_devices));
  }
  return text;
}

std::string ProcessContext::placement(const torch::Device& device) const {
  return describe_placement(all_gather_strings(hostname_), all_gather_strings(device.str()));
}

bool ProcessContext::all_ranks_have_gpu() const {
  return all_true(torch::cuda::is_available() && torch::cuda::device_count() > 0);
}

GpuPlan ProcessContext::plan_gpus() const {
  std::vector<std::string> gpus = visible_gpu_uuids();
  if (const std::optional<int> fault = fault_host_gpus()) {
    gpus.clear();
    for (int i = 0; i < *fault; ++i) gpus.push_back(str_format("fault-gpu-{}-{}", hostname_, i));
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::vector<std::string> hosts = all_gather_strings(hostname_);
  const std::vector<std::string> locals = all_gather_strings(std::to_string(local_rank_));
  const std::vector<std::string> visibles = all_gather_strings(visible == nullptr ? "" : visible);
  const std::vector<std::string> lists = all_gather_strings(join(gpus, ","));
  std::vector<RankGpus> ranks(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    ranks[r] = {hosts[r], std::stoi(locals[r]), {}, visibles[r]};
    std::stringstream list(lists[r]);
    for (std::string gpu; std::getline(list, gpu, ',');) ranks[r].gpus.push_back(gpu);
  }
  return myriad::plan_gpus(ranks);
}

torch::Device ProcessContext::select_device(DevicePreference preference) {
  if (preference == DevicePreference::kCpu) return cpu_device();
  const GpuPlan plan = plan_gpus();
  if (!plan.conflicts.empty()) throw UsageError(join(plan.conflicts, "; "));
  return use_device(preference, plan);
}

torch::Device ProcessContext::use_device(DevicePreference preference, const GpuPlan& plan) {
  if (preference == DevicePreference::kCpu) return cpu_device();
  if (!all_ranks_have_gpu()) {
    MYRIAD_CHECK_COLLECTIVE(preference != DevicePreference::kCuda,
                            "--device cuda was asked for, but not every rank sees a CUDA device");
    return cpu_device();
  }
#ifdef MYRIAD_WITH_CUDA
  const int index = plan.index.at(rank_);
  MYRIAD_CHECK(index >= 0 && index < static_cast<int>(torch::cuda::device_count()),
               "the plan gives this rank GPU {} of the {} it sees", index,
               torch::cuda::device_count());
  MYRIAD_CHECK_CUDA(cudaSetDevice(index));
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
#else
  MYRIAD_THROW_COLLECTIVE(
      "this build of myriad has no CUDA support; rebuild against a CUDA LibTorch");
#endif
}

}  // namespace myriad
