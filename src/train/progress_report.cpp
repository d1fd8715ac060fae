#include "myriad/train/progress_report.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "myriad/comm/communicator.h"
#include "myriad/optim/loss_scaler.h"
#include "myriad/parallel/gradient_sync.h"
#include "myriad/parallel/pipeline.h"
#include "myriad/train/metrics_log.h"
#include "myriad/train/straggler_report.h"
#include "myriad/util/clock.h"
#include "myriad/util/device.h"
#include "myriad/util/format.h"
#include "myriad/util/log.h"
#include "myriad/util/phase_timer.h"

namespace myriad {

namespace {

std::string duration_text(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return str_format("{}h{:02}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return str_format("{}m{:02}s", s / 60, s % 60);
  return str_format("{}s", s);
}

}  // namespace

ProgressReport::ProgressReport(Sources sources) : s_(std::move(sources)) {}

void ProgressReport::run_started(const RunStart& e) {
  total_steps_ = e.total_steps;
  run_start_ = window_start_ = std::chrono::steady_clock::now();
}

void ProgressReport::step_finished(const StepEnd& e) {
  ++window_steps_;
  if ((e.step + 1) % s_.config.log_every == 0 || e.step + 1 == e.total_steps) write(e);
}

void ProgressReport::log_done() const {
  log_info("done: {} steps in {}", total_steps_, duration_text(seconds_since(run_start_)));
}

// A log window's figures, with its times per step.
struct ProgressReport::Window {
  double loss = 0.0;
  double elapsed = 0.0;  // seconds
  double samples_per_sec = 0.0;
  double step_ms = 0.0, data_ms = 0.0;
  double forward_ms = 0.0, backward_ms = 0.0, communication_ms = 0.0, optimizer_ms = 0.0;
  GradientSyncStats sync;
  double hidden = 0.0;  // the share of the all-reduce's time not exposed
  double eta = 0.0;     // seconds
  double tflops = 0.0;
  std::vector<int64_t> peaks;  // bytes, by rank
  int64_t memory = 0;          // the most of any rank
};

void ProgressReport::write(const StepEnd& e) {
  const Window w = measure(e);
  log_line(e, w);
  const nlohmann::json pipeline = pipeline_record(w.elapsed / window_steps_);
  const nlohmann::json loss_scale = loss_scale_record();
  write_metrics(e, w, pipeline, loss_scale);
  window_start_ = std::chrono::steady_clock::now();
  window_steps_ = 0;
  window_data_seconds_ = 0.0;
}

ProgressReport::Window ProgressReport::measure(const StepEnd& e) {
  Window w;
  w.loss = e.loss.item<double>();
  w.elapsed = seconds_since(window_start_);
  w.samples_per_sec = window_steps_ * s_.config.batch_size * s_.replicas / w.elapsed;
  std::map<std::string, double> phases = s_.timer.totals();
  s_.timer.reset();
  w.sync = s_.sync.last_stats();
  w.step_ms = 1e3 * w.elapsed / window_steps_;
  w.data_ms = 1e3 * window_data_seconds_ / window_steps_;
  w.forward_ms = phases["forward"] / window_steps_;
  w.backward_ms = phases["backward"] / window_steps_;
  w.communication_ms = phases["communication"] / window_steps_;
  w.optimizer_ms = phases["optimizer"] / window_steps_;
  w.hidden = w.sync.all_reduce_ms > 0
                 ? std::max(0.0, 1.0 - w.sync.exposed_ms / w.sync.all_reduce_ms)
                 : 1.0;
  w.eta = (total_steps_ - e.step - 1) * w.elapsed / window_steps_;
  // The backbone's rate per GPU, counted as 2 x multiply-adds and training as 3 x forward.
  w.tflops = 6.0 * s_.backbone_multiply_adds * w.samples_per_sec / s_.world / 1e12;
  // Every rank's peak: a pipeline's stages hold different blocks, so rank 0's says little. CUDA
  // graphs keep their activations in pools of their own, where they count as free between
  // replays: what the allocator holds is then the figure that runs out.
  w.peaks =
      s_.comm.all_gather_counts(s_.engine.cuda_graphs() ? peak_reserved_device_memory(s_.device)
                                                        : peak_device_memory(s_.device));
  w.memory = *std::max_element(w.peaks.begin(), w.peaks.end());
  return w;
}

void ProgressReport::log_line(const StepEnd& e, const Window& w) const {
  log_info(
      "step {}/{} epoch {} loss {:.4f} lr {:.4g} | {:.1f} samples/s | {:.1f} ms/step: data {:.1f}, "
      "forward "
      "{:.1f}, backward {:.1f}, communication {:.1f} ({:.0f}% of {:.1f} ms hidden), optimizer "
      "{:.1f} | backbone {:.1f} TFLOP/s per GPU{} | ETA {}",
      e.step + 1, total_steps_, e.epoch, w.loss, e.lr, w.samples_per_sec, w.step_ms, w.data_ms,
      w.forward_ms, w.backward_ms, w.communication_ms, 100.0 * w.hidden, w.sync.all_reduce_ms,
      w.optimizer_ms, w.tflops,
      w.memory > 0 ? " | peak memory " + format_bytes(static_cast<double>(w.memory)) +
                         (w.peaks.size() > 1 ? " (the most of any rank)" : "")
                   : "",
      duration_text(w.eta));
}

// fp16: the steps that the device skipped, counted there and read here, with the loss.
nlohmann::json ProgressReport::loss_scale_record() {
  if (s_.config.precision != Precision::kFp16) return nullptr;
  const DynamicLossScaler::Report report = s_.scaler.take_report();
  if (report.skipped_steps > 0)
    log_warn(
        "{} of the last {} steps had non-finite gradients, and every rank skipped them; "
        "the loss scale is now {}",
        report.skipped_steps, window_steps_, report.scale);
  return {{"scale", report.scale}, {"skipped_steps", report.skipped_steps}};
}

void ProgressReport::write_metrics(const StepEnd& e, const Window& w,
                                   const nlohmann::json& pipeline,
                                   const nlohmann::json& loss_scale) const {
  s_.metrics.write({{"kind", "train"},
                    {"step", e.step + 1},
                    {"epoch", e.epoch},
                    {"loss", w.loss},
                    {"lr", e.lr},
                    {"samples_per_sec", w.samples_per_sec},
                    {"step_ms", w.step_ms},
                    {"time_ms",
                     {{"data", w.data_ms},
                      {"forward", w.forward_ms},
                      {"backward", w.backward_ms},
                      {"communication", w.communication_ms},
                      {"optimizer", w.optimizer_ms}}},
                    {"all_reduce_ms", w.sync.all_reduce_ms},
                    {"communication_hidden", w.hidden},
                    {"backbone_tflops_per_gpu", w.tflops},
                    {"eta_sec", w.eta},
                    {"peak_memory_bytes", w.memory},
                    {"peak_memory_bytes_per_rank", w.peaks},
                    {"pipeline", pipeline},
                    {"loss_scale", loss_scale},
                    {"stragglers", s_.stragglers.report(e.step + 1)},
                    {"elapsed_sec", seconds_since(run_start_)}});
}

// With several stages or micro-batches: what each stage computed (busy, not waiting), the bubble
// that leaves against the schedule's ideal (GPipe's and 1F1B's (P - 1) / (M + P - 1), with v
// interleaved chunks (P - 1) / (v M + P - 1)), and the bytes sent between stages; logged by rank
// 0, recorded in the metrics. Collective.
nlohmann::json ProgressReport::pipeline_record(double step_seconds) {
  const PipelineTimes mine = s_.engine.take_times();
  const PipelineLayout& layout = s_.engine.layout();
  if (layout.stages == 1 && layout.micro_batches == 1) return nullptr;
  torch::Tensor all = torch::tensor({mine.busy_seconds / std::max<int64_t>(mine.steps, 1),
                                     mine.bytes_sent / std::max<int64_t>(mine.steps, 1)},
                                    torch::kFloat64);
  all = s_.mpi.all_gather(all.view({1, 2})).view({layout.replicas, layout.stages, 2});
  const torch::Tensor per_stage = all.mean(0);  // over replicas
  const std::vector<double>& predicted = s_.predicted_stage_ms.for_mode(s_.engine.cuda_graphs());
  std::vector<double> busy_ms;
  std::string busy_text, per_micro_batch_text, predicted_text;
  for (int s = 0; s < layout.stages; ++s) {
    const char* separator = s == 0 ? "" : ", ";
    busy_ms.push_back(1e3 * per_stage[s][0].item<double>());
    busy_text += str_format("{}{:.1f}", separator, busy_ms.back());
    per_micro_batch_text +=
        str_format("{}{:.2f}", separator, busy_ms.back() / layout.micro_batches);
    if (!predicted.empty()) predicted_text += str_format("{}{:.2f}", separator, predicted[s]);
  }
  const double mean_busy = per_stage.select(1, 0).mean().item<double>();
  const double bubble = std::max(0.0, 1.0 - mean_busy / step_seconds);
  const auto ideal_bubble = [&layout](int chunks) {
    return static_cast<double>(layout.stages - 1) /
           static_cast<double>(chunks * layout.micro_batches + layout.stages - 1);
  };
  const double ideal = ideal_bubble(layout.chunks);
  const double bytes = per_stage.select(1, 1).sum().item<double>();
  log_info(
      "pipeline: {} stage(s) x {} micro-batches ({}), stages busy {} ms of {:.1f} ms per step ({} "
      "ms per micro-batch{}): bubble {:.0f}% (ideal (P-1)/({}M+P-1) = {:.0f}%), {} sent between "
      "stages per replica and step",
      layout.stages, layout.micro_batches, schedule_name(layout.schedule), busy_text,
      1e3 * step_seconds, per_micro_batch_text,
      predicted_text.empty() ? "" : "; predicted " + predicted_text, 100.0 * bubble,
      layout.chunks == 1 ? "" : "v", 100.0 * ideal, format_bytes(bytes));
  nlohmann::json record = {{"stages", layout.stages},
                           {"micro_batches", layout.micro_batches},
                           {"schedule", schedule_name(layout.schedule)},
                           {"stage_busy_ms", busy_ms},
                           {"chunks", layout.chunks},
                           {"bubble", bubble},
                           {"ideal_bubble", ideal},
                           {"gpipe_bubble", ideal_bubble(1)},
                           {"bytes_per_step", bytes}};
  if (!predicted.empty()) record["predicted_stage_ms"] = predicted;
  return record;
}

}  // namespace myriad
