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
#include <memory>
#include <string>
#include <vector>

#include "bench_commands.h"
#include "bench_common.h"
#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/classifier/sharded_softmax.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"
#include "myriad/model/backbone.h"
#include "myriad/train/async_checkpoint.h"
#include "myriad/train/training_checkpoint.h"
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

// Removes a tree this benchmark made, or says why it could not.
void remove_or_fail(const std::string& path) {
  const std::string failure = remove_tree(path);
  MYRIAD_CHECK(failure.empty(), "{}", failure);
}

// The command line.
struct CheckpointBenchOptions {
  std::string directory;
  std::string state_name;  // fp32 or bf16
  BackboneOptions backbone;
  ShardedSoftmaxOptions classifier;
  bool warm_cache = false, keep_files = false;
  std::string device;
};

// `argv` into `o`, checked; false where it asked for help only.
bool parse_checkpoint_options(const ProcessContext& context, int argc, char** argv,
                              CheckpointBenchOptions& o) {
  po::options_description options("checkpoint options");
  std::string classes_text, shape_text;
  int64_t dim = 512;
  BackboneOptions& b = o.backbone;
  // clang-format off
  options.add_options()
      ("dir", po::value(&o.directory)->required(), "checkpoint root to write into (on the file system under test)")
      ("num-classes", po::value(&classes_text)->default_value("10M"), "classes C over all ranks")
      ("embedding-size", po::value(&dim)->default_value(dim), "embedding size D")
      ("momentum-dtype", po::value(&o.state_name)->default_value("fp32"), "SGD momentum in memory: fp32 or bf16 (files hold float32)")
      ("backbone", po::value(&b.name)->default_value(b.name), "backbone whose parameters and momentum are saved too")
      ("input-shape", po::value(&shape_text)->default_value("3x112x112"), "the backbone's CxHxW")
      ("warm-cache", po::bool_switch(&o.warm_cache), "load with the files still in the page cache")
      ("keep-files", po::bool_switch(&o.keep_files), "leave the checkpoint in --dir (under myriad-bench-checkpoint-PID)")
      ("device", po::value(&o.device)->default_value("auto"), "auto, cpu or cuda");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: mpirun -np W myriad-bench checkpoint --dir DIR [options]",
                          context.rank())) {
    return false;
  }
  if (dim < 1) throw UsageError("--embedding-size must be positive");
  if (o.state_name != "fp32" && o.state_name != "bf16") {
    throw UsageError("--momentum-dtype must be fp32 or bf16");
  }
  b.input = parse_input_shape(shape_text);
  b.embedding_size = dim;
  o.classifier.num_classes = parse_count(classes_text);
  o.classifier.embedding_size = dim;
  o.classifier.optimizer.state_dtype = o.state_name == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  return true;
}

// What a training run would checkpoint; `state` points into the rest.
struct Trainee {
  std::shared_ptr<Backbone> backbone;
  std::unique_ptr<torch::optim::SGD> optimizer;
  std::unique_ptr<ShardedMarginSoftmax> classifier;
  TrainingState state;
};

Trainee make_trainee(CommFactory& comms, const CheckpointBenchOptions& o,
                     const torch::Device& device) {
  Trainee t;
  t.backbone = make_backbone(o.backbone);
  t.backbone->to(device);
  t.optimizer = std::make_unique<torch::optim::SGD>(t.backbone->parameters(),
                                                    torch::optim::SGDOptions(0.1).momentum(0.9));
  // A step with zero gradients creates the momentum buffers a trained model has.
  for (torch::Tensor& p : t.backbone->parameters()) p.mutable_grad() = torch::zeros_like(p);
  t.optimizer->step();
  t.classifier =
      std::make_unique<ShardedMarginSoftmax>(comms.for_device(device), o.classifier, device);
  t.state = {t.backbone.get(), t.optimizer.get(), t.classifier.get(), nullptr, 1, {}, "", {}};
  synchronize_device(device);
  return t;
}

// Bytes of the checkpoint and seconds of each measurement.
struct Timings {
  int64_t total = 0, replicated = 0;
  double save = 0, blocked = 0, load = 0, raw_write = 0, raw_read = 0;
};

// Collective: the save's time on all ranks, and in `blocked` how long training would wait.
double time_save(const ProcessContext& context, AsyncCheckpointer& checkpointer,
                 const TrainingState& state, const torch::Device& device, double& blocked) {
  return timed_collectively(context, [&] {
    const auto start = std::chrono::steady_clock::now();
    checkpointer.save(state);
    // As the next step would: wait, on the device, for the copies of what it changes.
    checkpointer.step_started(StepStart{state.step});
    checkpointer.before_backward(BeforeBackward{state.step});
    synchronize_device(device);
    blocked = seconds_since(start);
    checkpointer.complete();
  });
}

// Collective.
double time_load(const ProcessContext& context, const std::string& checkpoint, TrainingState& state,
                 const torch::Device& device, bool warm_cache) {
  if (!warm_cache && context.rank() == 0) evict_from_page_cache(checkpoint);
  return timed_collectively(context, [&] {
    load_checkpoint(context, checkpoint, state);
    synchronize_device(device);
  });
}

// Collective: the file system's own speed for the same bytes. Each rank writes and reads back one
// file of its share, sequentially, at the same time as the others (after the checkpoint is gone,
// so that the disk holds one of them at a time).
void time_raw_io(const ProcessContext& context, const CheckpointStore& store,
                 const std::string& checkpoint, const Manifest& manifest, bool keep_files,
                 Timings& t) {
  const int64_t mine = manifest.files.at(shard_file_name(context.rank())).bytes +
                       (context.rank() == 0 ? t.replicated : 0);
  if (!keep_files && context.rank() == 0) remove_or_fail(checkpoint);
  const std::string raw =
      (fs::path(store.root()) / ("raw-" + std::to_string(context.rank()))).string();
  t.raw_write = timed_collectively(context, [&] { raw_write(raw, mine); });
  t.raw_read = timed_collectively(context, [&] { raw_read(raw, mine); });
  fs::remove(raw);
}

void print_report(const ProcessContext& context, const CheckpointBenchOptions& o,
                  const CheckpointStore& store, const torch::Device& device, const Timings& t) {
  std::printf(
      "# checkpoint: C=%lld over %d rank(s), D=%lld, momentum %s, backbone %s, device %s, "
      "directory %s\n",
      static_cast<long long>(o.classifier.num_classes), context.size(),
      static_cast<long long>(o.classifier.embedding_size), o.state_name.c_str(),
      o.backbone.name.c_str(), device.str().c_str(), store.root().c_str());
  std::printf("size: %s (%d classifier shards %s, replicated %s)\n",
              format_bytes(static_cast<double>(t.total)).c_str(), context.size(),
              format_bytes(static_cast<double>(t.total - t.replicated)).c_str(),
              format_bytes(static_cast<double>(t.replicated)).c_str());
  const double raw_write = t.total / t.raw_write / 1e9;
  const double raw_read = t.total / t.raw_read / 1e9;
  std::printf("raw: write %.2f GB/s (sequential, fsync'd), read %.2f GB/s (page cache dropped)\n",
              raw_write, raw_read);
  std::printf(
      "save: %.2f s, %.2f GB/s = %.0f%% of raw write (snapshot, write, fsync, checksum, "
      "publish); training blocked %.2f s\n",
      t.save, t.total / t.save / 1e9, 100.0 * t.total / t.save / 1e9 / raw_write, t.blocked);
  std::printf(
      "load: %.2f s, %.2f GB/s = %.0f%% of raw read (%s; checksum verification, read, "
      "host to device)\n",
      t.load, t.total / t.load / 1e9, 100.0 * t.total / t.load / 1e9 / raw_read,
      o.warm_cache ? "page cache warm" : "page cache dropped first");
}

}  // namespace

int run_checkpoint_bench(ProcessContext& context, int argc, char** argv) {
  CheckpointBenchOptions o;
  if (!parse_checkpoint_options(context, argc, argv, o)) return kExitOk;
  const torch::Device device = context.select_device(parse_device_preference(o.device));
  CommFactory comms(context);
  Trainee trainee = make_trainee(comms, o, device);
  // A fresh root of its own, so that nothing else in --dir is touched.
  const CheckpointStore store(context.all_gather_strings(
      (fs::path(o.directory) / ("myriad-bench-checkpoint-" + std::to_string(getpid())))
          .string())[0]);
  // Built outside the timing: its host buffers are allocated once per run.
  CheckpointOptions checkpoints;
  checkpoints.keep = 1;
  AsyncCheckpointer checkpointer(context, store, trainee.state, checkpoints);
  Timings t;
  t.save = time_save(context, checkpointer, trainee.state, device, t.blocked);
  const std::string checkpoint = store.directory_for(trainee.state.step);
  const Manifest manifest = read_manifest(checkpoint);
  for (const auto& [name, file] : manifest.files) {
    t.total += file.bytes;
    if (name == kReplicatedFile) t.replicated = file.bytes;
  }
  t.load = time_load(context, checkpoint, trainee.state, device, o.warm_cache);
  time_raw_io(context, store, checkpoint, manifest, o.keep_files, t);
  if (context.rank() == 0) {
    print_report(context, o, store, device, t);
    if (!o.keep_files) remove_or_fail(store.root());
  }
  return kExitOk;
}

}  // namespace myriad
