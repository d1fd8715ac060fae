// myriad's checks of a checkpoint directory (docs/checkpoint-format.md), on directories built from
// fuzzed structure: the manifest's fields against the files (sizes, checksums, right or wrong),
// shard datasets of any shape and dtype (declared larger than written, too), LATEST's contents,
// and the class rows a rank of another world size asks for. libhdf5's own parsing is not the
// target.

#include <torch/torch.h>

#include <filesystem>
#include <limits>

#include "fuzz_input.h"
#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/checksum.h"
#include "myriad/ckpt/class_rows.h"
#include "myriad/util/hdf5_file.h"

namespace {

using myriad::Hdf5File;
using myriad::fuzz::FuzzInput;

// A shard's dataset of `rows` x `dim` as declared, with the written part taken from the input.
void rows_dataset(FuzzInput& in, Hdf5File& file, const std::string& name, int64_t rows,
                  int64_t dim) {
  const torch::ScalarType dtype = in.below(4) == 0 ? torch::kFloat64 : torch::kFloat32;
  file.create(name, dtype, {rows, dim}, 1);
  if (rows <= 64 && dim <= 16 && rows * dim > 0) {
    file.write_rows(name, 0, torch::randn({rows, dim}).to(dtype));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace myriad;
  namespace fs = std::filesystem;
  FuzzInput in(data, size);
  const std::string root = fuzz::scratch_directory() + "/checkpoints";
  const std::string dir = root + "/step-000000010";
  fs::create_directories(dir);
  const int world = 1 + static_cast<int>(in.below(3));
  const int64_t classes = in.number();
  const int64_t dim = in.flag() ? in.number() : 1 + static_cast<int64_t>(in.below(16));
  Manifest m;
  m.step = in.number();
  m.position = {in.number(), in.number()};
  m.world_size = world;
  m.num_classes = classes;
  m.embedding_size = dim;
  int64_t offset = 0;
  try {
    for (int r = 0; r < world; ++r) {
      const int64_t rows =
          r + 1 == world && in.flag() ? (classes >= offset ? classes - offset : 0) : in.number();
      const ShardEntry shard{shard_file_name(r), r, in.flag() ? offset : in.number(), rows};
      m.shards.push_back(shard);
      if (rows > 0 && offset <= std::numeric_limits<int64_t>::max() - rows) offset += rows;
      Hdf5File file((fs::path(dir) / shard.file).string(), Hdf5File::Mode::kCreate);
      rows_dataset(in, file, "weight", in.flag() ? rows : in.number(),
                   in.flag() ? dim : in.number());
      if (in.flag()) rows_dataset(in, file, "state/momentum", rows, dim);
    }
    Hdf5File((fs::path(dir) / kReplicatedFile).string(), Hdf5File::Mode::kCreate)
        .write("backbone/w", torch::ones({2}));
  } catch (const Error&) {
    return 0;  // a structure the writer itself refuses
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    FileEntry file{static_cast<int64_t>(fs::file_size(entry.path())),
                   file_crc32(entry.path().string())};
    if (in.below(8) == 0) file.bytes = in.number();
    if (in.below(8) == 0) file.crc32 ^= 1u << in.below(32);
    if (in.below(16) != 0) m.files[name] = file;
  }
  fuzz::write_file(dir + "/" + kManifestFile, m.to_json().dump());
  fuzz::write_file(root + "/LATEST", in.flag() ? "step-000000010" : in.bytes(in.below(32)));
  const std::string dataset = in.flag() ? "weight" : "state/momentum";
  const int64_t begin = in.number();
  const int64_t end = in.flag() || begin > std::numeric_limits<int64_t>::max() - 100
                          ? in.number()
                          : begin + static_cast<int64_t>(in.below(100));

  fuzz::expect_clean([&] {
    const CheckpointStore store(root);
    store.complete();
    store.latest();
    resume_candidates("auto", store);
  });
  fuzz::expect_clean([&] {
    const Manifest verified = verify_checkpoint(dir);
    int64_t delivered = 0;
    read_class_rows(dir, verified, dataset, begin, end, [&](int64_t at, const torch::Tensor& rows) {
      // Blocks must be [n, D] float32 rows inside the range asked for.
      if (rows.dim() != 2 || rows.size(1) != verified.embedding_size ||
          rows.scalar_type() != torch::kFloat32 || at < 0 || at + rows.size(0) > end - begin) {
        __builtin_trap();
      }
      delivered += rows.size(0);
    });
  });
  return 0;
}
