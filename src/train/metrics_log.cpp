#include "myriad/train/metrics_log.h"

#include "myriad/util/error.h"

namespace myriad {

MetricsLog::MetricsLog(const std::string& path, bool active) : active_(active) {
  if (!active_) return;
  out_.open(path, std::ios::app);
  MYRIAD_CHECK(out_.is_open(), "cannot open '{}' for metrics", path);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!active_) return;
  out_ << record.dump() << '\n';
  out_.flush();
  MYRIAD_CHECK(out_.good(), "writing metrics failed (disk full?)");
}

}  // namespace myriad
