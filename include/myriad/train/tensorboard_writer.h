#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace myriad {

// Scalar summaries as a TensorBoard event file, DIR/events.out.tfevents.<seconds>.<host>, written
// without TensorFlow: TFRecord framing (length, masked CRC-32C of the length, the serialized
// Event, its masked CRC-32C) around the few protobuf fields an Event with a scalar Summary needs.
// Each record is flushed, so TensorBoard sees progress live and a killed run loses nothing.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& directory);
  void add_scalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::ofstream out_;
};

// The pieces, for tests: an Event message {wall_time, step, summary {value {tag, simple_value}}},
// the first Event of a file {wall_time, file_version "brain.Event:2"}, and TFRecord framing.
std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);
std::string file_version_event(double wall_time);
std::string tfrecord(const std::string& data);

}  // namespace myriad
