// Checkpoint bookkeeping without a model: the block-parallel CRC against a bytewise reference,
// manifest round trip and validation, the store's publish/keep/LATEST rules, verification and
// what --resume resolves to.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/checksum.h"
#include "myriad/ckpt/manifest.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/error.h"
#include "myriad/util/remove_tree.h"
#include "support/test_files.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::random_bytes;
using testing::temp_file;
using testing::write_bytes;

// CRC-32 as its definition states it: reflected polynomial 0xEDB88320, one bit at a time.
uint32_t reference_crc32(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(FileCrc32, MatchesTheBitwiseDefinitionForAnyBlockingAndThreadCount) {
  const std::string path = temp_file("crc.bin");
  write_bytes(path, "123456789");
  EXPECT_EQ(file_crc32(path), 0xCBF43926u);  // the standard check value of CRC-32
  for (const size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{100003}}) {
    const std::string bytes = random_bytes(size, static_cast<uint32_t>(size));
    write_bytes(path, bytes);
    const uint32_t expected = reference_crc32(bytes);
    for (const int threads : {1, 3, 8}) {
      for (const int64_t block : {int64_t{1} << 12, int64_t{7919}, int64_t{64} << 20}) {
        EXPECT_EQ(file_crc32(path, threads, block), expected)
            << size << " bytes, " << threads << " threads, " << block;
      }
    }
  }
  EXPECT_EQ(crc32_hex(0x0000abcdu), "0000abcd");
  EXPECT_THROW(file_crc32(temp_file("no-such-file")), Error);
}

Manifest two_shard_manifest() {
  Manifest m;
  m.step = 40;
  m.position = {2, 96};
  m.world_size = 2;
  m.num_classes = 10;
  m.embedding_size = 8;
  m.shards = {{shard_file_name(0), 0, 0, 5}, {shard_file_name(1), 1, 5, 5}};
  m.files = {{kReplicatedFile, {100, 0x1234}},
             {shard_file_name(0), {200, 0xdeadbeef}},
             {shard_file_name(1), {300, 7}}};
  m.config = "lr = 0.1\n";
  m.created = "2026-11-21T00:00:00Z";
  return m;
}

void expect_error(const nlohmann::json& j, const std::string& says) {
  try {
    Manifest::from_json(j, "test manifest");
    ADD_FAILURE() << "no error; expected one saying '" << says << "'";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(says), std::string::npos) << e.message();
  }
}

TEST(Manifest, RoundTripsThroughJson) {
  const Manifest m = two_shard_manifest();
  const Manifest back =
      Manifest::from_json(nlohmann::json::parse(m.to_json().dump()), "test manifest");
  EXPECT_EQ(back.step, 40);
  EXPECT_EQ(back.position.epoch, 2);
  EXPECT_EQ(back.position.offset, 96);
  EXPECT_EQ(back.world_size, 2);
  EXPECT_EQ(back.num_classes, 10);
  EXPECT_EQ(back.embedding_size, 8);
  ASSERT_EQ(back.shards.size(), 2u);
  EXPECT_EQ(back.shards[1].file, "classifier-00001.h5");
  EXPECT_EQ(back.shards[1].class_offset, 5);
  EXPECT_EQ(back.files.at(shard_file_name(0)).crc32, 0xdeadbeefu);
  EXPECT_EQ(back.files.at(shard_file_name(1)).bytes, 300);
  EXPECT_EQ(back.config, m.config);
}

TEST(Manifest, RejectsWhatItCannotTrust) {
  const nlohmann::json good = two_shard_manifest().to_json();
  nlohmann::json j = good;
  j["format"] = "something-else";
  expect_error(j, "is not a myriad checkpoint manifest");
  j = good;
  j["format_version"] = kCheckpointFormatVersion + 1;
  expect_error(j, "format version");
  j = good;
  j.erase("step");
  expect_error(j, "is malformed");
  j = good;
  j["shards"][1]["class_offset"] = 6;
  expect_error(j, "does not continue the class ranges");
  j = good;
  j["num_classes"] = 11;
  expect_error(j, "shards cover 10 of 11 classes");
  j = good;
  j["world_size"] = 3;
  expect_error(j, "lists 2 shards for 3 ranks");
  j = good;
  j["files"].erase(kReplicatedFile);
  expect_error(j, "no replicated.h5");
  j = good;
  j["files"][shard_file_name(0)]["crc32"] = "xyz";
  expect_error(j, "not hexadecimal");
  // What the fuzzer (fuzz/harnesses/manifest.cpp) found getting through: file names that leave
  // the directory, sizes that overflow the class ranges, an embedding no model has.
  for (const std::string name : {"../replicated.h5", "/etc/passwd", "a/b", "..", "."}) {
    j = good;
    j["files"][name] = {{"bytes", 1}, {"crc32", "0"}};
    expect_error(j, "is not the name of a file in the checkpoint directory");
  }
  j = good;
  j["shards"][1]["rows"] = std::numeric_limits<int64_t>::max();
  expect_error(j, "does not continue the class ranges");
  j = good;
  j["embedding_size"] = 0;
  expect_error(j, "is not one myriad writes");
  j = good;
  j["step"] = -1;
  expect_error(j, "negative step");
  j = good;
  j["files"][kReplicatedFile]["bytes"] = -5;
  expect_error(j, "negative size");
}

// A checkpoint directory whose manifest lists real files.
void make_checkpoint(const std::string& directory, int64_t step) {
  fs::create_directories(directory);
  Manifest m = two_shard_manifest();
  m.step = step;
  for (const std::string& name :
       {std::string(kReplicatedFile), shard_file_name(0), shard_file_name(1)}) {
    const std::string bytes = random_bytes(1000 + name.size(), static_cast<uint32_t>(step));
    write_bytes(directory + "/" + name, bytes);
    m.files[name] = {static_cast<int64_t>(bytes.size()), reference_crc32(bytes)};
  }
  write_file_atomically(directory + "/" + kManifestFile, m.to_json().dump());
}

// Saves like save_checkpoint does: into the temporary directory, then published.
void save(const CheckpointStore& store, int64_t step, int keep) {
  make_checkpoint(store.temporary_for(step), step);
  store.publish(store.temporary_for(step), step);
  store.prune(step, keep);
}

std::string fresh_root(const std::string& name) {
  const std::string root = temp_file(name);
  EXPECT_EQ(remove_tree(root), "");
  return root;
}

TEST(CheckpointStore, PublishesKeepsTheNewestAndPointsLatestAtIt) {
  const CheckpointStore store(fresh_root("store-keep"));
  EXPECT_TRUE(store.complete().empty());
  EXPECT_FALSE(store.latest().has_value());
  for (const int64_t step : {5, 10, 15, 20}) save(store, step, 2);
  EXPECT_EQ(store.complete(),
            (std::vector<std::string>{store.directory_for(20), store.directory_for(15)}));
  EXPECT_EQ(store.latest(), store.directory_for(20));
  EXPECT_FALSE(fs::exists(store.temporary_for(20)));
  EXPECT_EQ(fs::path(store.directory_for(20)).filename(), "step-000000020");
  // Step numbers sort numerically, not as text.
  save(store, 100, 3);
  EXPECT_EQ(store.complete().front(), store.directory_for(100));
}

// A run resumed from step 5 while step 10 exists publishes steps below 10: LATEST, not the
// highest step, is what --resume auto continues from, and pruning never removes the new one.
TEST(CheckpointStore, ARunResumedFromAnOlderCheckpointContinuesItsOwnLine) {
  const CheckpointStore store(fresh_root("store-lineage"));
  save(store, 5, 3);
  save(store, 10, 3);
  save(store, 8, 3);
  EXPECT_EQ(store.latest(), store.directory_for(8));
  EXPECT_EQ(resume_candidates("auto", store).front(), store.directory_for(8));
  EXPECT_EQ(store.complete().size(), 3u);
  save(store, 9, 1);
  EXPECT_EQ(store.complete(), std::vector<std::string>{store.directory_for(9)});
  // After LATEST, the others from the highest step down (tried when LATEST does not verify).
  save(store, 12, 3);
  save(store, 11, 3);
  EXPECT_EQ(resume_candidates("auto", store),
            (std::vector<std::string>{store.directory_for(11), store.directory_for(12),
                                      store.directory_for(9)}));
}

TEST(CheckpointStore, RemovesWhatAnUnfinishedSaveLeft) {
  const CheckpointStore store(fresh_root("store-stale"));
  save(store, 5, 3);
  make_checkpoint(store.temporary_for(10), 10);
  EXPECT_EQ(store.complete().size(), 1u);  // a temporary directory is never a checkpoint
  store.remove_stale_temporaries();
  EXPECT_FALSE(fs::exists(store.temporary_for(10)));
  EXPECT_TRUE(fs::exists(store.directory_for(5)));
}

TEST(VerifyCheckpoint, NamesTheFileThatIsCorruptTruncatedOrMissing) {
  const std::string dir = fresh_root("verify");
  make_checkpoint(dir, 7);
  EXPECT_EQ(verify_checkpoint(dir).step, 7);
  const std::string shard = dir + "/" + shard_file_name(1);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x5a');
  }
  // Only the files asked for are read.
  EXPECT_NO_THROW(verify_checkpoint(dir, {kReplicatedFile, shard_file_name(0)}));
  EXPECT_NE(
      error_of([&] { verify_checkpoint(dir); }).find("classifier-00001.h5' is corrupt: checksum"),
      std::string::npos);
  fs::resize_file(shard, 10);
  EXPECT_NE(error_of([&] { verify_checkpoint(dir); }).find("has 10 bytes, its manifest says"),
            std::string::npos);
  fs::remove(shard);
  EXPECT_NE(error_of([&] { verify_checkpoint(dir); }).find("classifier-00001.h5' is missing"),
            std::string::npos);
  fs::remove(dir + "/" + kManifestFile);
  EXPECT_NE(error_of([&] { verify_checkpoint(dir); }).find("manifest.json' is missing"),
            std::string::npos);
  write_bytes(dir + "/" + kManifestFile, "{\"format\": \"myriad-chec");
  EXPECT_NE(error_of([&] { verify_checkpoint(dir); }).find("is not valid JSON"), std::string::npos);
}

// Which checkpoints --resume tries, in order; verifying them is the load's job (tested in
// tests/mpi/checkpoint_test.cpp).
TEST(ResumeCandidates, NoneAutoOrOneNamedCheckpoint) {
  const CheckpointStore store(fresh_root("resume"));
  EXPECT_TRUE(resume_candidates("auto", store).empty());
  save(store, 5, 3);
  save(store, 10, 3);
  EXPECT_TRUE(resume_candidates("none", store).empty());
  EXPECT_EQ(resume_candidates("auto", store),
            (std::vector<std::string>{store.directory_for(10), store.directory_for(5)}));
  EXPECT_EQ(resume_candidates(store.directory_for(5), store),
            std::vector<std::string>{store.directory_for(5)});
  // Without LATEST (lost, or written by hand), the highest step comes first.
  fs::remove(store.root() + "/LATEST");
  EXPECT_EQ(resume_candidates("auto", store).front(), store.directory_for(10));
}

}  // namespace
}  // namespace myriad
