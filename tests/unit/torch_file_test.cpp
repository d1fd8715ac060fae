// read_torch_state_dict on a ZIP64 archive. torch.save writes ZIP64 fields once a record or the
// archive passes 4 GiB; a test of that size is out of reach, so the archive that
// write_torch_state_dict writes is rewritten here with every 32-bit field it may overflow moved
// into ZIP64's extra fields and end record (PKWARE's APPNOTE, 4.3.14-4.3.15 and 4.5.3). LibTorch's
// own reader (miniz) checks that the rewritten archive is a valid one.
//
// An entry whose offset alone overflowed (its sizes small, after a record of gigabytes) states only
// the offset in its extra field. LibTorch 1.13's miniz refuses such entries (it checks the
// offset's 0xFFFFFFFF against the file's size before reading the extra field); 2.x reads them.
// That archive is read here by myriad's reader alone, against the tensors written.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "myriad/ckpt/torch_file.h"
#include "support/test_files.h"

namespace myriad {
namespace {

uint64_t get(const std::string& bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(bytes.at(at + i));
  return v;
}

std::string put(uint64_t v, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

void set(std::string& bytes, size_t at, uint64_t v, int n) {
  bytes.replace(at, n, put(v, n));
}

// One central directory entry at `at` (which moves past it), its 32-bit sizes and offset replaced
// by 0xFFFFFFFF and stated in a ZIP64 extra field. Where `offset_only`, only the offset: the
// extra field then holds that one value.
std::string zip64_entry(const std::string& zip, size_t& at, bool offset_only) {
  const size_t name = get(zip, at + 28, 2), extra = get(zip, at + 30, 2),
               comment = get(zip, at + 32, 2);
  std::string entry = zip.substr(at, 46 + name + extra + comment);
  std::string values;
  if (!offset_only) {
    values += put(get(entry, 24, 4), 8) + put(get(entry, 20, 4), 8);  // size, then compressed
    set(entry, 20, 0xFFFFFFFF, 4);
    set(entry, 24, 0xFFFFFFFF, 4);
  }
  values += put(get(entry, 42, 4), 8);
  set(entry, 42, 0xFFFFFFFF, 4);
  set(entry, 6, 45, 2);  // version needed: ZIP64
  entry.insert(46 + name + extra, put(0x0001, 2) + put(values.size(), 2) + values);
  set(entry, 30, extra + 4 + values.size(), 2);
  at += 46 + name + extra + comment;
  return entry;
}

// `zip` (no archive comment) with a ZIP64 directory: every entry's three fields in its extra field,
// or where `offset_only` every other entry's offset alone; the end record's fields move to a ZIP64
// end record found through its locator.
std::string to_zip64(const std::string& zip, bool offset_only) {
  const size_t end = zip.size() - 22;
  EXPECT_EQ(get(zip, end, 4), 0x06054b50u) << "the end record is not the last 22 bytes";
  const uint64_t count = get(zip, end + 10, 2), offset = get(zip, end + 16, 4);
  std::string directory;
  size_t at = offset;
  for (uint64_t k = 0; k < count; ++k) directory += zip64_entry(zip, at, offset_only && k % 2 == 1);
  const uint64_t zip64_end = offset + directory.size();
  std::string out = zip.substr(0, offset) + directory;
  out += put(0x06064b50, 4) + put(44, 8) + put(45, 2) + put(45, 2) + put(0, 4) + put(0, 4) +
         put(count, 8) + put(count, 8) + put(directory.size(), 8) + put(offset, 8);
  out += put(0x07064b50, 4) + put(0, 4) + put(zip64_end, 8) + put(1, 4);
  out += put(0x06054b50, 4) + put(0, 4) + put(0xFFFF, 2) + put(0xFFFF, 2) + put(0xFFFFFFFF, 4) +
         put(0xFFFFFFFF, 4) + put(0, 2);
  return out;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

StateDict example_state() {
  torch::manual_seed(3);
  return {{"conv.weight", torch::randn({4, 3, 3, 3})},
          {"bn.running_mean", torch::randn({4}).to(torch::kFloat64)},
          {"bn.num_batches_tracked", torch::tensor(7, torch::kInt64)},
          {"fc.weight", torch::randn({5, 8}).to(torch::kBFloat16)}};
}

// myriad's reader gives `state` back from the archive `bytes`.
void expect_reads_back(const StateDict& state, const std::string& bytes, const std::string& name) {
  const std::string path = testing::temp_file(name);
  testing::write_bytes(path, bytes);
  const StateDict read = read_torch_state_dict(path);
  ASSERT_EQ(read.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(read[i].first, state[i].first);
    EXPECT_TRUE(torch::equal(read[i].second, state[i].second)) << state[i].first;
  }
}

TEST(TorchFile, ReadsZip64Archives) {
  const StateDict state = example_state();
  const std::string plain = testing::temp_file("plain.pt");
  write_torch_state_dict(state, plain);
  const std::string zip64 = to_zip64(read_all(plain), false);
  // LibTorch's reader takes the rewritten archive: the fixture is valid ZIP64.
  const std::vector<char> bytes(zip64.begin(), zip64.end());
  const c10::Dict<c10::IValue, c10::IValue> libtorch = torch::pickle_load(bytes).toGenericDict();
  ASSERT_EQ(libtorch.size(), state.size());
  for (const auto& [name, tensor] : state)
    EXPECT_TRUE(torch::equal(libtorch.at(name).toTensor(), tensor)) << name;
  expect_reads_back(state, zip64, "zip64.pt");
  expect_reads_back(state, to_zip64(read_all(plain), true), "zip64-offsets.pt");
}

// A ZIP64 end record whose locator is missing is named as such, not read past.
TEST(TorchFile, Zip64WithoutItsLocatorIsAnError) {
  const std::string plain = testing::temp_file("plain2.pt");
  write_torch_state_dict({{"w", torch::ones({2})}}, plain);
  std::string zip64 = to_zip64(read_all(plain), true);
  const size_t locator = zip64.size() - 22 - 20;
  ASSERT_EQ(get(zip64, locator, 4), 0x07064b50u);
  set(zip64, locator, 0, 4);
  const std::string path = testing::temp_file("no-locator.pt");
  testing::write_bytes(path, zip64);
  EXPECT_NE(testing::error_of([&] {
              read_torch_state_dict(path);
            }).find("is corrupt: a ZIP64 archive without its locator"),
            std::string::npos);
}

}  // namespace
}  // namespace myriad
