#include "probes.h"

#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "driver_version.h"
#include "myriad/classifier/mixed_gemm.h"
#include "myriad/comm/communicator.h"
#include "myriad/comm/device_selection.h"
#include "myriad/comm/hang_watchdog.h"
#include "myriad/comm/process_context.h"
#include "myriad/train/step_model.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/log.h"

#ifdef MYRIAD_WITH_CUDA
#include "myriad/util/check_cuda.h"
#endif
#ifdef MYRIAD_WITH_NCCL
#include "myriad/util/check_nccl.h"
#endif

namespace myriad {

namespace {

using Clock = std::chrono::steady_clock;

// Runs `call` once to warm up, then `iters` times; the mean seconds per call, the device's queue
// included.
template <class Call>
double time_calls(const torch::Device& device, int iters, Call&& call) {
  call();
  synchronize_device(device);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < iters; ++i) call();
  synchronize_device(device);
  return seconds_since(start) / iters;
}

#ifdef MYRIAD_WITH_CUDA
// 12040 -> "12.4"
std::string cuda_version_text(int version) {
  return str_format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::string kernel_driver_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::ostringstream text;
  text << in.rdbuf();
  return driver_version_from_proc(text.str());
}
#endif

#ifdef MYRIAD_WITH_NCCL
// NCCL_VERSION_CODE: X*1000+Y*100+Z before 2.9, X*10000+Y*100+Z since.
std::string nccl_version_text(int code) {
  if (code >= 10000) return str_format("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100);
  return str_format("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100);
}
#endif

}  // namespace

DeviceIdentity identify_device(const torch::Device& device) {
  DeviceIdentity id;
  id.device = device.str();
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp properties{};
    MYRIAD_CHECK_CUDA(cudaGetDeviceProperties(&properties, device.index()));
    id.device = str_format("{} {}", device.str(), properties.name);
    id.uuid = visible_gpu_uuids().at(device.index());
    int version = 0;
    MYRIAD_CHECK_CUDA(cudaDriverGetVersion(&version));
    const std::string kernel = kernel_driver_version();
    id.driver = kernel.empty() ? str_format("CUDA {}", cuda_version_text(version))
                               : str_format("{} (CUDA {})", kernel, cuda_version_text(version));
    MYRIAD_CHECK_CUDA(cudaRuntimeGetVersion(&version));
    id.cuda = cuda_version_text(version);
#ifdef MYRIAD_WITH_NCCL
    MYRIAD_CHECK_NCCL(ncclGetVersion(&version), nullptr);
    id.nccl = nccl_version_text(version);
#endif
  }
#endif
  return id;
}

int64_t free_memory(const torch::Device& device, int local_size) {
  if (device.is_cuda()) return device_memory(device).free;
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024 / std::max(1, local_size);
  }
  MYRIAD_THROW("/proc/meminfo has no MemAvailable line");
}

CollectiveRates time_collectives(Communicator& comm, int64_t bytes, int iters) {
  CollectiveRates rates;
  const int64_t ranks = comm.size();
  if (ranks < 2) return rates;
  const torch::Device device = comm.device();
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::Tensor reduced = torch::ones({std::max<int64_t>(1, bytes / 4)}, options);
  const torch::Tensor part = torch::ones({std::max<int64_t>(1, bytes / 4 / ranks)}, options);
  comm.barrier();
  rates.all_reduce_seconds = time_calls(device, iters, [&] { comm.all_reduce(reduced); });
  rates.all_reduce_busbw = static_cast<double>(reduced.numel() * 4) * all_reduce_bus_factor(ranks) /
                           rates.all_reduce_seconds;
  comm.barrier();
  const double gather_seconds = time_calls(device, iters, [&] { comm.all_gather(part); });
  rates.all_gather_busbw =
      static_cast<double>(part.numel() * 4 * ranks) * all_gather_bus_factor(ranks) / gather_seconds;
  return rates;
}

double time_transfer(Communicator& comm, int from, int to, int64_t bytes, int iters) {
  if (comm.rank() != from && comm.rank() != to) return 0.0;
  const torch::Device device = comm.device();
  const torch::Tensor data =
      torch::ones({std::max<int64_t>(1, bytes)}, torch::dtype(torch::kUInt8).device(device));
  const torch::Tensor ack = torch::ones({1}, torch::dtype(torch::kUInt8).device(device));
  if (comm.rank() == to) {
    for (int i = 0; i <= iters; ++i) {
      comm.recv({torch::kUInt8}, from);
      comm.send({ack}, from);
    }
    synchronize_device(device);
    return 0.0;
  }
  // The fastest repetition: the link's capacity, not the noise of other work on the host.
  double best = 0.0;
  for (int i = 0; i <= iters; ++i) {
    const Clock::time_point start = Clock::now();
    comm.send({data}, to);
    comm.recv({torch::kUInt8}, to);
    synchronize_device(device);
    const double seconds = seconds_since(start);
    if (i == 1 || (i > 1 && seconds < best)) best = seconds;
  }
  return best;
}

void wait_quietly(const ProcessContext& context) {
  const WaitScope wait("a barrier between bandwidth measurements", "mpi", context.size());
  MPI_Request request = MPI_REQUEST_NULL;
  MYRIAD_CHECK_MPI(MPI_Ibarrier(context.world(), &request));
  int done = 0;
  while (true) {
    MYRIAD_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done != 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

double measure_gemm_rate(const torch::Device& device, torch::ScalarType gemm_dtype, int64_t rows,
                         int64_t batch, int64_t dim) {
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().device(device);
  const torch::Tensor weight = torch::randn({rows, dim}, options).to(gemm_dtype);
  const torch::Tensor features = torch::randn({batch, dim}, options).to(gemm_dtype);
  torch::Tensor logits = torch::empty({rows, batch}, options.dtype(torch::kFloat32));
  const double seconds = time_calls(
      device, 3, [&] { gemm_f32(logits, weight, false, features, true, /*accumulate=*/false); });
  return 2.0 * static_cast<double>(rows * batch * dim) / seconds;
}

double measure_memory_bandwidth(const torch::Device& device, int64_t bytes) {
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const torch::Tensor source = torch::ones({bytes / 4}, options);
  torch::Tensor target = torch::empty_like(source);
  const double seconds = time_calls(device, 3, [&] { target.copy_(source); });
  return 2.0 * static_cast<double>(source.numel() * 4) / seconds;
}

bool sees_shared_token(const ProcessContext& context, const std::string& directory) {
  std::string token;
  if (context.rank() == 0) {
    std::random_device random;
    for (int i = 0; i < 4; ++i) token += str_format("{:08x}", static_cast<unsigned>(random()));
  }
  token = context.all_gather_strings(token).front();
  const std::string path =
      (std::filesystem::path(directory) / (".myriad-doctor-" + token)).string();
  on_every_rank(context, str_format("writing a token file into '{}'", directory), [&] {
    if (context.rank() == 0) write_file_atomically(path, token);
  });
  bool seen = false;
  const Clock::time_point start = Clock::now();
  while (true) {
    std::ifstream in(path);
    std::string text;
    seen = static_cast<bool>(std::getline(in, text)) && text == token;
    // NFS may cache the directory's listing for a few seconds (lookupcache, acdirmin).
    if (seen || seconds_since(start) > 5.0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // Every rank has looked before rank 0 removes the file.
  context.all_true(true);
  if (context.rank() == 0 && std::remove(path.c_str()) != 0) {
    log_warn("could not remove the token file '{}': {}", path, std::strerror(errno));
  }
  return seen;
}

}  // namespace myriad
