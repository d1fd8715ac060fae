#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <string>

#include "myriad/train/tensorboard_writer.h"

namespace myriad {

// RUN_DIR/metrics.jsonl: one JSON object per line, appended and flushed line by line so that a
// killed run keeps every record it wrote. Only the rank given `active` writes. With a
// `tensorboard_dir`, every number of a record also becomes a TensorBoard scalar at the record's
// step, tagged by kind and path: "train/loss", "train/time_ms/forward",
// "eval/verification/lfw/accuracy".
class MetricsLog {
 public:
  MetricsLog(const std::string& path, bool active, const std::string& tensorboard_dir = "");
  void write(const nlohmann::json& record);

 private:
  void add_scalars(const std::string& tag, const nlohmann::json& value, int64_t step);

  std::ofstream out_;
  bool active_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace myriad
