// myriad-bench checkpoint: how fast a training state of C classes is saved as a sharded
// checkpoint and loaded back, every rank writing and reading its own shard at once.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "bench_commands.h"
#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"
#include "myriad/model/backbone.h"
#include "myriad/train/async_checkpoint.h"
#include "myriad/train/training_checkpoint.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/file_io.h"
#include "myriad/util/format.h"
#include "myriad/util/remove_tree.h"

namespace myriad {

namespace {

namespace fs = std::filesystem;

// Drops the checkpoint's pages from the page cache (they are clean after save's fsync), so that
// the load reads the disk rather than memory.
void evict_from_page_cache(const std::string& directory) {
  for (const auto& entry : fs::directory_iterator(directory)) {
    const ReadOnlyFile file(entry.path().string());
    const int rc = posix_fadvise(file.fd(), 0, 0, POSIX_FADV_DONTNEED);
    MYRIAD_CHECK(rc == 0, "posix_fadvise on '{}' failed ({})", entry.path().string(), rc);
  }
}

constexpr int64_t kRawBlock = int64_t{64} << 20;

void raw_write(const std::string& path, int64_t bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MYRIAD_CHECK(fd >= 0, "cannot create '{}': {}", path, std::strerror(errno));
  const std::vector<char> block(static_cast<size_t>(kRawBlock), 1);
  for (int64_t done = 0; done < bytes; done += kRawBlock)
    write_at(fd, block.data(), std::min(kRawBlock, bytes - done), done, path);
  MYRIAD_CHECK(fsync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0,
               "cannot sync '{}': {}", path, std::strerror(errno));
  close(fd);
}

void raw_read(const std::string& path, int64_t bytes) {
  const ReadOnlyFile file(path);
  std::vector<char> block(static_cast<size_t>(kRawBlock));
  for (int64_t done = 0; done < bytes; done += kRawBlock)
    read_at(file.fd(), block.data(), std::min(kRawBlock, bytes - done), done, path);
}

// Wall time of `work` on all ranks: from a common start to the last rank's end.
template <class Work>
double timed_collectively(const ProcessContext& context, Work work) {
  MYRIAD_CHECK_MPI(MPI_Barrier(context.world()));
  const auto start = std::chrono::steady_clock::now();
  work();
  MYRIAD_CHECK_MPI(MPI_Barrier(context.world()));
  return seconds_since(start);
}

}  // namespace

int run_checkpoint_bench(ProcessContext& context, int argc, char** argv) {
  po::options_description options("checkpoint options");
  std::string classes_text, state_name, device_name, directory, shape_text;
  int64_t dim = 512;
  BackboneOptions b;
  bool warm_cache = false, keep_files = false;
  // clang-format off
  options.add_options()
      ("dir", po::value(&directory)->required(), "checkpoint root to write into (on the file system under test)")
      ("num-classes", po::value(&classes_text)->default_value("10M"), "classes C over all ranks")
      ("embedding-size", po::value(&dim)->default_value(dim), "embedding size D")
      ("momentum-dtype", po::value(&state_name)->default_value("fp32"), "SGD momentum in memory: fp32 or bf16 (files hold float32)")
      ("backbone", po::value(&b.name)->default_value(b.name), "backbone whose parameters and momentum are saved too")
      ("input-shape", po::value(&shape_text)->default_value("3x112x112"), "the backbone's CxHxW")
      ("warm-cache", po::bool_switch(&warm_cache), "load with the files still in the page cache")
      ("keep-files", po::bool_switch(&keep_files), "leave the checkpoint in --dir (under myriad-bench-checkpoint-PID)")
      ("device", po::value(&device_name)->default_value("auto"), "auto, cpu or cuda");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: mpirun -np W myriad-bench checkpoint --dir DIR [options]",
                          context.rank())) {
    return kExitOk;
  }
  if (dim < 1) throw UsageError("--embedding-size must be positive");
  if (state_name != "fp32" && state_name != "bf16") {
    throw UsageError("--momentum-dtype must be fp32 or bf16");
  }
  b.input = parse_input_shape(shape_text);
  b.embedding_size = dim;
  ShardedSoftmaxOptions o;
  o.num_classes = parse_count(classes_text);
  o.embedding_size = dim;
  o.optimizer.state_dtype = state_name == "bf16" ? torch::kBFloat16 : torch::kFloat32;

  const torch::Device device = context.select_device(parse_device_preference(device_name));
  CommFactory comms(context);
  auto backbone = make_backbone(b);
  backbone->to(device);
  torch::optim::SGD optimizer(backbone->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  // A step with zero gradients creates the momentum buffers a trained model has.
  for (torch::Tensor& p : backbone->parameters()) p.mutable_grad() = torch::zeros_like(p);
  optimizer.step();
  ShardedMarginSoftmax classifier(comms.for_device(device), o, device);
  TrainingState state{backbone.get(), &optimizer, &classifier, nullptr, 1, {}, "", {}};
  synchronize_device(device);

  // A fresh root of its own, so that nothing else in --dir is touched.
  const CheckpointStore store(context.all_gather_strings(
      (fs::path(directory) / ("myriad-bench-checkpoint-" + std::to_string(getpid()))).string())[0]);
  // Built outside the timing: its host buffers are allocated once per run.
  CheckpointOptions checkpoints;
  checkpoints.keep = 1;
  AsyncCheckpointer checkpointer(context, store, state, checkpoints);
  double blocked_seconds = 0;
  const double save_seconds = timed_collectively(context, [&] {
    const auto start = std::chrono::steady_clock::now();
    checkpointer.save(state);
    // As the next step would: wait, on the device, for the copies of what it changes.
    checkpointer.order_before_step();
    checkpointer.order_before_backward();
    synchronize_device(device);
    blocked_seconds = seconds_since(start);
    checkpointer.complete();
  });
  const std::string checkpoint = store.directory_for(state.step);
  const Manifest manifest = read_manifest(checkpoint);
  int64_t total = 0, replicated = 0;
  for (const auto& [name, file] : manifest.files) {
    total += file.bytes;
    if (name == kReplicatedFile) replicated = file.bytes;
  }
  if (!warm_cache && context.rank() == 0) evict_from_page_cache(checkpoint);
  const double load_seconds = timed_collectively(context, [&] {
    load_checkpoint(context, checkpoint, state);
    synchronize_device(device);
  });
  // The file system's own speed for the same bytes: each rank writes and reads back one file of
  // its share, sequentially, at the same time as the others (after the checkpoint is gone, so that
  // the disk holds one of them at a time).
  const int64_t mine = manifest.files.at(shard_file_name(context.rank())).bytes +
                       (context.rank() == 0 ? replicated : 0);
  if (!keep_files && context.rank() == 0) {
    const std::string failure = remove_tree(checkpoint);
    MYRIAD_CHECK(failure.empty(), "{}", failure);
  }
  const std::string raw =
      (fs::path(store.root()) / ("raw-" + std::to_string(context.rank()))).string();
  const double raw_write_seconds = timed_collectively(context, [&] { raw_write(raw, mine); });
  const double raw_read_seconds = timed_collectively(context, [&] { raw_read(raw, mine); });
  fs::remove(raw);
  if (context.rank() == 0) {
    std::printf(
        "# checkpoint: C=%lld over %d rank(s), D=%lld, momentum %s, backbone %s, device %s, "
        "directory %s\n",
        static_cast<long long>(o.num_classes), context.size(), static_cast<long long>(dim),
        state_name.c_str(), b.name.c_str(), device.str().c_str(), store.root().c_str());
    std::printf("size: %s (%d classifier shards %s, replicated %s)\n",
                format_bytes(static_cast<double>(total)).c_str(), context.size(),
                format_bytes(static_cast<double>(total - replicated)).c_str(),
                format_bytes(static_cast<double>(replicated)).c_str());
    const double raw_write = total / raw_write_seconds / 1e9;
    const double raw_read = total / raw_read_seconds / 1e9;
    std::printf("raw: write %.2f GB/s (sequential, fsync'd), read %.2f GB/s (page cache dropped)\n",
                raw_write, raw_read);
    std::printf(
        "save: %.2f s, %.2f GB/s = %.0f%% of raw write (snapshot, write, fsync, checksum, "
        "publish); training blocked %.2f s\n",
        save_seconds, total / save_seconds / 1e9, 100.0 * total / save_seconds / 1e9 / raw_write,
        blocked_seconds);
    std::printf(
        "load: %.2f s, %.2f GB/s = %.0f%% of raw read (%s; checksum verification, read, "
        "host to device)\n",
        load_seconds, total / load_seconds / 1e9, 100.0 * total / load_seconds / 1e9 / raw_read,
        warm_cache ? "page cache warm" : "page cache dropped first");
    if (!keep_files) {
      const std::string failure = remove_tree(store.root());
      MYRIAD_CHECK(failure.empty(), "{}", failure);
    }
  }
  return kExitOk;
}

}  // namespace myriad
