// SnapshotWriter against HDF5's own reading: what it writes outside HDF5 reads back through
// HDF5 exactly (float32, bfloat16 widened to float32, int64, bool as uint8, scalars, empty
// tensors), whole or streamed through two small buffers; the sizes and checksums it reports are
// the files'; a failure is reported, not thrown, and the writer serves the next snapshot.

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include <torch/torch.h>

#include "myriad/ckpt/checksum.h"
#include "myriad/ckpt/snapshot_writer.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/remove_tree.h"
#include "support/test_files.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

std::vector<SnapshotFile> sample_files(const torch::Tensor& rows, const torch::Tensor& state) {
  SnapshotFile a;
  a.name = "a.h5";
  a.datasets = {{"weight", rows},
                {"state/momentum", state},
                {"steps", torch::arange(7, torch::kInt64)},
                {"mask", torch::tensor({true, false, true})},
                {"group/scalar", torch::tensor(2.5)},
                {"empty", torch::empty({0, 4})}};
  a.attributes = [](Hdf5File& file) { file.set_attribute("/", "step", int64_t{42}); };
  SnapshotFile b;
  b.name = "b.h5";
  // Not contiguous: written in C order all the same.
  b.datasets = {{"transposed", rows.t()}};
  return {a, b};
}

void expect_written(const std::string& directory, const SnapshotOutcome& outcome,
                    const torch::Tensor& rows, const torch::Tensor& state) {
  ASSERT_EQ(outcome.error, "");
  const Hdf5File a((fs::path(directory) / "a.h5").string(), Hdf5File::Mode::kRead);
  EXPECT_TRUE(torch::equal(a.read("weight"), rows));
  EXPECT_EQ(a.dtype("state/momentum"), torch::kFloat32);
  EXPECT_TRUE(torch::equal(a.read("state/momentum"), state.to(torch::kFloat32)));
  EXPECT_TRUE(torch::equal(a.read("steps"), torch::arange(7, torch::kInt64)));
  EXPECT_TRUE(torch::equal(a.read("mask"), torch::tensor({1, 0, 1}, torch::kUInt8)));
  EXPECT_EQ(a.read("group/scalar").item<double>(), 2.5);
  EXPECT_EQ(a.shape("empty"), std::vector<int64_t>({0, 4}));
  EXPECT_EQ(a.int_attribute("/", "step"), 42);
  const Hdf5File b((fs::path(directory) / "b.h5").string(), Hdf5File::Mode::kRead);
  EXPECT_TRUE(torch::equal(b.read("transposed"), rows.t().contiguous()));
  int64_t bytes = 0;
  for (const char* name : {"a.h5", "b.h5"}) {
    const std::string path = (fs::path(directory) / name).string();
    ASSERT_EQ(outcome.files.count(name), 1u) << name;
    EXPECT_EQ(outcome.files.at(name).bytes, static_cast<int64_t>(fs::file_size(path)));
    EXPECT_EQ(outcome.files.at(name).crc32, file_crc32(path));
    bytes += outcome.files.at(name).bytes;
  }
  EXPECT_EQ(outcome.bytes, bytes);
}

TEST(SnapshotWriter, WritesWhatHdf5ReadsBackWholeOrStreamed) {
  torch::manual_seed(3);
  // 600 KiB of rows and 300 KiB of bfloat16 state: several of the smallest buffers.
  const torch::Tensor rows = torch::randn({1200, 128});
  const torch::Tensor state = torch::randn({1200, 128}).to(torch::kBFloat16);
  const std::vector<SnapshotFile> files = sample_files(rows, state);
  for (const int64_t memory : {SnapshotWriter::memory_for(files), int64_t{128} << 10}) {
    SCOPED_TRACE(memory);
    const std::string directory = testing::temp_file("snapshot");
    SnapshotWriter writer(torch::kCPU, memory, 3);
    EXPECT_LE(writer.host_memory_bytes(), std::max(memory, int64_t{128} << 10));
    writer.begin(directory, files, 1);
    EXPECT_TRUE(writer.in_flight());
    const SnapshotOutcome outcome = writer.wait();
    EXPECT_FALSE(writer.in_flight());
    expect_written(directory, outcome, rows, state);
    EXPECT_GT(outcome.write_seconds, 0.0);
    EXPECT_EQ(remove_tree(directory), "");
  }
}

TEST(SnapshotWriter, ReportsAFailureAndServesTheNextSnapshot) {
  const torch::Tensor rows = torch::randn({64, 8});
  const torch::Tensor state = torch::randn({64, 8}).to(torch::kBFloat16);
  const std::vector<SnapshotFile> files = sample_files(rows, state);
  SnapshotWriter writer(torch::kCPU, int64_t{128} << 10, 2);
  // A file where the directory should be: nothing can be created there.
  const std::string blocked = testing::temp_file("snapshot-blocked");
  testing::write_bytes(blocked, "not a directory");
  writer.begin(blocked + "/step", files, 1);
  const SnapshotOutcome failed = writer.wait();
  EXPECT_NE(failed.error.find(blocked), std::string::npos) << failed.error;
  fs::remove(blocked);

  const std::string directory = testing::temp_file("snapshot-after");
  writer.begin(directory, files, 2);
  while (!writer.done()) std::this_thread::yield();
  expect_written(directory, writer.wait(), rows, state);
  EXPECT_EQ(remove_tree(directory), "");
}

}  // namespace
}  // namespace myriad
