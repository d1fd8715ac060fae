#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "myriad/comm/process_context.h"
#include "myriad/train/step_model.h"
#include "myriad/util/device.h"
#include "myriad/util/format.h"
#include "text.h"

namespace myriad {

namespace {

// The step of this configuration, from the slowest rank and the bandwidth among all ranks.
struct Prediction {
  StepRates rates;
  StepCost cost;
};

Prediction predict(const Survey& s) {
  StepShape shape = step_shape(s.config, s.context.size(), s.classes, s.backbone_params);
  shape.backbone_seconds = *std::max_element(s.backbone_seconds.begin(), s.backbone_seconds.end());
  shape.activation_bytes = *std::max_element(s.activation_bytes.begin(), s.activation_bytes.end());
  shape.measured_exposed_all_reduce = s.exposed_all_reduce;
  Prediction p;
  p.rates.gemm_flops = *std::min_element(s.gemm_rate.begin(), s.gemm_rate.end());
  p.rates.memory_bandwidth = *std::min_element(s.memory_rate.begin(), s.memory_rate.end());
  p.rates.all_reduce_busbw = s.world_all_reduce;
  p.rates.all_gather_busbw = s.world_all_gather;
  p.rates.collective_latency = s.world_latency;
  p.cost = predict_step(shape, p.rates);
  return p;
}

void print_ranks(const Survey& s) {
  std::printf("# myriad-doctor: %s; %s\n", s.placement.c_str(),
              s.backend == "nccl" ? "NCCL" : "MPI (CPU tensors)");
  std::vector<std::vector<std::string>> rows = {{"rank", "host", "device", "driver / CUDA / NCCL",
                                                 "NCCL interface", "MPI interfaces", "free memory",
                                                 "needs", "backbone", "GEMM", "memory"}};
  for (int r = 0; r < s.context.size(); ++r) {
    rows.push_back(
        {std::to_string(r), s.host_of_rank[r],
         s.devices[r] + (s.uuids[r].empty() ? "" : " " + s.uuids[r]), s.versions[r],
         s.nccl_interface[r], s.mpi_interfaces[r], format_bytes(s.free_memory[r]),
         format_bytes(s.needed_memory[r]), str_format("{:.1f} ms", 1e3 * s.backbone_seconds[r]),
         str_format("{:.2f} TFLOP/s", s.gemm_rate[r] / 1e12), rate_text(s.memory_rate[r])});
  }
  print_table(rows);
}

void print_bandwidth(const Survey& s) {
  std::printf("# bandwidth: busbw as nccl-tests defines it, %s messages, %s backend\n",
              format_bytes(static_cast<double>(s.message)).c_str(), s.backend.c_str());
  const int host_count = static_cast<int>(s.hosts.size());
  for (int h = 0; h < host_count; ++h) {
    if (s.host_ranks[h] < 2) continue;
    std::printf("within %s (%d ranks): all_reduce %s, all_gather %s\n", s.hosts[h].c_str(),
                s.host_ranks[h], rate_text(s.host_all_reduce[h]).c_str(),
                rate_text(s.host_all_gather[h]).c_str());
  }
  if (s.context.size() > 1) {
    std::printf("%s (%d ranks): all_reduce %s, all_gather %s, small all_reduce %.0f us\n",
                host_count > 1 ? "across hosts" : "among all ranks", s.context.size(),
                rate_text(s.world_all_reduce).c_str(), rate_text(s.world_all_gather).c_str(),
                1e6 * s.world_latency);
  }
  for (const HostLink& link : s.links) {
    std::printf("link %s <-> %s (first ranks %d and %d, slower direction): %s (%s)\n",
                s.hosts[link.first].c_str(), s.hosts[link.second].c_str(), s.leaders[link.first],
                s.leaders[link.second], rate_text(link.rate).c_str(),
                link_class(link.rate).c_str());
  }
}

// How the backbone's step was measured: "CUDA graphs (21.0 ms replayed, 25.3 ms eager)".
std::string step_mode(const Survey& s) {
  if (s.graphs_step <= 0.0) return str_format("eager, {:.1f} ms", 1e3 * s.eager_step);
  return str_format("{} ({:.1f} ms replayed, {:.1f} ms eager{})",
                    s.graphs ? "CUDA graphs" : "eager", 1e3 * s.graphs_step, 1e3 * s.eager_step,
                    s.config.cuda_graphs == Toggle::kAuto ? ": --cuda-graphs auto's choice" : "");
}

void print_prediction(const Survey& s, const StepCost& cost) {
  const TrainConfig& config = s.config;
  std::printf(
      "# predicted step for this configuration (%s, C = %s, %lld per rank, %s, gradients in "
      "%s): %.1f ms = backbone %.1f (myriad-train's step at %lld images, slowest rank: %s) + "
      "classifier %.1f (GEMM %.1f, memory traffic %.1f) + exposed all-reduce %.1f (measured; "
      "of a modelled %.1f for %s) + features %.1f + softmax statistics %.1f\n",
      config.backbone.c_str(), classes_text(s.classes).c_str(),
      static_cast<long long>(config.batch_size), to_string(config.precision),
      float_dtype_name(config.grad_comm_dtype), 1e3 * cost.step, 1e3 * cost.backbone,
      static_cast<long long>(s.profile_batch), step_mode(s).c_str(), 1e3 * cost.classifier(),
      1e3 * cost.classifier_gemm, 1e3 * cost.classifier_memory, 1e3 * cost.exposed_all_reduce,
      1e3 * cost.grad_all_reduce, format_bytes(cost.grad_all_reduce_bytes).c_str(),
      1e3 * cost.feature_comm, 1e3 * cost.stats_comm);
  std::printf(
      "# predicted memory per rank: %s = classifier weight %s + optimizer state %s + workspace "
      "%s + backbone state %s + activations %s%s\n",
      format_bytes(cost.total_memory).c_str(), format_bytes(cost.classifier_weight_memory).c_str(),
      format_bytes(cost.classifier_state_memory).c_str(),
      format_bytes(cost.workspace_memory).c_str(), format_bytes(cost.backbone_state_memory).c_str(),
      format_bytes(cost.activation_memory).c_str(),
      s.device.is_cuda() ? "" : " (on CPUs activations count the blocks' outputs only)");
}

void print_verdict(const Survey& s, const Prediction& p) {
  const StepCost& cost = p.cost;
  const double communication = cost.communication();
  if (!(std::isfinite(cost.step) && p.rates.gemm_flops > 0.0)) {
    std::printf("verdict: none (the profile failed; see the error below)\n");
  } else if (s.context.size() > 1 && communication > 0.25 * cost.step) {
    std::printf(
        "verdict: %s %s (%s): %s at C = %s would spend %.0f ms of a %.0f ms step in "
        "communication (%.0f ms in the gradient all-reduce); %scheck NCCL_SOCKET_IFNAME\n",
        s.hosts.size() > 1 ? "across hosts" : "among the ranks",
        rate_text(p.rates.all_reduce_busbw).c_str(), link_class(p.rates.all_reduce_busbw).c_str(),
        s.config.backbone.c_str(), classes_text(s.classes).c_str(), 1e3 * communication,
        1e3 * cost.step, 1e3 * cost.exposed_all_reduce,
        s.config.grad_comm_dtype == torch::kFloat32 ? "set --grad-comm-dtype bf16 or " : "");
  } else {
    std::printf(
        "verdict: compute-bound: backbone and classifier take %.0f%% of the predicted %.1f ms "
        "step\n",
        100.0 * (cost.backbone + cost.classifier()) / cost.step, 1e3 * cost.step);
  }
}

// A row per check: passed, FAILED with its lines, skipped with the reason.
void print_checks(const std::vector<CheckOutcome>& outcomes) {
  std::printf("# checks\n");
  std::vector<std::vector<std::string>> rows = {{"check", "result"}};
  for (const CheckOutcome& outcome : outcomes) {
    std::vector<std::string> lines[3];  // by Severity: warnings, errors, skipped
    for (const Finding& f : outcome.findings) lines[static_cast<int>(f.severity)].push_back(f.line);
    std::string result = "passed";
    if (!lines[static_cast<int>(Severity::kError)].empty()) {
      result = "FAILED: " + join(lines[static_cast<int>(Severity::kError)], "; ");
    } else if (!lines[static_cast<int>(Severity::kSkipped)].empty()) {
      result = "skipped: " + join(lines[static_cast<int>(Severity::kSkipped)], "; ");
    } else if (!lines[static_cast<int>(Severity::kWarning)].empty()) {
      result = "passed, with a warning (below)";
    }
    rows.push_back({outcome.name, result});
  }
  print_table(rows);
}

}  // namespace

void print_report(const Survey& s, const std::vector<CheckOutcome>& outcomes) {
  print_ranks(s);
  // Without NCCL nothing was measured between the ranks, and nothing can be predicted.
  const bool measured = s.shared_gpus.empty();
  if (measured) {
    print_bandwidth(s);
  } else {
    std::printf("# bandwidth: not measured (ranks share a GPU, which NCCL refuses)\n");
  }
  std::printf("# run directory: %s\n", join(s.directories, "; ").c_str());
  const Prediction prediction = predict(s);
  if (measured) print_prediction(s, prediction.cost);
  print_checks(outcomes);
  for (const CheckOutcome& outcome : outcomes) {
    for (const Finding& f : outcome.findings) {
      if (f.severity == Severity::kWarning) std::printf("warning: %s\n", f.line.c_str());
    }
  }
  if (s.config.pipeline_stages > 1)
    std::printf("warning: the prediction assumes one pipeline stage\n");
  if (measured) {
    print_verdict(s, prediction);
  } else {
    std::printf("verdict: none (ranks share a GPU: see the failed check)\n");
  }
  std::fflush(stdout);
}

}  // namespace myriad
