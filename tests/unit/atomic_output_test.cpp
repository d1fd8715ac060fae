// AtomicOutput against the file system: a committed file or directory appears under its name
// only at commit; an abandoned one leaves nothing behind, nested contents included.

#include <gtest/gtest.h>

#include <filesystem>

#include "myriad/util/atomic_output.h"
#include "myriad/util/remove_tree.h"
#include "support/test_files.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

TEST(AtomicOutput, AFileAppearsOnlyAtCommit) {
  const fs::path path = testing::temp_file("atomic.bin");
  ASSERT_EQ(remove_tree(path.string()), "");
  {
    AtomicOutput out(path.string());
    testing::write_bytes(out.temporary_path(), "abandoned");
    EXPECT_TRUE(fs::exists(out.temporary_path()));
    EXPECT_FALSE(fs::exists(path));
  }
  EXPECT_FALSE(fs::exists(path)) << "an uncommitted output must not appear";
  std::string temporary;
  {
    AtomicOutput out(path.string());
    temporary = out.temporary_path();
    testing::write_bytes(temporary, "kept");
    out.commit();
  }
  EXPECT_EQ(fs::file_size(path), 4u);
  EXPECT_FALSE(fs::exists(temporary));
  write_file_atomically(path.string(), "replaced");
  EXPECT_EQ(fs::file_size(path), 8u);
  EXPECT_EQ(remove_tree(path.string()), "");
}

TEST(AtomicOutput, AnAbandonedDirectoryIsRemovedWhole) {
  const fs::path path = testing::temp_file("atomic-dir");
  ASSERT_EQ(remove_tree(path.string()), "");
  std::string temporary;
  {
    AtomicOutput out(path.string());
    temporary = out.temporary_path();
    fs::create_directories(fs::path(temporary) / "nested");
    testing::write_bytes((fs::path(temporary) / "nested" / "part.bin").string(), "x");
  }
  EXPECT_FALSE(fs::exists(temporary));
  EXPECT_FALSE(fs::exists(path));
  {
    AtomicOutput out(path.string());
    fs::create_directories(fs::path(out.temporary_path()) / "nested");
    testing::write_bytes((fs::path(out.temporary_path()) / "nested" / "part.bin").string(), "x");
    out.commit();
  }
  EXPECT_TRUE(fs::exists(path / "nested" / "part.bin"));
  EXPECT_EQ(remove_tree(path.string()), "");
}

}  // namespace
}  // namespace myriad
