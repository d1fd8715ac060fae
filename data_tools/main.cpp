// myriad-data: converts image collections into myriad's HDF5 format and inspects such files.

#include "data_commands.h"
#include "myriad/comm/entry.h"
#include "myriad/util/cli.h"

int main(int argc, char** argv) {
  return myriad::run_entry(argc, argv, [](myriad::ProcessContext& context, int argc, char** argv) {
    return myriad::run_sub_command(
        context, argc, argv,
        "usage: myriad-data <command> [options]   (docs/data-format.md describes the files)",
        {{"from-idx", "MNIST / Fashion-MNIST IDX files (.gz or plain) to HDF5",
          myriad::run_from_idx},
         {"from-folder",
          "a class-per-directory tree of JPEG/PNG files to HDF5 (bytes kept as they are, or "
          "resized or aligned faces)",
          myriad::run_from_folder},
         {"from-rec",
          "an insightface MXNet RecordIO dataset (.rec + .idx) to HDF5 (JPEG bytes kept as they "
          "are, or resized)",
          myriad::run_from_rec},
         {"from-bin", "an insightface verification set (lfw.bin, ...) to an HDF5 pairs file",
          myriad::run_from_bin},
         {"from-ijb",
          "insightface's IJB-B/IJB-C layout (loose crops, landmarks, templates, pairs) to an HDF5 "
          "file of ArcFace-aligned faces",
          myriad::run_from_ijb},
         {"inspect",
          "images, shape, encoding, classes and their histogram; validates labels and images",
          myriad::run_inspect},
         {"synthetic", "a file of generated images, raw or JPEG, for pipeline tests and benchmarks",
          myriad::run_synthetic},
         {"pairs",
          "a verification pairs file drawn from a labelled dataset (half of one identity, half of "
          "two)",
          myriad::run_pairs},
         {"synthetic-ijb",
          "a synthetic set in insightface's IJB layout (prototype faces in loose crops), for "
          "tests and benchmarks",
          myriad::run_synthetic_ijb}});
  });
}
