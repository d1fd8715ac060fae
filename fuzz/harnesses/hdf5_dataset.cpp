// myriad's checks of an HDF5 image dataset (docs/data-format.md), on files built from fuzzed
// structure: which datasets exist, their dtypes, ranks and declared sizes (which may be far
// larger than what is written), the attributes and their types, the labels, and the rows a batch
// asks for. libhdf5's own parsing of file bytes is not the target.

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz_input.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/image_codec.h"
#include "myriad/util/hdf5_file.h"

namespace {

using myriad::Hdf5File;
using myriad::fuzz::FuzzInput;

// A declared size: the written one, or up to 2^40 rows more (libhdf5 itself crashes writing
// chunks of datasets declared near 2^63 rows; its internals are not the target).
int64_t declared(FuzzInput& in, int64_t written) {
  const int64_t n = in.flag() ? in.number() : written;
  return n >= written ? std::min(n, int64_t{1} << 40) : written;
}

void attribute(FuzzInput& in, Hdf5File& file, const std::string& key) {
  switch (in.below(4)) {
    case 0:
      break;
    case 1:
      file.set_attribute("/", key, in.number());
      break;
    case 2:
      file.set_attribute("/", key, in.bytes(in.below(8)));
      break;
    default:
      file.set_attribute("/", key, static_cast<double>(in.number()) / 3.0);
  }
}

void build(FuzzInput& in, const std::string& path) {
  Hdf5File file(path, Hdf5File::Mode::kCreate);
  const int64_t n = static_cast<int64_t>(in.below(6));
  switch (in.below(4)) {
    case 0: {  // raw uint8 [N, H, W, C], chunked by row
      const int64_t h = in.flag() ? in.number() : 1 + static_cast<int64_t>(in.below(8));
      const int64_t w = 1 + static_cast<int64_t>(in.below(8));
      const int64_t c = static_cast<int64_t>(in.below(5));
      file.create("images", torch::kUInt8, {declared(in, n), h, w, c}, 1);
      if (h > 0 && h <= 8 && c > 0) {
        const std::string pixels = in.bytes(static_cast<size_t>(n * h * w * c));
        torch::Tensor rows = torch::zeros({n, h, w, c}, torch::kUInt8);
        if (!pixels.empty()) std::memcpy(rows.data_ptr(), pixels.data(), pixels.size());
        file.write_rows("images", 0, rows);
      }
      break;
    }
    case 1: {  // encoded: one byte string per image
      file.create_bytes("images", declared(in, n), 1);
      std::vector<std::string> images;
      for (int64_t i = 0; i < n; ++i) images.push_back(in.bytes(in.below(64)));
      file.write_bytes("images", 0, images);
      break;
    }
    case 2: {  // numeric of another dtype or rank
      const torch::ScalarType dtype = in.flag() ? torch::kFloat32 : torch::kInt32;
      std::vector<int64_t> shape(in.below(6), 2);
      file.create("images", dtype, shape, shape.empty() ? 0 : 1);
      break;
    }
    default:
      break;
  }
  for (const char* key : {"height", "width", "channels"}) attribute(in, file, key);
  switch (in.below(4)) {
    case 0: {  // int64 [N] or declared larger, values from the input
      file.create("labels", in.flag() ? torch::kInt64 : torch::kInt32, {declared(in, n)}, 4);
      torch::Tensor labels = torch::empty({n}, torch::kInt64);
      for (int64_t i = 0; i < n; ++i) labels[i] = in.number();
      file.write_rows("labels", 0, labels.to(file.dtype("labels")));
      break;
    }
    case 1:
      file.write("labels", torch::zeros({n, 2}, torch::kInt64));
      break;
    case 2:
      file.write("labels", torch::rand({n}));
      break;
    default:
      break;
  }
  attribute(in, file, "num_classes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  FuzzInput in(data, size);
  const std::string path = fuzz::scratch_directory() + "/data.h5";
  try {
    build(in, path);
  } catch (const Error&) {
    return 0;  // a structure the writer itself refuses
  }
  const bool labelled = in.flag();
  const int64_t resident = in.flag() ? Hdf5ImageDataset::kResidentBytes : 0;
  std::vector<int64_t> batch;
  for (uint64_t k = in.below(5); k > 0; --k) batch.push_back(in.number());
  fuzz::expect_clean([&] {
    const Hdf5ImageDataset dataset(path, labelled, resident);
    const DatasetInfo& info = dataset.info();
    // What the loader relies on once the dataset opened.
    if (info.height < 1 || info.width < 1 || info.height > kMaxImageSide ||
        info.width > kMaxImageSide || (info.channels != 1 && info.channels != 3) || info.size < 0) {
      __builtin_trap();
    }
    for (int64_t i = 0; i < std::min<int64_t>(info.size, 64); ++i) {
      if (dataset.label(i) < 0 || (labelled && dataset.label(i) >= info.num_classes)) {
        __builtin_trap();
      }
    }
    const int64_t image = int64_t{info.height} * info.width * info.channels;
    if (image * static_cast<int64_t>(batch.size()) > (int64_t{16} << 20)) return;
    std::vector<uint8_t> out(static_cast<size_t>(image) * batch.size());
    dataset.read(batch, out.data());
  });
  return 0;
}
