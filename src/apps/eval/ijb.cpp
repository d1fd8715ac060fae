// myriad-eval ijb: IJB-B/C 1:1 verification of a trained backbone by insightface's protocol
// (eval_ijbc.py), on any number of ranks (docs/evaluation.md).

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/train/embedder.h"
#include "myriad/train/ijb_protocol.h"
#include "myriad/train/ijb_set.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/cli.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/file_io.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

struct IjbOptions {
  EmbedderOptions model;
  std::string data;
  std::string output;
  std::string features_output;
  std::string far_list = kIjbFars;
  std::vector<double> fars;
  bool no_flip = false;
  bool no_detector_score = false;
  IjbFeatureOptions features;
};

// The command line into `o`, checked; false where it asked for help only.
bool parse_ijb_options(const ProcessContext& context, int argc, char** argv, IjbOptions& o) {
  po::options_description options("myriad-eval ijb options");
  add_weights_options(options, o.model);
  // clang-format off
  options.add_options()
      ("data", po::value(&o.data)->required(), "IJB-B/C evaluation file (docs/data-format.md; myriad-data from-ijb writes it)")
      ("output", po::value(&o.output), "JSON report to write: target, images, templates, pairs, TAR at each FAR")
      ("features-output", po::value(&o.features_output), "HDF5 file to write: /embeddings, /embeddings_flip [N, D] (raw), /template_ids [T], /template_features [T, D] (normalised)")
      ("far", po::value(&o.far_list)->default_value(o.far_list), "false accept rates to report TAR at, a comma list")
      ("no-flip", po::bool_switch(&o.no_flip), "do not add the mirror image's raw embedding to each image's")
      ("no-detector-score", po::bool_switch(&o.no_detector_score), "do not multiply each image's feature by its detector score")
      ("normalize-images", po::bool_switch(&o.features.normalize_images), "L2-normalise each image's feature before the detector score");
  // clang-format on
  if (!parse_embedder_command_line(
          argc, argv, options,
          "usage: mpirun -np N myriad-eval ijb --data IJBC.h5 --checkpoint "
          "CKPT [--output report.json] [--features-output features.h5]",
          context.rank(), o.model)) {
    return false;
  }
  o.fars = parse_far_list(o.far_list, "--far");
  o.features.flip = !o.no_flip;
  o.features.detector_score = !o.no_detector_score;
  return true;
}

// Rank 0's outputs, created before the images are embedded, so that a path that cannot be
// written stops the run before the work; each renamed into place when complete.
struct IjbOutputs {
  std::unique_ptr<AtomicOutput> report;
  std::unique_ptr<AtomicOutput> features_output;
  std::unique_ptr<Hdf5File> features;
};

IjbOutputs create_outputs(const IjbOptions& o, int64_t images, int64_t dim) {
  IjbOutputs out;
  if (!o.output.empty()) {
    out.report = std::make_unique<AtomicOutput>(o.output);
    write_whole_file(out.report->temporary_path(), "");
  }
  if (!o.features_output.empty()) {
    out.features_output = std::make_unique<AtomicOutput>(o.features_output);
    out.features =
        std::make_unique<Hdf5File>(out.features_output->temporary_path(), Hdf5File::Mode::kCreate);
    out.features->create("embeddings", torch::kFloat32, {images, dim}, 4096);
    if (o.features.flip)
      out.features->create("embeddings_flip", torch::kFloat32, {images, dim}, 4096);
  }
  return out;
}

// The pass over the images: every rank sends each image's raw embeddings (and its mirror
// image's) to rank 0, which writes them to --features-output and adds the image's feature to its
// template's.
EmbeddingPass pooling_pass(const IjbOptions& o, const IjbSet& set, TemplatePool* pool,
                           IjbOutputs* outputs, int64_t dim, const torch::Device& device) {
  EmbeddingPass pass;
  pass.mirrored = o.features.flip;
  pass.rows = [](const torch::Tensor& raw, const torch::Tensor& mirrored) {
    return mirrored.defined() ? torch::cat({raw, mirrored}, 1) : raw;
  };
  pass.take = [&o, &set, pool, outputs, dim, device](int64_t first, const torch::Tensor& rows) {
    const torch::Tensor raw = rows.narrow(1, 0, dim).contiguous();
    torch::Tensor mirrored;
    if (o.features.flip) mirrored = rows.narrow(1, dim, dim).contiguous();
    if (outputs->features) {
      outputs->features->write_rows("embeddings", first, raw);
      if (mirrored.defined()) outputs->features->write_rows("embeddings_flip", first, mirrored);
    }
    const torch::Tensor scores = set.scores.narrow(0, first, rows.size(0));
    pool->add(first, ijb_image_features(raw.to(device),
                                        mirrored.defined() ? mirrored.to(device) : mirrored, scores,
                                        o.features));
  };
  pass.taking = o.features_output.empty() ? std::string("pooling the templates")
                                          : str_format("writing '{}'", o.features_output);
  return pass;
}

struct IjbResult {
  torch::Tensor template_features;  // [T, D] float64, L2-normalised
  std::vector<TarAtFar> points;
  double pooling_seconds = 0.0;  // the templates' features from their sums
  double scoring_seconds = 0.0;
  double roc_seconds = 0.0;
};

// The templates' features, every pair's score on `device` and TAR at each FAR.
IjbResult verify(const IjbSet& set, const TemplatePool& pool, const std::vector<double>& fars,
                 const torch::Device& device) {
  IjbResult result;
  auto start = std::chrono::steady_clock::now();
  // Each phase's device work finished before its time is read.
  const auto phase_end = [&](double& seconds) {
    synchronize_device(device);
    seconds = seconds_since(start);
    start = std::chrono::steady_clock::now();
  };
  result.template_features = pool.normalized();
  phase_end(result.pooling_seconds);
  const torch::Tensor scores = pair_scores(result.template_features, set.pair_rows);
  phase_end(result.scoring_seconds);
  result.points = tar_at_far(roc_curve(set.labels.to(device), scores), fars);
  phase_end(result.roc_seconds);
  return result;
}

void write_report(const IjbOptions& o, const IjbSet& set, const IjbResult& result,
                  AtomicOutput& report) {
  nlohmann::ordered_json json;
  json["target"] = set.target;
  json["images"] = set.images();
  json["templates"] = set.template_ids.size(0);
  json["pairs"] = set.pairs();
  json["tar_at_far"] = nlohmann::ordered_json::object();
  for (const TarAtFar& point : result.points)
    json["tar_at_far"][python_float_text(point.far)] = point.tar;
  json["options"] = {{"flip", o.features.flip},
                     {"detector_score", o.features.detector_score},
                     {"normalize_images", o.features.normalize_images}};
  json["weights"] = o.model.weights();
  write_whole_file(report.temporary_path(), json.dump(2) + "\n");
  report.commit();
}

void write_template_features(const IjbOptions& o, const IjbSet& set, const IjbResult& result,
                             IjbOutputs& out) {
  Hdf5File& file = *out.features;
  file.write("template_ids", set.template_ids);
  file.write("template_features", result.template_features.to(torch::kCPU, torch::kFloat32));
  file.set_attribute("/", "data", o.data);
  file.set_attribute("/", "weights", o.model.weights());
  file.set_attribute("/", "flip", static_cast<int64_t>(o.features.flip));
  file.set_attribute("/", "detector_score", static_cast<int64_t>(o.features.detector_score));
  file.set_attribute("/", "normalize_images", static_cast<int64_t>(o.features.normalize_images));
  file.flush();
  out.features.reset();
  out.features_output->commit();
}

// The table of TAR at each FAR, on stdout, with the ROC point each was read at.
void print_table(const IjbSet& set, const IjbResult& result) {
  std::cout << str_format("{} 1:1 verification, {} pairs ({} genuine, {} impostor):\n", set.target,
                          set.pairs(), set.genuine, set.impostors)
            << "  FAR       TAR (%)   at FPR      threshold\n";
  for (const TarAtFar& p : result.points) {
    std::cout << str_format("  {:<8} {:9.4f}   {:.3e}   {:.6f}\n", python_float_text(p.far),
                            100.0 * p.tar, p.fpr, p.threshold);
  }
  std::cout << std::flush;
}

void log_summary(const ProcessContext& context, const IjbSet& set, const IjbResult& result,
                 double embedding_seconds) {
  log_info(
      "{}: {} images, {} templates, {} pairs; embedding {:.1f} s ({:.0f} images/s over {} "
      "rank(s)), template features {:.3f} s, scoring {:.3f} s, ROC {:.3f} s",
      set.target, set.images(), set.template_ids.size(0), set.pairs(), embedding_seconds,
      set.images() / std::max(embedding_seconds, 1e-9), context.size(), result.pooling_seconds,
      result.scoring_seconds, result.roc_seconds);
}

}  // namespace

int run_ijb(ProcessContext& context, int argc, char** argv) {
  IjbOptions o;
  if (!parse_ijb_options(context, argc, argv, o)) return kExitOk;
  // Rank 0 alone pools and scores, so it alone reads the protocol.
  const bool root = context.rank() == 0;
  IjbSet set;
  on_every_rank(context, str_format("reading --data '{}'", o.data), [&] {
    if (root) set = read_ijb_set(o.data);
  });
  on_every_rank(context, "checking --far", [&] {
    if (root) check_far_reachable(o.fars, set.impostors, o.data);
  });
  Embedder embedder(context, o.model);
  const std::shared_ptr<Hdf5ImageDataset> data = embedder.open_data(o.data);
  const int64_t dim = embedder.backbone_options().embedding_size;
  IjbOutputs outputs;
  std::unique_ptr<TemplatePool> pool;
  on_every_rank(context, "creating the outputs", [&] {
    if (!root) return;
    outputs = create_outputs(o, set.images(), dim);
    pool = std::make_unique<TemplatePool>(set.template_ids.size(0), set.image_rows,
                                          media_weights(set.image_rows, set.medias), dim,
                                          embedder.device());
  });
  if (root) {
    log_info(
        "myriad-eval ijb: {} of '{}', {} images, {} templates, {} pairs, on {} rank(s) ({}), "
        "backbone {} ({}), {}, flip {}, detector score {}, normalised images {}",
        set.target, o.data, set.images(), set.template_ids.size(0), set.pairs(), context.size(),
        embedder.device().str(), embedder.backbone_options().name, o.model.weights(),
        to_string(embedder.precision()), o.features.flip ? "on" : "off",
        o.features.detector_score ? "on" : "off", o.features.normalize_images ? "on" : "off");
  }
  const double embedding_seconds =
      embedder.run(*data, pooling_pass(o, set, pool.get(), &outputs, dim, embedder.device()));
  on_every_rank(context, "verifying the pairs", [&] {
    if (!root) return;
    const IjbResult result = verify(set, *pool, o.fars, embedder.device());
    if (outputs.features) write_template_features(o, set, result, outputs);
    if (outputs.report) write_report(o, set, result, *outputs.report);
    print_table(set, result);
    log_summary(context, set, result, embedding_seconds);
  });
  return kExitOk;
}

}  // namespace myriad
