#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

struct DatasetInfo {
  std::string name;  // the file, or "synthetic"
  int64_t size = 0;  // images
  int64_t num_classes = 0;
  int height = 0;
  int width = 0;
  int channels = 0;
  bool encoded = false;  // JPEG/PNG bytes rather than raw pixels
};

// A labelled set of equally sized images, readable from several threads at once.
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual const DatasetInfo& info() const = 0;
  virtual int64_t label(int64_t index) const = 0;
  // Writes images `indices` as uint8 [n, H, W, C] into `out`.
  virtual void read(const std::vector<int64_t>& indices, uint8_t* out) const = 0;
};

}  // namespace myriad
