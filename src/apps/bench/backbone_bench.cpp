// myriad-bench backbone: the backbone's forward and backward as training runs them (its layout
// and autocast precision, fresh gradients every step), timed, beside the floor that its layers'
// FLOPs and bytes set at this device's measured ceilings (model/roofline.h). Each rank times its
// own copy; gradients are not all-reduced.

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "bench_commands.h"
#include "bench_common.h"
#include "myriad/comm/device_selection.h"
#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"
#include "myriad/model/roofline.h"
#include "myriad/train/train_config.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/autocast.h"
#include "myriad/util/cli.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/format.h"

namespace myriad {

namespace {

struct BackboneBenchOptions {
  BackboneOptions net;
  int64_t batch = 256;
  Precision precision = Precision::kAuto;
  Toggle channels_last = Toggle::kAuto;
  Toggle cudnn_benchmark = Toggle::kAuto;
  Toggle conv_statistics = Toggle::kOff;
  Toggle output_sums = Toggle::kOn;
  Toggle backward_folds = Toggle::kOn;
  Toggle grouped_casts = Toggle::kOn;
  std::string device = "auto";
  std::string csv;
  int steps = 20, warmup = 5;
  bool split_backward = false;
};

// `argv` into `b`, checked; false where it asked for help only.
bool parse_backbone_options(const ProcessContext& context, int argc, char** argv,
                            BackboneBenchOptions& b) {
  po::options_description options("backbone options");
  std::string shape_text, precision_text, layout_text, benchmark_text, statistics_text, sums_text,
      folds_text, casts_text;
  // clang-format off
  options.add_options()
      ("backbone", po::value(&b.net.name)->default_value(b.net.name), "the network (myriad-train's names)")
      ("input-shape", po::value(&shape_text)->default_value("3x112x112"), "CxHxW of the images")
      ("embedding-size", po::value(&b.net.embedding_size)->default_value(b.net.embedding_size), "embedding size D")
      ("batch-size", count_option(&b.batch), "images per rank")
      ("precision", po::value(&precision_text)->default_value(to_string(b.precision)), "auto (bf16 on GPUs that compute in it at full speed, else fp32), fp32, bf16 or fp16, as myriad-train")
      ("channels-last", po::value(&layout_text)->default_value(to_string(b.channels_last)), "convolutions in channels-last (NHWC) layout: auto (on GPUs), on or off, as myriad-train")
      ("cudnn-benchmark", po::value(&benchmark_text)->default_value(to_string(b.cudnn_benchmark)), "cuDNN times each convolution shape's engines once and keeps the fastest: auto (on GPUs), on or off, as myriad-train")
      ("conv-statistics", po::value(&statistics_text)->default_value(to_string(b.conv_statistics)), "batch norm's statistics formed in the epilogues of the convolutions before them (cuDNN's graph API): off, auto or on, as myriad-train")
      ("output-sums", po::value(&sums_text)->default_value(to_string(b.output_sums)), "a block sums its output for the next block's batch norm, which then makes no statistics pass of its own: on (auto, myriad-train's route) or off")
      ("backward-folds", po::value(&folds_text)->default_value(to_string(b.backward_folds)), "with the output sums, a block's last batch norm has its backward sums formed by the next batch norm's backward, in the pass that writes its gradient: on (auto, myriad-train's route) or off")
      ("grouped-casts", po::value(&casts_text)->default_value(to_string(b.grouped_casts)), "under bf16 or fp16, the convolutions' weights cast together, and their gradients back, in one pass each: on (auto, myriad-train's route on one replica) or off (autocast's cast per weight)")
      ("steps", po::value(&b.steps)->default_value(b.steps), "timed steps")
      ("warmup", po::value(&b.warmup)->default_value(b.warmup), "untimed steps first")
      ("csv", po::value(&b.csv), "also write the roofline per layer kind to this CSV file (rank 0)")
      ("split-backward", po::bool_switch(&b.split_backward), "the images require a gradient, as a later pipeline stage's input does, and the backward is also timed split as zero-bubble schedules (ZB-H1) split it: the input's gradient, then the weights'")
      ("device", po::value(&b.device)->default_value(b.device), "auto, cpu or cuda");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: [mpirun -np W] myriad-bench backbone [options]",
                          context.rank())) {
    return false;
  }
  if (b.steps < 1 || b.warmup < 0 || b.batch < 1 || b.net.embedding_size < 1) {
    throw UsageError(
        "--steps, --batch-size and --embedding-size must be positive, --warmup non-negative");
  }
  b.net.input = parse_input_shape(shape_text);
  b.precision = parse_precision(
      precision_text, {Precision::kAuto, Precision::kFp32, Precision::kBf16, Precision::kFp16});
  b.channels_last = parse_toggle("channels-last", layout_text);
  b.cudnn_benchmark = parse_toggle("cudnn-benchmark", benchmark_text);
  b.conv_statistics = parse_toggle("conv-statistics", statistics_text);
  b.output_sums = parse_toggle("output-sums", sums_text);
  b.backward_folds = parse_toggle("backward-folds", folds_text);
  b.grouped_casts = parse_toggle("grouped-casts", casts_text);
  return true;
}

// The backbone in training mode on a fixed batch of random images (with --split-backward, a leaf
// that requires a gradient).
class Subject {
 public:
  Subject(const BackboneBenchOptions& b, const torch::Device& device, Precision precision)
      : device_(device), autocast_(autocast_dtype(precision)) {
    backbone_ = make_backbone(b.net);
    backbone_->to(device);
    backbone_->set_channels_last(use_channels_last(b.channels_last, device));
    backbone_->set_output_sums(b.output_sums != Toggle::kOff);
    backbone_->set_grouped_weight_casts(b.grouped_casts != Toggle::kOff);
    backbone_->train();
    const InputShape& s = b.net.input;
    images_ = backbone_->in_layout(
        torch::randn({b.batch, s.channels, s.height, s.width}, torch::device(device)));
    images_.requires_grad_(b.split_backward);
    for (const torch::Tensor& p : backbone_->parameters())
      if (p.requires_grad()) trained_.push_back(p);
  }

  // The embeddings, with the graph that backward runs.
  torch::Tensor forward() {
    const AutocastGuard autocast(device_, autocast_);
    return backbone_->forward(images_);
  }

  void step() {
    clear_gradients();
    loss().backward();
  }
  // The backward split as ZB-H1 splits it, in eager autograd: the input's gradient alone, then
  // (with `weights`) the parameters' from the same graph.
  void split_step(bool weights) {
    clear_gradients();
    const torch::Tensor l = loss();
    torch::autograd::grad({l}, {images_}, {}, /*retain_graph=*/weights);
    if (weights) torch::autograd::backward({l}, {}, false, false, trained_);
  }

  const Backbone& backbone() const { return *backbone_; }

  // The largest difference between the weights' gradients of the split backward and of one
  // backward, relative to the largest gradient: float noise unless the split drops a gradient.
  // A parameter that this forward leaves unused (a ViT's mask token) has no gradient: zero.
  double split_difference() {
    const auto gradients = [this] {
      std::vector<torch::Tensor> flat;
      for (const torch::Tensor& p : trained_) {
        const torch::Tensor g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
        flat.push_back(g.reshape(-1).to(torch::kFloat64));
      }
      return torch::cat(flat);
    };
    step();
    const torch::Tensor whole = gradients();
    split_step(true);
    return ((gradients() - whole).abs().max() / whole.abs().max()).item<double>();
  }

 private:
  torch::Tensor loss() { return forward().to(torch::kFloat32).square().mean(); }
  void clear_gradients() {
    for (torch::Tensor& p : backbone_->parameters()) p.mutable_grad() = torch::Tensor();
    if (images_.requires_grad()) images_.mutable_grad() = torch::Tensor();
  }

  torch::Device device_;
  std::optional<torch::ScalarType> autocast_;
  std::shared_ptr<Backbone> backbone_;
  std::vector<torch::Tensor> trained_;  // the parameters that take gradients
  torch::Tensor images_;
};

struct Timing {
  RankSpread step_ms, forward_ms;
  RankSpread input_grad_ms, split_ms;  // with --split-backward: forward + B, and forward + B + W
  double split_difference = 0;         // ... and its gradients against one backward's
  double peak_bytes = 0;
};

// Collective: whole steps, then forwards alone (their graphs dropped), per rank.
Timing time_subject(const ProcessContext& context, Subject& subject, const BackboneBenchOptions& b,
                    const torch::Device& device) {
  for (int i = 0; i < b.warmup; ++i) subject.step();
  Timing t;
  t.step_ms = spread_over_ranks(
      1e3 * seconds_per_call(context, device, b.steps, [&] { subject.step(); }), context);
  t.forward_ms = spread_over_ranks(
      1e3 * seconds_per_call(context, device, b.steps, [&] { subject.forward(); }), context);
  if (b.split_backward) {
    const auto ms = [&](bool weights) {
      return spread_over_ranks(
          1e3 * seconds_per_call(context, device, b.steps, [&] { subject.split_step(weights); }),
          context);
    };
    t.input_grad_ms = ms(false);
    t.split_ms = ms(true);
    t.split_difference = subject.split_difference();
  }
  t.peak_bytes = spread_over_ranks(static_cast<double>(peak_device_memory(device)), context).max;
  return t;
}

void print_roofline(const std::vector<KindFloor>& kinds, double step_seconds) {
  std::printf("roofline per layer kind (forward + backward, one rank's step):\n");
  std::printf("  %-20s %6s %10s %9s %11s %10s %9s\n", "kind", "layers", "GFLOP", "GB", "compute ms",
              "memory ms", "floor ms");
  for (const KindFloor& k : kinds) {
    std::printf("  %-20s %6lld %10.1f %9.2f %11.3f %10.3f %9.3f\n", to_string(k.kind),
                static_cast<long long>(k.layers), k.flops / 1e9, k.bytes / 1e9,
                k.compute_seconds * 1e3, k.memory_seconds * 1e3, k.floor_seconds * 1e3);
  }
  const double floor = floor_seconds(kinds);
  std::printf("step floor: %.3f ms; the measured step is %.2fx its floor\n", floor * 1e3,
              step_seconds / floor);
}

// Whether rank 0 can create `path` (its folder exists and is writable): checked before the
// benchmark, so that a bad path fails at once rather than after it.
bool can_create(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string folder = parent.empty() ? "." : parent.string();
  return std::filesystem::is_directory(folder) && access(folder.c_str(), W_OK) == 0 &&
         !std::filesystem::is_directory(path);
}

void write_csv(const std::string& path, const std::vector<KindFloor>& kinds, double step_ms) {
  std::ostringstream out;
  out << std::setprecision(9)
      << "kind,layers,gflop,gbytes,compute_ms,memory_ms,floor_ms,measured_ms\n";
  for (const KindFloor& k : kinds) {
    out << to_string(k.kind) << ',' << k.layers << ',' << k.flops / 1e9 << ',' << k.bytes / 1e9
        << ',' << k.compute_seconds * 1e3 << ',' << k.memory_seconds * 1e3 << ','
        << k.floor_seconds * 1e3 << ",\n";
  }
  out << "step,,,,,," << floor_seconds(kinds) * 1e3 << ',' << step_ms << '\n';
  write_file_atomically(path, out.str());
}

// The output sums' switch and the route one forward took: how many outputs were summed for the
// batch norm after them, how many batch norms made a statistics pass of their own, and how many
// have their backward sums folded into the next one's backward.
std::string output_sums_route(bool on, const BatchNormRouteCount& route) {
  const char* const state = on ? "on" : "off";
  if (route.statistics_passes + route.output_sums == 0)
    return str_format("{} (no batch norm kernel of ours ran)", state);
  return str_format("{} (formed for {} batch norms; {} statistics passes; {} backward sums folded)",
                    state, route.output_sums, route.statistics_passes, route.backward_folds);
}

// How a training forward casts the convolutions' weights: not at all in float32, else together
// (the groups) or one by one, autocast's way.
std::string weight_casts_route(const Backbone& net, Precision precision) {
  if (precision == Precision::kFp32) return "none (float32)";
  const std::string note = net.weight_casts_note();
  return note.empty() ? "autocast's, one per weight" : note;
}

// What a run chose and measured, for its report.
struct Findings {
  Precision precision = Precision::kFp32;
  const char* algorithms = "";
  Ceilings ceilings;
  std::vector<KindFloor> kinds;
  BatchNormRouteCount route;
  Timing timing;
};

void report(const BackboneBenchOptions& b, const Subject& subject, const Findings& f, int world,
            const torch::Device& device) {
  const Precision precision = f.precision;
  const Ceilings& ceilings = f.ceilings;
  const Timing& t = f.timing;
  const InputShape& s = b.net.input;
  const Backbone& net = subject.backbone();
  std::printf(
      "# backbone %s: %lld images of %lldx%lldx%lld per rank, %s, %s, device %s, %d rank(s), "
      "batch norm in %s, statistics from the convolutions: %s, output sums: %s, weight casts: %s, "
      "%s\n",
      b.net.name.c_str(), static_cast<long long>(b.batch), static_cast<long long>(s.channels),
      static_cast<long long>(s.height), static_cast<long long>(s.width), to_string(precision),
      net.channels_last() ? "channels-last" : "NCHW", device.str().c_str(), world,
      batch_norm_kernels(device, false, net.channels_last()),
      convolution_statistics_state().c_str(), output_sums_route(net.output_sums(), f.route).c_str(),
      weight_casts_route(net, precision).c_str(), f.algorithms);
  std::printf("ceilings measured: %s GEMM %.4g TFLOP/s, memory %.4g GB/s\n",
              c10::toString(compute_dtype(precision)), ceilings.gemm_tflops,
              ceilings.memory_bandwidth / 1e9);
  // On the CPU the ceilings are a 1024^3 product and a 64 MiB copy on this process's threads, which
  // oneDNN's convolutions beat: there the floor checks the arithmetic, not the machine.
  if (!device.is_cuda())
    std::printf("on the CPU these ceilings are no bound (oneDNN's convolutions beat them)\n");
  const double step_s = t.step_ms.avg / 1e3;
  const double tflops = 6.0 * static_cast<double>(net.multiply_adds()) * b.batch / step_s / 1e12;
  std::printf(
      "step: %.3f ms per rank (max %.3f; forward %.3f, backward %.3f), %.0f samples/s per rank, "
      "%.4g TFLOP/s counted as 3 x forward (%.1f%% of the GEMM ceiling)\n",
      t.step_ms.avg, t.step_ms.max, t.forward_ms.avg, t.step_ms.avg - t.forward_ms.avg,
      b.batch / step_s, tflops, 100.0 * tflops / ceilings.gemm_tflops);
  if (b.split_backward) {
    const double backward = t.step_ms.avg - t.forward_ms.avg;
    const double input = t.input_grad_ms.avg - t.forward_ms.avg;
    const double weights = t.split_ms.avg - t.input_grad_ms.avg;
    std::printf(
        "backward split as ZB-H1 splits it (eager autograd): the input's gradient %.3f ms, the "
        "weights' after it %.3f ms; together %.3f ms against %.3f ms for one backward (%+.0f%%); "
        "their gradients %.2g of the largest apart\n",
        input, weights, input + weights, backward, 100.0 * ((input + weights) / backward - 1.0),
        t.split_difference);
  }
  if (device.is_cuda())
    std::printf("peak memory per rank: %s\n", format_bytes(t.peak_bytes).c_str());
  print_roofline(f.kinds, step_s);
}

}  // namespace

int run_backbone_bench(ProcessContext& context, int argc, char** argv) {
  BackboneBenchOptions b;
  if (!parse_backbone_options(context, argc, argv, b)) return kExitOk;
  if (!context.all_true(b.csv.empty() || context.rank() != 0 || can_create(b.csv)))
    throw UsageError("--csv: cannot create '" + b.csv + "' (no such folder, or not writable)");
  const torch::Device device = context.select_device(parse_device_preference(b.device));
  Findings f;
  f.precision = resolve_precision(b.precision, device);
  f.algorithms =
      use_convolution_engines(convolution_engines(false, b.cudnn_benchmark, device), device);
  use_backward_folds(b.backward_folds != Toggle::kOff);
  use_convolution_statistics(convolution_statistics(
      {b.conv_statistics, false, f.precision, use_channels_last(b.channels_last, device), false},
      device));
  f.ceilings = measure_ceilings(device, compute_dtype(f.precision));
  std::unique_ptr<Subject> subject;
  const std::string what = str_format("{} at {} images per rank", b.net.name, b.batch);
  fits_on_every_rank(context, what, "use a smaller --batch-size", [&] {
    subject = std::make_unique<Subject>(b, device, f.precision);
    // One forward's graph, as the timed steps build it, and the batch norms' route in it.
    const BatchNormRouteCount before = batch_norm_route_count();
    f.kinds = roofline(layer_census(subject->forward()), f.ceilings);
    f.route = batch_norm_route_count() - before;
    subject->step();
    // What holds the most of any later call: the split backward keeps the forward's graph for a
    // second pass, and the comparison keeps both backwards' gradients in float64.
    if (b.split_backward) subject->split_difference();
    synchronize_device(device);
  });
  f.timing = time_subject(context, *subject, b, device);
  if (context.rank() == 0) {
    report(b, *subject, f, context.size(), device);
    if (!b.csv.empty()) write_csv(b.csv, f.kinds, f.timing.step_ms.avg);
  }
  return kExitOk;
}

}  // namespace myriad
