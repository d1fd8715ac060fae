#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace myriad {

// RUN_DIR/metrics.jsonl: one JSON object per line, appended and flushed line by line so that a
// killed run keeps every record it wrote. Only the rank given `active` writes.
class MetricsLog {
 public:
  MetricsLog(const std::string& path, bool active);
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
  bool active_;
};

}  // namespace myriad
