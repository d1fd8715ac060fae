#include "myriad/util/check_hdf5.h"

#include <algorithm>
#include <string>

#include "myriad/util/error.h"

namespace myriad::detail {

namespace {

// At most this many frames, innermost first: the outer ones repeat "can't write data" in ever
// wider words.
constexpr int kFrames = 3;

struct Frames {
  std::string text;
  int count = 0;
};

// A system call's failure reads "file write failed: time = ..., filename = ..., errno = 27, error
// message = 'File too large', buf = ..."; only its start and the system's message are kept.
std::string shortened(const std::string& desc) {
  const std::string key = "error message = '";
  const size_t at = desc.find(key);
  if (at == std::string::npos) return desc;
  const size_t end = desc.find('\'', at + key.size());
  const size_t colon = desc.find(':');
  return desc.substr(0, std::min(colon, at)) + ": " +
         desc.substr(at + key.size(),
                     end == std::string::npos ? std::string::npos : end - at - key.size());
}

herr_t collect_frame(unsigned depth, const H5E_error2_t* frame, void* out) {
  auto* frames = static_cast<Frames*>(out);
  if (frame->desc == nullptr || frame->desc[0] == '\0' || frames->count == kFrames) return 0;
  if (!frames->text.empty()) frames->text.append("; ");
  frames->text.append(shortened(frame->desc));
  ++frames->count;
  return 0;
}

}  // namespace

std::string hdf5_error_stack() {
  Frames frames;
  hid_t stack = H5Eget_current_stack();
  if (stack >= 0) {
    H5Ewalk2(stack, H5E_WALK_UPWARD, collect_frame, &frames);
    H5Eclose_stack(stack);
  }
  return frames.text.empty() ? "no HDF5 error detail" : frames.text;
}

void check_hdf5(long long rc, const std::string& context, const char* file, int line) {
  if (rc >= 0) return;
  throw_error(file, line, str_format("{}: HDF5 error: {}", context, hdf5_error_stack()));
}

}  // namespace myriad::detail
