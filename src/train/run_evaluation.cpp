#include "myriad/train/run_evaluation.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "myriad/comm/hang_watchdog.h"
#include "myriad/model/backbone.h"
#include "myriad/train/metrics_log.h"
#include "myriad/util/log.h"

namespace myriad {

RunEvaluation::RunEvaluation(const EvalSets& sets, int64_t every, Backbone& backbone,
                             ShardedMarginSoftmax& classifier, EvalSetup setup, MetricsLog& metrics)
    : sets_(sets),
      every_(every),
      backbone_(backbone),
      classifier_(classifier),
      setup_(std::move(setup)),
      metrics_(metrics) {}

void RunEvaluation::step_finished(const StepEnd& e) {
  if (every_ > 0 && (e.step + 1) % every_ == 0 && e.step + 1 < e.total_steps)
    evaluate(e.step + 1, e.epoch);
}

void RunEvaluation::evaluate(int64_t step, int64_t epoch) {
  if (sets_.empty()) return;
  const LocalWork work("an evaluation");
  backbone_.eval();
  nlohmann::json record = {{"kind", "eval"}, {"step", step}, {"epoch", epoch}};
  if (sets_.val) {
    const ClassificationEval e =
        evaluate_classification(backbone_, classifier_, *sets_.val, setup_);
    const std::string knn =
        e.knn_queries > 0
            ? str_format("kNN top-1 {:.2f}% ({} queries)", 100.0 * e.knn_top1, e.knn_queries)
            : std::string("no kNN (no class has two of the set's first samples)");
    log_info("eval at step {}: top-1 {:.2f}% ({} samples), {}", step, 100.0 * e.top1, e.samples,
             knn);
    record["top1"] = e.top1;
    if (e.knn_queries > 0) {
      record["knn_top1"] = e.knn_top1;
      record["knn_queries"] = e.knn_queries;
    }
    record["samples"] = e.samples;
    last_ = e;
  }
  for (const auto& [images, issame] : sets_.pairs) {
    const VerificationEval v = evaluate_verification(backbone_, *images, issame, setup_);
    const std::string name = std::filesystem::path(images->info().name).stem().string();
    log_info("eval at step {}: {} verification accuracy {:.2f}% +- {:.2f}% ({} pairs)", step, name,
             100.0 * v.accuracy, 100.0 * v.std, v.pairs);
    record["verification"][name] = {
        {"accuracy", v.accuracy}, {"std", v.std}, {"threshold", v.threshold}};
  }
  metrics_.write(record);
  backbone_.train();
}

}  // namespace myriad
