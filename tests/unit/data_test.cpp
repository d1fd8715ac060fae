#include <gtest/gtest.h>
#include <torch/torch.h>

#include <hdf5.h>

#include <cstdio>
#include <functional>

#include "myriad/data/data_loader.h"
#include "myriad/data/hdf5_image_dataset.h"
#include "myriad/data/idx_file.h"
#include "myriad/data/image_codec.h"
#include "myriad/data/synthetic_dataset.h"
#include "myriad/util/error.h"
#include "support/test_files.h"

namespace myriad {
namespace {

using testing::encode_png;
using testing::temp_file;
using testing::write_bytes;
using testing::write_idx;

std::vector<uint8_t> gradient_image(int h, int w, int c, int seed) {
  std::vector<uint8_t> pixels(static_cast<size_t>(h * w * c));
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int k = 0; k < c; ++k)
        pixels[(y * w + x) * c + k] = static_cast<uint8_t>((y * 7 + x * 3 + k * 50 + seed) % 256);
    }
  }
  return pixels;
}

TEST(ImageCodec, JpegRoundTripIsCloseAndTruncationIsAnError) {
  for (int channels : {1, 3}) {
    const std::vector<uint8_t> pixels = gradient_image(24, 40, channels, 1);
    const std::string jpeg = encode_jpeg(pixels.data(), 24, 40, channels, 95);
    EXPECT_EQ(sniff_image_format(jpeg), ImageFormat::kJpeg);
    const ImageShape shape = decode_image_header(jpeg, "test");
    EXPECT_EQ(shape.height, 24);
    EXPECT_EQ(shape.width, 40);
    EXPECT_EQ(shape.channels, channels);
    std::vector<uint8_t> decoded(pixels.size());
    decode_image(jpeg, 24, 40, channels, decoded.data(), "test");
    double error = 0;
    for (size_t i = 0; i < pixels.size(); ++i) error += std::abs(int(pixels[i]) - int(decoded[i]));
    EXPECT_LT(error / pixels.size(), 4.0) << channels << " channels";
    EXPECT_THROW(
        decode_image(jpeg.substr(0, jpeg.size() / 2), 24, 40, channels, decoded.data(), "cut"),
        Error);
    EXPECT_THROW(decode_image(jpeg, 24, 41, channels, decoded.data(), "wrong size"), Error);
  }
  // Grey JPEG decoded to RGB replicates the grey level.
  const std::vector<uint8_t> grey = gradient_image(8, 8, 1, 3);
  std::vector<uint8_t> rgb(8 * 8 * 3);
  decode_image(encode_jpeg(grey.data(), 8, 8, 1, 100), 8, 8, 3, rgb.data(), "grey");
  EXPECT_EQ(rgb[0], rgb[1]);
}

TEST(ImageCodec, PngIsLosslessAndGarbageIsNamed) {
  const std::vector<uint8_t> pixels = gradient_image(10, 12, 3, 5);
  const std::string png = encode_png(pixels.data(), 10, 12, 3);
  EXPECT_EQ(sniff_image_format(png), ImageFormat::kPng);
  std::vector<uint8_t> decoded(pixels.size());
  decode_image(png, 10, 12, 3, decoded.data(), "png");
  EXPECT_EQ(decoded, pixels);
  try {
    decode_image_header("not an image at all", "image 7 of x.h5");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("image 7 of x.h5: not a JPEG or PNG"), std::string::npos)
        << e.message();
  }
  EXPECT_THROW(decode_image(png.substr(0, 40), 10, 12, 3, decoded.data(), "cut png"), Error);
}

TEST(Hdf5ImageDataset, RawAndEncodedRoundTrip) {
  const std::string raw_path = temp_file("raw.h5"), encoded_path = temp_file("encoded.h5");
  const int h = 6, w = 5;
  std::vector<uint8_t> pixels;
  std::vector<std::string> encoded;
  for (int i = 0; i < 7; ++i) {
    const std::vector<uint8_t> image = gradient_image(h, w, 3, i * 11);
    pixels.insert(pixels.end(), image.begin(), image.end());
    encoded.push_back(i % 2 == 0 ? encode_png(image.data(), h, w, 3)
                                 : encode_jpeg(image.data(), h, w, 3, 100));
  }
  const std::vector<int64_t> labels = {0, 1, 2, 0, 1, 2, 3};
  {
    Hdf5ImageWriter raw(raw_path, 7, h, w, 3, false, 4);
    raw.write_raw(0, pixels.data(), 4);
    raw.write_raw(4, pixels.data() + 4 * h * w * 3, 3);
    raw.write_labels(0, labels);
    raw.finish();
    Hdf5ImageWriter enc(encoded_path, 7, h, w, 3, true, 4);
    enc.write_encoded(0, encoded);
    enc.write_labels(0, labels);
    enc.finish();
  }
  const Hdf5ImageDataset enc(encoded_path);
  EXPECT_TRUE(enc.info().encoded);
  std::vector<uint8_t> out(3 * h * w * 3), out2(3 * h * w * 3);
  // Raw images held in memory, and read from the file batch by batch (a budget of 0 bytes).
  for (const int64_t resident : {Hdf5ImageDataset::kResidentBytes, int64_t{0}}) {
    SCOPED_TRACE(resident);
    const Hdf5ImageDataset raw(raw_path, true, resident);
    EXPECT_FALSE(raw.info().encoded);
    EXPECT_EQ(raw.info().num_classes, 4);
    // Unsorted and repeated indices come back in the order asked.
    std::fill(out.begin(), out.end(), 0);
    raw.read({6, 2, 6}, out.data());
    for (int k = 0; k < 3; ++k) {
      const int index = k == 1 ? 2 : 6;
      EXPECT_TRUE(std::equal(out.begin() + k * h * w * 3, out.begin() + (k + 1) * h * w * 3,
                             pixels.begin() + index * h * w * 3))
          << "image " << k;
    }
    EXPECT_THROW(raw.read({7}, out.data()), Error);
  }
  enc.read({6, 2, 4}, out2.data());
  // Images 2 and 4 are PNG (exact); image 6 too.
  EXPECT_TRUE(std::equal(out2.begin(), out2.begin() + h * w * 3, pixels.begin() + 6 * h * w * 3));
  EXPECT_EQ(enc.label(6), 3);
  std::remove(raw_path.c_str());
  std::remove(encoded_path.c_str());
}

// A raw /images dataset [n, h, w, 3] laid out by `configure` (the creation property list), filled
// with distinct pixels except the rows from `unwritten` on, and labels; after a user block of
// `user_block` bytes, where it is not 0.
void write_raw_layout(const std::string& path, int n, int h, int w, int unwritten,
                      const std::function<void(hid_t)>& configure, hsize_t user_block) {
  const hid_t creation = H5Pcreate(H5P_FILE_CREATE);
  if (user_block > 0) H5Pset_userblock(creation, user_block);
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, creation, H5P_DEFAULT);
  H5Pclose(creation);
  ASSERT_GE(file, 0);
  const hsize_t dims[4] = {hsize_t(n), hsize_t(h), hsize_t(w), 3};
  const hid_t space = H5Screate_simple(4, dims, nullptr);
  const hid_t properties = H5Pcreate(H5P_DATASET_CREATE);
  configure(properties);
  const hid_t images =
      H5Dcreate2(file, "images", H5T_NATIVE_UINT8, space, H5P_DEFAULT, properties, H5P_DEFAULT);
  ASSERT_GE(images, 0);
  std::vector<uint8_t> pixels;
  for (int i = 0; i < unwritten; ++i) {
    const std::vector<uint8_t> image = gradient_image(h, w, 3, i * 37);
    pixels.insert(pixels.end(), image.begin(), image.end());
  }
  if (unwritten > 0) {
    const hsize_t start[4] = {0, 0, 0, 0},
                  count[4] = {hsize_t(unwritten), hsize_t(h), hsize_t(w), 3};
    const hid_t file_space = H5Dget_space(images);
    H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, nullptr, count, nullptr);
    const hid_t memory = H5Screate_simple(4, count, nullptr);
    ASSERT_GE(H5Dwrite(images, H5T_NATIVE_UINT8, memory, file_space, H5P_DEFAULT, pixels.data()),
              0);
    H5Sclose(memory);
    H5Sclose(file_space);
  }
  std::vector<int64_t> labels(static_cast<size_t>(n), 0);
  const hsize_t label_dims[1] = {hsize_t(n)};
  const hid_t label_space = H5Screate_simple(1, label_dims, nullptr);
  const hid_t label_set = H5Dcreate2(file, "labels", H5T_NATIVE_INT64, label_space, H5P_DEFAULT,
                                     H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(label_set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data());
  for (const hid_t id : {label_set, images}) H5Dclose(id);
  for (const hid_t id : {label_space, space}) H5Sclose(id);
  H5Pclose(properties);
  H5Fclose(file);
}

TEST(Hdf5ImageDataset, RawImagesReadWithoutHdf5AreHdf5sImages) {
  const int n = 50, h = 12, w = 10, bytes = h * w * 3;
  const auto chunks = [&](hsize_t rows, hsize_t height) {
    return [=](hid_t p) {
      const hsize_t chunk[4] = {rows, height, hsize_t(w), 3};
      H5Pset_chunk(p, 4, chunk);
    };
  };
  const std::string external = temp_file("layout-external.bin");
  struct Layout {
    const char* name;
    std::function<void(hid_t)> configure;
    int unwritten;  // rows from here on were never written
    const char* path;
    hsize_t user_block = 0;
  };
  const std::vector<Layout> layouts = {
      {"contiguous", [](hid_t) {}, n, "raw, read directly"},
      {"contiguous after a user block", [](hid_t) {}, n, "raw, read directly", 1024},
      {"chunks of 7 rows", chunks(7, h), n, "raw, read directly"},
      {"chunks of 7 rows after a user block", chunks(7, h), n, "raw, read directly", 512},
      {"chunks of 7 rows, the last ones never written", chunks(7, h), 15, "raw, read directly"},
      {"chunks of 7 rows, the last ones never written, filled with 9",
       [&](hid_t p) {
         chunks(7, h)(p);
         const uint8_t fill = 9;
         H5Pset_fill_value(p, H5T_NATIVE_UINT8, &fill);
       },
       15, "raw, read through HDF5"},
      {"in an external file",
       [&](hid_t p) { H5Pset_external(p, external.c_str(), 0, hsize_t(n) * bytes); }, n,
       "raw, read through HDF5"},
      {"chunks across rows", chunks(4, h / 2), n, "raw, read through HDF5"},
      {"compressed chunks",
       [&](hid_t p) {
         chunks(8, h)(p);
         H5Pset_deflate(p, 4);
       },
       n, "raw, read through HDF5"}};
  const std::vector<int64_t> indices = {49, 3, 4, 5, 20, 21, 13, 14, 0, 3, 48, 6, 7, 8};
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const std::string path = temp_file("layout.h5");
    write_raw_layout(path, n, h, w, layout.unwritten, layout.configure, layout.user_block);
    const Hdf5ImageDataset data(path, true, /*resident_bytes=*/0);
    EXPECT_STREQ(data.read_path(), layout.path);
    std::vector<uint8_t> out(indices.size() * bytes);
    data.read(indices, out.data());
    // HDF5's own reading of each image, one at a time, is the reference.
    for (size_t k = 0; k < indices.size(); ++k) {
      const torch::Tensor expected = data.file().read_row_list("images", {indices[k]});
      EXPECT_TRUE(std::equal(out.begin() + k * bytes, out.begin() + (k + 1) * bytes,
                             expected.data_ptr<uint8_t>()))
          << "image " << indices[k];
    }
    std::remove(path.c_str());
  }
  std::remove(external.c_str());
}

TEST(Hdf5ImageDataset, LabelsOutsideTheClassesAreRejected) {
  const std::string path = temp_file("bad_labels.h5");
  {
    Hdf5ImageWriter writer(path, 2, 2, 2, 1, false, 3);
    const std::vector<uint8_t> pixels(8, 1);
    writer.write_raw(0, pixels.data(), 2);
    writer.write_labels(0, {1, 3});
    writer.finish();
  }
  try {
    Hdf5ImageDataset data(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("label 3 of image 1"), std::string::npos) << e.message();
  }
  std::remove(path.c_str());
}

TEST(Hdf5ImageWriter, AnUnfinishedWriterLeavesNothing) {
  const std::string path = temp_file("unfinished.h5");
  { Hdf5ImageWriter writer(path, 2, 2, 2, 1, false, 3); }
  EXPECT_EQ(std::fopen(path.c_str(), "r"), nullptr);
}

TEST(IdxFile, ReadsPlainAndGzipAndRejectsBrokenFiles) {
  const std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6};
  for (bool gzip : {false, true}) {
    const std::string path = temp_file(gzip ? "a.idx.gz" : "a.idx");
    write_idx(path, {3, 2}, data, gzip);
    const IdxArray array = read_idx(path);
    EXPECT_EQ(array.dims, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(array.data, data);
    std::remove(path.c_str());
  }
  const std::string truncated = temp_file("truncated.idx");
  write_idx(truncated, {4, 2}, data, false);
  try {
    read_idx(truncated);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("is truncated"), std::string::npos) << e.message();
  }
  write_idx(truncated, {2, 2}, data, false);
  EXPECT_THROW(read_idx(truncated), Error);  // longer than its header says
  write_bytes(truncated, std::string("\x12\x34\x08\x01\x00\x00\x00\x01\x07", 9));
  EXPECT_THROW(read_idx(truncated), Error);  // bad magic
  write_bytes(truncated, std::string("\x00\x00\x0D\x01\x00\x00\x00\x01\x07\x07\x07\x07", 12));
  EXPECT_THROW(read_idx(truncated), Error);  // float elements
  write_bytes(truncated, std::string("\x00\x00", 2));
  EXPECT_THROW(read_idx(truncated), Error);  // no header
  EXPECT_THROW(read_idx("/nonexistent.idx"), Error);
  std::remove(truncated.c_str());
}

TEST(DataLoader, BatchesComeInStepOrderDeterministicallyFlipped) {
  auto source = std::make_shared<SyntheticDataset>(200, 5, 1, 4, 6, 3);
  auto sampler = std::make_shared<DistributedSampler>(200, 20, 2, 3);
  LoaderOptions options;
  options.workers = 3;
  options.prefetch = 2;
  options.seed = 3;
  options.rank = 1;
  std::vector<torch::Tensor> first;
  {
    DataLoader loader(source, sampler, options);
    for (int64_t step = 0; step < 25; ++step) {
      const Batch b = loader.next();
      EXPECT_EQ(b.index, step);
      EXPECT_EQ(b.position.epoch, step / 10);
      EXPECT_EQ(b.position.offset, (step % 10) * 20);
      ASSERT_EQ(b.images.sizes(), (std::vector<int64_t>{10, 1, 4, 6}));
      const std::vector<int64_t> indices = sampler->indices(b.position, 1);
      for (int64_t i = 0; i < 10; ++i)
        EXPECT_EQ(b.labels[i].item<int64_t>(), source->label(indices[i]));
      EXPECT_LE(b.images.abs().max().item<float>(), 1.0f);
      first.push_back(b.images);
    }
  }
  options.workers = 1;
  options.start = {1, 40};  // step 12
  DataLoader resumed(source, sampler, options);
  for (int64_t step = 12; step < 25; ++step)
    EXPECT_TRUE(torch::equal(resumed.next().images, first[step]));
}

TEST(DataLoader, WorkerErrorsReachTheConsumer) {
  const std::string path = temp_file("corrupt_images.h5");
  {
    Hdf5ImageWriter writer(path, 4, 8, 8, 1, true, 2);
    const std::vector<uint8_t> pixels = gradient_image(8, 8, 1, 0);
    const std::string good = encode_jpeg(pixels.data(), 8, 8, 1, 90);
    writer.write_encoded(0, {good, good, good.substr(0, good.size() / 3), good});
    writer.write_labels(0, {0, 1, 0, 1});
    writer.finish();
  }
  auto source = std::make_shared<Hdf5ImageDataset>(path);
  auto sampler = std::make_shared<DistributedSampler>(4, 4, 1, 0);
  DataLoader loader(source, sampler, LoaderOptions{});
  try {
    loader.next();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("image 2 of"), std::string::npos) << e.message();
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace myriad
