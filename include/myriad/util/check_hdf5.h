#pragma once

#include <hdf5.h>

#include <string>

namespace myriad::detail {
// HDF5 reports failure as a negative id or status; its error stack holds the reason.
void check_hdf5(long long rc, const std::string& context, const char* file, int line);
std::string hdf5_error_stack();
}  // namespace myriad::detail

// `context` names what was being done (usually the file and object), since HDF5's own message
// rarely does.
#define MYRIAD_CHECK_HDF5(call, context) \
  ::myriad::detail::check_hdf5(static_cast<long long>(call), (context), __FILE__, __LINE__)
