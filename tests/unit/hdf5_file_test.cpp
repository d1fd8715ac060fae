#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>

#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"

namespace myriad {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + name;
}

TEST(Hdf5File, NumericRoundTripOfEveryStoredDtype) {
  const std::string path = temp_path("myriad_h5_roundtrip.h5");
  const std::vector<torch::Tensor> tensors = {
      torch::randn({7, 3}), torch::randn({5}, torch::kFloat64),
      torch::randint(-9, 9, {4, 2, 2}, torch::kInt64), torch::randint(0, 200, {6}, torch::kInt32),
      torch::randint(0, 255, {3, 4}, torch::kUInt8)};
  {
    Hdf5File file(path, Hdf5File::Mode::kCreate);
    for (size_t i = 0; i < tensors.size(); ++i)
      file.write("group/t" + std::to_string(i), tensors[i], 2);
    file.write("scalar", torch::tensor(3.5f).reshape({}));
  }
  Hdf5File file(path, Hdf5File::Mode::kRead);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor back = file.read("group/t" + std::to_string(i));
    EXPECT_EQ(back.scalar_type(), tensors[i].scalar_type());
    EXPECT_TRUE(torch::equal(back, tensors[i])) << i;
  }
  EXPECT_FLOAT_EQ(file.read("scalar").item<float>(), 3.5f);
  EXPECT_TRUE(torch::equal(file.read_rows("group/t0", 2, 3), tensors[0].slice(0, 2, 5)));
  EXPECT_TRUE(torch::equal(file.read_row_list("group/t0", {0, 1, 4, 6}),
                           tensors[0].index_select(0, torch::tensor({0, 1, 4, 6}))));
  EXPECT_THROW(file.read_rows("group/t0", 5, 3), Error);
  EXPECT_THROW(file.read("missing"), Error);
  EXPECT_FALSE(file.has("group/nothing"));
  EXPECT_FALSE(file.has("nothing/deeper"));
  std::remove(path.c_str());
}

TEST(Hdf5File, PartialWritesBytesAndAttributes) {
  const std::string path = temp_path("myriad_h5_bytes.h5");
  {
    Hdf5File file(path, Hdf5File::Mode::kCreate);
    file.create("rows", torch::kFloat32, {4, 2}, 2);
    file.write_rows("rows", 0, torch::ones({2, 2}));
    file.write_rows("rows", 2, torch::full({2, 2}, 2.0f));
    file.create_bytes("images", 3, 2);
    file.write_bytes("images", 0, {std::string("\x00\xff\x10", 3), ""});
    file.write_bytes("images", 2, {"jpeg"});
    file.set_attribute("/", "num_classes", int64_t{10});
    file.set_attribute("rows", "scale", 0.5);
    file.set_attribute("/", "format", std::string("myriad"));
    file.set_attribute("/", "num_classes", int64_t{12});
  }
  Hdf5File file(path, Hdf5File::Mode::kRead);
  EXPECT_TRUE(torch::equal(file.read("rows"),
                           torch::cat({torch::ones({2, 2}), torch::full({2, 2}, 2.0f)})));
  EXPECT_TRUE(file.is_bytes("images"));
  const std::vector<std::string> images = file.read_bytes("images", 0, 3);
  EXPECT_EQ(images[0], std::string("\x00\xff\x10", 3));
  EXPECT_EQ(images[1], "");
  EXPECT_EQ(images[2], "jpeg");
  EXPECT_EQ(file.int_attribute("/", "num_classes"), 12);
  EXPECT_DOUBLE_EQ(*file.float_attribute("rows", "scale"), 0.5);
  EXPECT_EQ(file.string_attribute("/", "format"), "myriad");
  EXPECT_FALSE(file.int_attribute("/", "absent").has_value());
  std::remove(path.c_str());
}

TEST(Hdf5File, MissingAndCorruptFilesAreNamedErrors) {
  try {
    Hdf5File("/nonexistent/dir/x.h5", Hdf5File::Mode::kRead);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("/nonexistent/dir/x.h5' does not exist"), std::string::npos)
        << e.message();
  }
  const std::string path = temp_path("myriad_h5_corrupt.h5");
  std::ofstream(path) << "this is not HDF5";
  try {
    Hdf5File(path, Hdf5File::Mode::kRead);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("is not an HDF5 file"), std::string::npos) << e.message();
  }
  // A real file cut short.
  {
    Hdf5File file(path, Hdf5File::Mode::kCreate);
    file.write("big", torch::randn({4096, 64}));
  }
  ASSERT_EQ(truncate(path.c_str(), 4000), 0);
  EXPECT_THROW(
      {
        Hdf5File file(path, Hdf5File::Mode::kRead);
        file.read("big");
      },
      Error);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace myriad
