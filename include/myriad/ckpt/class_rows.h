#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>

#include "myriad/ckpt/manifest.h"

namespace myriad {

// Rows of `row_elements` float32 values that make one block of checkpoint I/O (256 MiB): the
// host memory a save or load of class rows holds at once.
int64_t rows_per_block(int64_t row_elements);

// Reads classes [begin, end) of `dataset` ("weight", "state/momentum", ...) out of whichever
// shards of `checkpoint` hold them, whatever world size wrote it, calling write(offset from begin,
// rows [n, D] float32) block by block so that host memory stays bounded. This is how a run on a
// new world size takes its rows, and how the offline tools merge and reshard. Contiguous datasets
// (myriad's own since asynchronous saves) are read around HDF5, by several threads ahead of the
// caller; with `pinned`, into page-locked blocks that a GPU copies from at full speed. A block
// stays valid until write() returns.
void read_class_rows(const std::string& checkpoint, const Manifest& manifest,
                     const std::string& dataset, int64_t begin, int64_t end,
                     const std::function<void(int64_t, const torch::Tensor&)>& write,
                     bool pinned = false);

}  // namespace myriad
