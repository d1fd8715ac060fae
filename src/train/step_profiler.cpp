#include "myriad/train/step_profiler.h"

#include <unistd.h>

#include <filesystem>

#include "myriad/comm/hang_watchdog.h"
#include "myriad/comm/process_context.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/device.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

// Why `path` cannot take the timeline, or "" when it can.
std::string unwritable(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (fs::is_directory(file)) return "it is a directory";
  if (!fs::is_directory(dir)) return str_format("its directory '{}' does not exist", dir.string());
  if (::access(dir.c_str(), W_OK) != 0)
    return str_format("its directory '{}' is not writable", dir.string());
  return "";
}

}  // namespace

StepProfiler::StepProfiler(const ProcessContext& context, const TrainConfig& config,
                           const torch::Device& device, PipelineEngine& engine)
    : context_(context),
      device_(device),
      engine_(engine),
      first_(config.profile_first),
      last_(config.profile_last),
      path_(config.timeline) {
  if (path_.empty()) return;
  on_every_rank(context, "checking --timeline", [&] {
    if (context.rank() != 0) return;
    const std::string why = unwritable(path_);
    MYRIAD_CHECK(why.empty(), "--timeline '{}' cannot be written: {}", path_, why);
  });
  const PipelineLayout& layout = engine.layout();
  process_ = str_format("rank {}: stage {} of replica {} on {}", context.rank(), layout.stage,
                        layout.replica, context.hostname());
}

void StepProfiler::step_started(const StepStart& e) {
  const int64_t step = e.step;
  if (!profiled(step)) return;
  if (!started_) {
    // The first of the steps that this run takes (a resumed run may start inside the range).
    started_ = true;
    traced_from_ = step + 1;
    set_profiler_capture(device_, true);
    if (!path_.empty()) {
      timeline_.emplace(device_);
      engine_.set_timeline(&*timeline_);
    }
  }
  if (!timeline_) return;
  // Every rank's reference at the same moment, give or take the barrier's release.
  synchronize_device(device_);
  {
    const WaitScope wait("the timeline's barrier", "mpi", context_.size());
    MYRIAD_CHECK_MPI(MPI_Barrier(context_.world()));
  }
  timeline_->start_step(step + 1);
}

void StepProfiler::step_finished(const StepEnd& e) {
  if (!profiled(e.step) || (e.step + 1 != last_ && e.step + 1 != e.total_steps)) return;
  set_profiler_capture(device_, false);
  if (!timeline_) return;
  engine_.set_timeline(nullptr);
  write_timeline();
  timeline_.reset();
}

void StepProfiler::write_timeline() {
  const std::vector<std::string> all =
      context_.all_gather_strings(timeline_->events(context_.rank(), process_).dump());
  on_every_rank(context_, "writing the timeline", [&] {
    if (context_.rank() != 0) return;
    nlohmann::json events = nlohmann::json::array();
    for (const std::string& rank_events : all) {
      for (nlohmann::json& e : nlohmann::json::parse(rank_events)) events.push_back(std::move(e));
    }
    const nlohmann::json trace = {{"traceEvents", std::move(events)},
                                  {"displayTimeUnit", "ms"},
                                  {"otherData",
                                   {{"first_step", traced_from_},
                                    {"steps", timeline_->steps()},
                                    {"ranks", context_.size()}}}};
    write_file_atomically(path_, trace.dump());
    log_info(
        "timeline of {} step(s) from step {} on {} rank(s) written to {} (chrome://tracing or "
        "ui.perfetto.dev)",
        timeline_->steps(), traced_from_, context_.size(), path_);
  });
}

}  // namespace myriad
