#include "model_table.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "myriad/model/backbone.h"
#include "myriad/train/step_model.h"
#include "myriad/util/cli.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"
#include "text.h"

namespace myriad {

namespace {

// "8,16,1M": positive counts (parse_count's units); anything else is a UsageError naming `option`.
std::vector<int64_t> parse_counts(const std::string& text, const std::string& option) {
  std::vector<int64_t> counts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    counts.push_back(parse_count(item));
    if (counts.back() <= 0) throw UsageError(str_format("--{} must list positive counts", option));
  }
  if (counts.empty()) throw UsageError(str_format("--{} must list positive counts", option));
  return counts;
}

}  // namespace

void print_model_table(TrainConfig config, const DoctorOptions& o, int rank) {
  // The table is of GPUs that compute in bfloat16 at full speed.
  config.precision = resolve_precision(config.precision, /*fast_bfloat16=*/true);
  const std::shared_ptr<Backbone> backbone = make_backbone(backbone_options(config));
  int64_t params = 0;
  for (const torch::Tensor& t : backbone->parameters()) params += t.numel();
  const double per_image = static_cast<double>(parse_byte_size(o.activation_per_image));
  const double capacity = static_cast<double>(parse_byte_size(o.gpu_memory));
  const double across = std::min(o.host_busbw, o.gpus_per_host * o.nic_gbits / 8.0);
  const std::vector<int64_t> classes = parse_counts(o.table_classes, "table-classes");
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"GPUs"});
  for (const int64_t c : classes) rows.back().push_back("C = " + classes_text(c));
  for (const int64_t gpus : parse_counts(o.table_gpus, "table-gpus")) {
    std::vector<std::string> row = {std::to_string(gpus)};
    StepRates rates;
    rates.gemm_flops = o.gemm_tflops * 1e12;
    rates.memory_bandwidth = o.memory_tbps * 1e12;
    rates.all_reduce_busbw = (gpus <= o.gpus_per_host ? o.host_busbw : across) * kGB;
    rates.all_gather_busbw = rates.all_reduce_busbw;
    rates.collective_latency = o.latency_us * 1e-6;
    for (const int64_t c : classes) {
      StepShape shape = step_shape(config, gpus, c, params);
      shape.backbone_seconds = 6.0 * static_cast<double>(backbone->multiply_adds()) *
                               static_cast<double>(config.batch_size) / (o.backbone_tflops * 1e12);
      shape.activation_bytes = per_image * static_cast<double>(config.batch_size);
      const StepCost cost = predict_step(shape, rates);
      row.push_back(
          cost.total_memory > capacity
              ? str_format("does not fit ({:.0f} GiB)", cost.total_memory / kGiB)
              : str_format("{:.0f} ms, {:.1f} GiB", 1e3 * cost.step, cost.total_memory / kGiB));
    }
    rows.push_back(row);
  }
  if (rank != 0) return;
  std::printf(
      "# myriad-doctor --model-table: %s (%.1fM parameters, %.2fG multiply-adds per image), %lld "
      "images per GPU, D = %lld, %s, %s with %s state, sample rate %g, workspace %s, gradient "
      "all-reduce in %s\n",
      config.backbone.c_str(), static_cast<double>(params) / 1e6,
      static_cast<double>(backbone->multiply_adds()) / 1e9,
      static_cast<long long>(config.batch_size), static_cast<long long>(config.embedding_size),
      to_string(config.precision), to_string(config.optimizer),
      float_dtype_name(config.classifier_state_dtype), config.sample_rate,
      format_bytes(static_cast<double>(config.classifier_workspace)).c_str(),
      float_dtype_name(config.grad_comm_dtype));
  std::printf(
      "# machine: GEMM %g TFLOP/s, memory %g TB/s, backbone %g TFLOP/s, %d GPUs per host, "
      "all-reduce busbw %g GB/s within a host and %.3g GB/s across hosts (%g Gb/s per GPU), "
      "%g us per small collective, activations %s per image, %s per GPU\n",
      o.gemm_tflops, o.memory_tbps, o.backbone_tflops, o.gpus_per_host, o.host_busbw, across,
      o.nic_gbits, o.latency_us, format_bytes(per_image).c_str(), format_bytes(capacity).c_str());
  std::printf("# each cell: predicted step time, memory per GPU (\"does not fit\" above %s)\n",
              format_bytes(capacity).c_str());
  print_table(rows);
}

}  // namespace myriad
