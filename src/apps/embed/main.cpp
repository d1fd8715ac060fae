// myriad-embed: the embeddings of a set of images, by a trained backbone, on any number of ranks
// (docs/insightface.md, "Extract embeddings").

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/entry.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/train/checkpoint_backbone.h"
#include "myriad/train/evaluation.h"
#include "myriad/train/train_config.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"
#include "myriad/util/progress.h"

namespace myriad {

namespace {

namespace fs = std::filesystem;

// Embeddings read back at a time for the verification accuracy (an even number: whole pairs).
constexpr int64_t kVerificationRows = 65536;

struct EmbedOptions {
  std::string checkpoint;
  std::string init_backbone;
  std::string backbone;
  std::string input_shape = "3x112x112";
  int64_t embedding_size = 512;
  std::string data;
  std::string output;
  bool flip = false;
  int64_t batch_size = 256;
  Precision precision = Precision::kFp32;
  std::string device = "auto";
  int threads = 0;
};

// The backbone, every rank's copy read by that rank (from shared storage), or the error of the
// first rank that could not.
std::shared_ptr<Backbone> load_backbone(const ProcessContext& context, const EmbedOptions& o,
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

// myriad-embed's command line into `o`, checked; false where it asked for help only.
bool parse_embed_options(const ProcessContext& context, int argc, char** argv, EmbedOptions& o) {
  po::options_description options("myriad-embed options");
  // clang-format off
  options.add_options()
      ("checkpoint", po::value(&o.checkpoint), "checkpoint directory (or a directory of them: the newest) whose backbone embeds")
      ("init-backbone", po::value(&o.init_backbone), "instead of --checkpoint: a torch.save state dict (an insightface model-zoo .pth, myriad-ckpt export-backbone's file), with --backbone")
      ("backbone", po::value(&o.backbone), "with --init-backbone: the network (r50, r100, mbf, vit_t, ...)")
      ("input-shape", po::value(&o.input_shape)->default_value(o.input_shape), "with --init-backbone: CxHxW")
      ("embedding-size", po::value(&o.embedding_size)->default_value(o.embedding_size), "with --init-backbone: D")
      ("data", po::value(&o.data)->required(), "HDF5 images (docs/data-format.md), labelled or a verification pairs file")
      ("output", po::value(&o.output)->required(), "HDF5 file to write: /embeddings [N, D] float32, L2-normalised, /indices, and /labels or /issame when the data has them")
      ("flip", po::bool_switch(&o.flip), "add the raw embedding of each image's mirror image before normalising (insightface's flip test)")
      ("batch-size", count_option(&o.batch_size), "images per rank and batch")
      ("precision", po::value<std::string>()->default_value(to_string(o.precision)), "fp32, bf16 or fp16 (autocast)")
      ("device", po::value(&o.device)->default_value(o.device), "auto, cpu or cuda")
      ("threads", po::value(&o.threads)->default_value(0), "CPU threads per rank for LibTorch (0: cores over ranks on the node)");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: mpirun -np N myriad-embed --checkpoint CKPT --data DATA.h5 "
                          "--output EMB.h5 [--flip]",
                          context.rank())) {
    return false;
  }
  if (o.checkpoint.empty() == o.init_backbone.empty())
    throw UsageError("give one of --checkpoint and --init-backbone");
  if (!o.init_backbone.empty() && o.backbone.empty())
    throw UsageError("--init-backbone needs --backbone");
  if (o.batch_size <= 0) throw UsageError("--batch-size must be positive");
  o.precision = parse_precision(values["precision"].as<std::string>(),
                                {Precision::kFp32, Precision::kBf16, Precision::kFp16});
  return true;
}

// --data, opened on every rank, of the images `backbone` takes.
std::shared_ptr<Hdf5ImageDataset> open_data(const ProcessContext& context, const std::string& path,
                                            const BackboneOptions& backbone) {
  std::shared_ptr<Hdf5ImageDataset> data;
  on_every_rank(context, str_format("opening --data '{}'", path), [&] {
    const bool labelled = Hdf5File(path, Hdf5File::Mode::kRead).has("labels");
    data = std::make_shared<Hdf5ImageDataset>(path, labelled);
  });
  const DatasetInfo& info = data->info();
  const InputShape& input = backbone.input;
  MYRIAD_CHECK_COLLECTIVE(
      info.channels == input.channels && info.height == input.height && info.width == input.width,
      "'{}' holds {}x{}x{} images, but the backbone ({}) takes {}x{}x{}", path, info.channels,
      info.height, info.width, backbone.name, input.channels, input.height, input.width);
  return data;
}

// Every rank embeds its slice of `data`; rank 0 writes --output, whose rows arrive batch by
// batch, so that memory stays bounded.
void write_embeddings(const ProcessContext& context, Communicator& host, const EmbedOptions& o,
                      const BackboneOptions& backbone_options, Backbone& backbone,
                      const Hdf5ImageDataset& data, const EvalSetup& setup) {
  const DatasetInfo& info = data.info();
  const bool labelled = data.file().has("labels");
  const bool pairs = data.file().has("issame");
  const EvalSlice slice = eval_slice(info.size, setup);
  const std::vector<int64_t> begins = host.all_gather_counts(slice.begin);
  const int64_t dim = backbone_options.embedding_size;
  std::unique_ptr<AtomicOutput> out;
  std::unique_ptr<Hdf5File> file;
  on_every_rank(context, str_format("creating '{}'", o.output), [&] {
    if (context.rank() != 0) return;
    out = std::make_unique<AtomicOutput>(o.output);
    file = std::make_unique<Hdf5File>(out->temporary_path(), Hdf5File::Mode::kCreate);
    file->create("embeddings", torch::kFloat32, {info.size, dim}, 4096);
    file->create("indices", torch::kInt64, {info.size}, 4096);
    if (labelled) file->create("labels", torch::kInt64, {info.size}, 4096);
  });
  std::unique_ptr<ProgressBar> progress;
  if (context.rank() == 0) progress = std::make_unique<ProgressBar>("embedding", info.size);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < slice.batches; ++b) {
    const std::vector<int64_t> indices = eval_batch(slice, b, o.batch_size);
    torch::Tensor embeddings = torch::empty({0, dim});
    on_every_rank(context, "embedding", [&] {
      if (indices.empty()) return;
      embeddings =
          torch::nn::functional::normalize(embed_images(backbone, data, indices, setup, o.flip),
                                           torch::nn::functional::NormalizeFuncOptions().dim(1))
              .cpu();
    });
    const int64_t n = static_cast<int64_t>(indices.size());
    torch::Tensor labels = torch::empty({n}, torch::kInt64);
    for (int64_t i = 0; i < n; ++i) labels[i] = data.label(indices[i]);
    const std::vector<int64_t> counts = host.all_gather_counts(n);
    const torch::Tensor all_embeddings = host.gather(embeddings, counts, 0);
    const torch::Tensor all_labels = host.gather(labels, counts, 0);
    on_every_rank(context, str_format("writing '{}'", o.output), [&] {
      if (context.rank() != 0) return;
      int64_t from = 0;
      for (int r = 0; r < context.size(); ++r) {
        if (counts[r] == 0) continue;
        const int64_t at = begins[r] + b * o.batch_size;
        file->write_rows("embeddings", at, all_embeddings.narrow(0, from, counts[r]));
        file->write_rows("indices", at, torch::arange(at, at + counts[r], torch::kInt64));
        if (labelled) file->write_rows("labels", at, all_labels.narrow(0, from, counts[r]));
        from += counts[r];
      }
      progress->advance(from);
    });
  }
  on_every_rank(context, str_format("writing '{}'", o.output), [&] {
    if (context.rank() != 0) return;
    progress->finish();
    if (pairs) file->write("issame", data.file().read("issame"));
    file->set_attribute("/", "data", o.data);
    file->set_attribute("/", "backbone", backbone_options.name);
    file->set_attribute("/", "weights", o.checkpoint.empty() ? o.init_backbone : o.checkpoint);
    file->set_attribute("/", "flip", static_cast<int64_t>(o.flip));
    file->flush();
    file.reset();
    out->commit();
  });
  const double seconds = seconds_since(start);
  log_info("wrote {}: {} embeddings of {} in {:.1f} s ({:.0f} images/s over {} rank(s))", o.output,
           info.size, dim, seconds, info.size / std::max(seconds, 1e-9), context.size());
}

// Rank 0 logs the 10-fold verification accuracy of the embeddings of a pairs file, read back from
// --output a block of rows at a time.
void log_verification(const ProcessContext& context, const EmbedOptions& o, int64_t images) {
  on_every_rank(context, "verification", [&] {
    if (context.rank() != 0) return;
    const std::vector<bool> issame = read_pair_labels(o.data, images);
    if (issame.size() < 10) {
      log_warn("verification: {} pairs, fewer than 10 folds need: no accuracy", issame.size());
      return;
    }
    const Hdf5File file(o.output, Hdf5File::Mode::kRead);
    std::vector<torch::Tensor> similarity;
    for (int64_t begin = 0; begin < images; begin += kVerificationRows) {
      const int64_t rows = std::min(kVerificationRows, images - begin);
      similarity.push_back(pair_similarity(file.read_rows("embeddings", begin, rows)));
    }
    const VerificationEval v = ten_fold_accuracy(torch::cat(similarity), issame);
    log_info("verification: {} pairs, accuracy {:.2f}% ± {:.2f} (10-fold, threshold {:.3f})",
             v.pairs, 100.0 * v.accuracy, 100.0 * v.std, v.threshold);
  });
}

int run(ProcessContext& context, int argc, char** argv) {
  EmbedOptions o;
  if (!parse_embed_options(context, argc, argv, o)) return kExitOk;
  set_torch_threads(o.threads, context.local_size());

  const torch::Device device = context.select_device(parse_device_preference(o.device));
  // fp16 refused on the CPU, as in training.
  const Precision precision = resolve_precision(o.precision, device);
  BackboneOptions backbone_options;
  const std::shared_ptr<Backbone> backbone = load_backbone(context, o, backbone_options);
  backbone->to(device);
  // The layout that training takes by default (--channels-last auto).
  backbone->set_channels_last(use_channels_last(Toggle::kAuto, device));
  const std::shared_ptr<Hdf5ImageDataset> data = open_data(context, o.data, backbone_options);

  CommFactory comms(context);
  EvalSetup setup;
  setup.comm = &comms.for_device(device);
  setup.device = device;
  setup.batch_size = o.batch_size;
  setup.autocast = autocast_dtype(precision);
  log_info("myriad-embed: {} images of '{}' on {} rank(s) ({}), backbone {} ({}), {}{}",
           data->info().size, o.data, context.size(), device.str(), backbone_options.name,
           o.checkpoint.empty() ? o.init_backbone : o.checkpoint, to_string(precision),
           o.flip ? ", flip test" : "");
  write_embeddings(context, comms.mpi(), o, backbone_options, *backbone, *data, setup);
  if (data->file().has("issame")) log_verification(context, o, data->info().size);
  return kExitOk;
}

}  // namespace

}  // namespace myriad

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, myriad::run);
}
