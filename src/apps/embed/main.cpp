// myriad-embed: the embeddings of a set of images, by a trained backbone, on any number of ranks
// (docs/insightface.md, "Extract embeddings").

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "myriad/comm/entry.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/train/embedder.h"
#include "myriad/train/evaluation.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

// Embeddings read back at a time for the verification accuracy (an even number: whole pairs).
constexpr int64_t kVerificationRows = 65536;

struct EmbedOptions {
  EmbedderOptions model;
  std::string data;
  std::string output;
  bool flip = false;
};

// myriad-embed's command line into `o`, checked; false where it asked for help only.
bool parse_embed_options(const ProcessContext& context, int argc, char** argv, EmbedOptions& o) {
  po::options_description options("myriad-embed options");
  add_weights_options(options, o.model);
  // clang-format off
  options.add_options()
      ("data", po::value(&o.data)->required(), "HDF5 images (docs/data-format.md), labelled or a verification pairs file")
      ("output", po::value(&o.output)->required(), "HDF5 file to write: /embeddings [N, D] float32, L2-normalised, /indices, and /labels or /issame when the data has them")
      ("flip", po::bool_switch(&o.flip), "add the raw embedding of each image's mirror image before normalising (insightface's flip test)");
  // clang-format on
  return parse_embedder_command_line(argc, argv, options,
                                     "usage: mpirun -np N myriad-embed --checkpoint CKPT --data "
                                     "DATA.h5 --output EMB.h5 [--flip]",
                                     context.rank(), o.model);
}

// Every rank embeds its slice of `data`; rank 0 writes --output, whose rows arrive batch by
// batch, so that memory stays bounded.
void write_embeddings(const ProcessContext& context, const EmbedOptions& o, Embedder& embedder,
                      const Hdf5ImageDataset& data) {
  const DatasetInfo& info = data.info();
  const bool labelled = data.file().has("labels");
  const bool pairs = data.file().has("issame");
  const int64_t dim = embedder.backbone_options().embedding_size;
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
  const auto start = std::chrono::steady_clock::now();
  EmbeddingPass pass;
  pass.mirrored = o.flip;
  pass.rows = [](const torch::Tensor& raw, const torch::Tensor& mirrored) {
    return torch::nn::functional::normalize(mirrored.defined() ? raw + mirrored : raw,
                                            torch::nn::functional::NormalizeFuncOptions().dim(1));
  };
  pass.take = [&](int64_t first, const torch::Tensor& rows) {
    const int64_t n = rows.size(0);
    const torch::Tensor indices = torch::arange(first, first + n, torch::kInt64);
    file->write_rows("embeddings", first, rows);
    file->write_rows("indices", first, indices);
    if (!labelled) return;
    std::vector<int64_t> labels;
    for (int64_t i = first; i < first + n; ++i) labels.push_back(data.label(i));
    file->write_rows("labels", first, torch::tensor(labels, torch::kInt64));
  };
  pass.taking = str_format("writing '{}'", o.output);
  embedder.run(data, pass);
  on_every_rank(context, pass.taking, [&] {
    if (context.rank() != 0) return;
    if (pairs) file->write("issame", data.file().read("issame"));
    file->set_attribute("/", "data", o.data);
    file->set_attribute("/", "backbone", embedder.backbone_options().name);
    file->set_attribute("/", "weights", o.model.weights());
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
  Embedder embedder(context, o.model);
  const std::shared_ptr<Hdf5ImageDataset> data = embedder.open_data(o.data);
  log_info("myriad-embed: {} images of '{}' on {} rank(s) ({}), backbone {} ({}), {}{}",
           data->info().size, o.data, context.size(), embedder.device().str(),
           embedder.backbone_options().name, o.model.weights(), to_string(embedder.precision()),
           o.flip ? ", flip test" : "");
  write_embeddings(context, o, embedder, *data);
  if (data->file().has("issame")) log_verification(context, o, data->info().size);
  return kExitOk;
}

}  // namespace

}  // namespace myriad

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, myriad::run);
}
