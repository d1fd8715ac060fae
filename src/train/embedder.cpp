#include "myriad/train/embedder.h"

#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <memory>
#include <vector>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/comm/communicator.h"
#include "myriad/comm/process_context.h"
#include "myriad/train/checkpoint_backbone.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace {

// The backbone, every rank's copy read by that rank (from shared storage), or the error of the
// first rank that could not.
std::shared_ptr<Backbone> load_backbone(const ProcessContext& context, const EmbedderOptions& o,
                                        BackboneOptions& options) {
  std::shared_ptr<Backbone> backbone;
  if (!o.checkpoint.empty()) {
    on_every_rank(context, str_format("loading the backbone of '{}'", o.checkpoint), [&] {
      backbone = load_checkpoint_backbone(resolve_checkpoint(o.checkpoint), &options);
    });
    return backbone;
  }
  options.name = o.backbone;
  options.input = parse_input_shape(o.input_shape);
  options.embedding_size = o.embedding_size;
  backbone = make_backbone(options);
  on_every_rank(context, str_format("reading --init-backbone '{}'", o.init_backbone),
                [&] { init_backbone(*backbone, o.init_backbone); });
  backbone->eval();
  return backbone;
}

}  // namespace

void add_weights_options(po::options_description& options, EmbedderOptions& o) {
  // clang-format off
  options.add_options()
      ("checkpoint", po::value(&o.checkpoint), "checkpoint directory (or a directory of them: the newest) whose backbone embeds")
      ("init-backbone", po::value(&o.init_backbone), "instead of --checkpoint: a torch.save state dict (an insightface model-zoo .pth, myriad-ckpt export-backbone's file), with --backbone")
      ("backbone", po::value(&o.backbone), "with --init-backbone: the network (r50, r100, mbf, vit_t, ...)")
      ("input-shape", po::value(&o.input_shape)->default_value(o.input_shape), "with --init-backbone: CxHxW")
      ("embedding-size", po::value(&o.embedding_size)->default_value(o.embedding_size), "with --init-backbone: D");
  // clang-format on
}

bool parse_embedder_command_line(int argc, char** argv, po::options_description& options,
                                 const std::string& usage, int rank, EmbedderOptions& o) {
  // clang-format off
  options.add_options()
      ("batch-size", count_option(&o.batch_size), "images per rank and batch")
      ("precision", po::value<std::string>()->default_value(to_string(o.precision)), "fp32, bf16 or fp16 (autocast)")
      ("device", po::value(&o.device)->default_value(o.device), "auto, cpu or cuda")
      ("threads", po::value(&o.threads)->default_value(0), "CPU threads per rank for LibTorch (0: cores over ranks on the node)");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values, usage, rank)) return false;
  if (o.checkpoint.empty() == o.init_backbone.empty())
    throw UsageError("give one of --checkpoint and --init-backbone");
  if (!o.init_backbone.empty() && o.backbone.empty())
    throw UsageError("--init-backbone needs --backbone");
  if (o.batch_size <= 0) throw UsageError("--batch-size must be positive");
  o.precision = parse_precision(values["precision"].as<std::string>(),
                                {Precision::kFp32, Precision::kBf16, Precision::kFp16});
  return true;
}

Embedder::Embedder(ProcessContext& context, const EmbedderOptions& options)
    : context_(context), comms_(context) {
  set_torch_threads(options.threads, context.local_size());
  const torch::Device device = context.select_device(parse_device_preference(options.device));
  // fp16 refused on the CPU, as in training.
  precision_ = resolve_precision(options.precision, device);
  backbone_ = load_backbone(context, options, backbone_options_);
  backbone_->to(device);
  // The layout that training takes by default (--channels-last auto).
  backbone_->set_channels_last(use_channels_last(Toggle::kAuto, device));
  // The embedder only splits the set by rank, over MPI: embedding opens no NCCL communicator.
  setup_.comm = &comms_.mpi();
  setup_.device = device;
  setup_.batch_size = options.batch_size;
  setup_.autocast = autocast_dtype(precision_);
}

std::shared_ptr<Hdf5ImageDataset> Embedder::open_data(const std::string& path) const {
  std::shared_ptr<Hdf5ImageDataset> data;
  on_every_rank(context_, str_format("opening --data '{}'", path), [&] {
    const bool labelled = Hdf5File(path, Hdf5File::Mode::kRead).has("labels");
    data = std::make_shared<Hdf5ImageDataset>(path, labelled);
  });
  const DatasetInfo& info = data->info();
  const InputShape& input = backbone_options_.input;
  MYRIAD_CHECK_COLLECTIVE(
      info.channels == input.channels && info.height == input.height && info.width == input.width,
      "'{}' holds {}x{}x{} images, but the backbone ({}) takes {}x{}x{}", path, info.channels,
      info.height, info.width, backbone_options_.name, input.channels, input.height, input.width);
  return data;
}

double Embedder::run(const ImageSource& data, const EmbeddingPass& pass) {
  Communicator& host = comms_.mpi();
  const int64_t size = data.info().size;
  const int64_t dim = backbone_options_.embedding_size;
  const EvalSlice slice = eval_slice(size, setup_);
  const std::vector<int64_t> begins = host.all_gather_counts(slice.begin);
  std::unique_ptr<ProgressBar> progress;
  if (context_.rank() == 0) progress = std::make_unique<ProgressBar>("embedding", size);
  const auto start = std::chrono::steady_clock::now();
  // The host reads batch b + 1 while the device embeds batch b.
  const auto read = [&](int64_t b) {
    return std::async(std::launch::async, [this, &data, &slice, b] {
      // A new thread starts on GPU 0: its pinned buffer must not open a context there.
      c10::OptionalDeviceGuard guard;
      if (setup_.device.is_cuda()) guard.reset_device(setup_.device);
      return read_pixels(data, eval_batch(slice, b, setup_.batch_size), setup_);
    });
  };
  std::future<torch::Tensor> next = read(0);
  for (int64_t b = 0; b < slice.batches; ++b) {
    const int64_t n = static_cast<int64_t>(eval_batch(slice, b, setup_.batch_size).size());
    torch::Tensor rows;
    on_every_rank(context_, "embedding", [&] {
      const torch::Tensor pixels = next.get();
      if (b + 1 < slice.batches) next = read(b + 1);
      const auto f32 = torch::dtype(torch::kFloat32).device(setup_.device);
      const torch::Tensor views = n == 0 ? torch::empty({0, dim}, f32)
                                         : embed_pixels(*backbone_, pixels, setup_, pass.mirrored);
      rows =
          pass.rows(views.narrow(0, 0, n), pass.mirrored ? views.narrow(0, n, n) : torch::Tensor())
              .cpu();
    });
    const std::vector<int64_t> counts = host.all_gather_counts(n);
    const torch::Tensor all = host.gather(rows, counts, 0);
    on_every_rank(context_, pass.taking, [&] {
      if (context_.rank() != 0) return;
      int64_t from = 0;
      for (int r = 0; r < context_.size(); ++r) {
        if (counts[r] == 0) continue;
        pass.take(begins[r] + b * setup_.batch_size, all.narrow(0, from, counts[r]));
        from += counts[r];
      }
      progress->advance(from);
    });
  }
  if (progress) progress->finish();
  return seconds_since(start);
}

}  // namespace myriad
