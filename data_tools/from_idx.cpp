// myriad-data from-idx: MNIST-style IDX image and label files into a raw HDF5 dataset.

#include <algorithm>

#include "data_commands.h"
#include "myriad/comm/process_context.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/idx_file.h"
#include "myriad/util/cli.h"
#include "myriad/util/error.h"
#include "myriad/util/exit_codes.h"
#include "myriad/util/log.h"
#include "myriad/util/progress.h"

namespace myriad {

int run_from_idx(ProcessContext& context, int argc, char** argv) {
  po::options_description options("from-idx options");
  std::string images_path, labels_path, output;
  // clang-format off
  options.add_options()
      ("images", po::value(&images_path)->required(), "IDX images, uint8 [N, rows, cols] (e.g. train-images-idx3-ubyte.gz)")
      ("labels", po::value(&labels_path)->required(), "IDX labels, uint8 [N]")
      ("output", po::value(&output)->required(), "HDF5 file to write");
  // clang-format on
  po::variables_map values;
  if (!parse_command_line(argc, argv, options, values,
                          "usage: myriad-data from-idx --images X-images-idx3-ubyte.gz --labels "
                          "X-labels-idx1-ubyte.gz "
                          "--output X.h5",
                          context.rank())) {
    return kExitOk;
  }
  const IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);
  MYRIAD_CHECK(images.dims.size() == 3,
               "'{}' holds a {}-dimensional array; IDX images are [N, rows, cols]", images_path,
               images.dims.size());
  MYRIAD_CHECK(labels.dims.size() == 1, "'{}' holds a {}-dimensional array; IDX labels are [N]",
               labels_path, labels.dims.size());
  MYRIAD_CHECK(images.dims[0] == labels.dims[0], "'{}' has {} images but '{}' has {} labels",
               images_path, images.dims[0], labels_path, labels.dims[0]);
  const int64_t n = images.dims[0];
  const int height = static_cast<int>(images.dims[1]), width = static_cast<int>(images.dims[2]);
  const int64_t classes =
      n == 0 ? 0 : *std::max_element(labels.data.begin(), labels.data.end()) + 1;

  Hdf5ImageWriter writer(output, n, height, width, 1, /*encoded=*/false, classes);
  writer.set_attribute("source", images_path);
  ProgressBar progress("from-idx", n);
  const int64_t block = 4096;
  const int64_t image_bytes = static_cast<int64_t>(height) * width;
  for (int64_t begin = 0; begin < n; begin += block) {
    const int64_t count = std::min(block, n - begin);
    writer.write_raw(begin, images.data.data() + begin * image_bytes, count);
    writer.write_labels(begin, std::vector<int64_t>(labels.data.begin() + begin,
                                                    labels.data.begin() + begin + count));
    progress.advance(count);
  }
  writer.finish();
  progress.finish();
  log_info("wrote {}: {} images {}x{}x1, {} classes", output, n, height, width, classes);
  return kExitOk;
}

}  // namespace myriad
