#include "myriad/train/metrics_log.h"

#include "myriad/util/error.h"

namespace myriad {

MetricsLog::MetricsLog(const std::string& path, bool active, const std::string& tensorboard_dir)
    : active_(active) {
  if (!active_) return;
  out_.open(path, std::ios::app);
  MYRIAD_CHECK(out_.is_open(), "cannot open '{}' for metrics", path);
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!active_) return;
  out_ << record.dump() << '\n';
  out_.flush();
  MYRIAD_CHECK(out_.good(), "writing metrics failed (disk full?)");
  if (tensorboard_ == nullptr) return;
  const int64_t step = record.value("step", int64_t{0});
  const std::string kind = record.value("kind", std::string("metrics"));
  for (const auto& [key, value] : record.items()) {
    if (key != "kind" && key != "step") add_scalars(kind + "/" + key, value, step);
  }
}

void MetricsLog::add_scalars(const std::string& tag, const nlohmann::json& value, int64_t step) {
  if (value.is_number()) {
    tensorboard_->add_scalar(tag, value.get<double>(), step);
  } else if (value.is_object()) {
    for (const auto& [key, inner] : value.items()) add_scalars(tag + "/" + key, inner, step);
  }
}

}  // namespace myriad
