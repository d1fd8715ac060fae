#include "myriad/util/check_hdf5.h"

#include "myriad/util/error.h"

namespace myriad::detail {

namespace {

herr_t collect_frame(unsigned depth, const H5E_error2_t* frame, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (frame->desc != nullptr && frame->desc[0] != '\0') {
    if (!text->empty()) text->append("; ");
    text->append(frame->desc);
  }
  return 0;
}

}  // namespace

std::string hdf5_error_stack() {
  std::string text;
  hid_t stack = H5Eget_current_stack();
  if (stack >= 0) {
    H5Ewalk2(stack, H5E_WALK_UPWARD, collect_frame, &text);
    H5Eclose_stack(stack);
  }
  return text.empty() ? "no HDF5 error detail" : text;
}

void check_hdf5(long long rc, const char* expr, const std::string& context, const char* file,
                int line) {
  if (rc >= 0) return;
  throw_error(file, line,
              str_format("{}: HDF5 error: {} (in {})", context, hdf5_error_stack(), expr));
}

}  // namespace myriad::detail
