// remove_tree against the file system itself: nested directories go, links are removed rather
// than followed, a missing path is fine and a failure names the path.

#include <gtest/gtest.h>

#include <filesystem>

#include "myriad/util/remove_tree.h"
#include "support/test_files.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

TEST(RemoveTree, RemovesNestedDirectoriesWithoutFollowingLinks) {
  const fs::path root = testing::temp_file("remove-tree");
  const fs::path outside = testing::temp_file("remove-tree-outside");
  ASSERT_EQ(remove_tree(root.string()), "");
  ASSERT_EQ(remove_tree(outside.string()), "");
  fs::create_directories(root / "a" / "b" / "c");
  fs::create_directories(outside);
  testing::write_bytes((root / "a" / "b" / "c" / "deep.bin").string(), "x");
  testing::write_bytes((root / "top.bin").string(), "y");
  testing::write_bytes((outside / "kept.bin").string(), "z");
  fs::create_directory_symlink(outside, root / "a" / "link");

  EXPECT_EQ(remove_tree(root.string()), "");
  EXPECT_FALSE(fs::exists(fs::symlink_status(root)));
  EXPECT_TRUE(fs::exists(outside / "kept.bin"));
  EXPECT_EQ(remove_tree(root.string()), "");  // already gone
  EXPECT_EQ(remove_tree(outside.string()), "");
  EXPECT_FALSE(fs::exists(outside));
}

TEST(RemoveTree, AFailureNamesThePath) {
  // Nobody, root included, may unlink a file of procfs.
  const std::string failure = remove_tree("/proc/self/status");
  EXPECT_EQ(failure.rfind("cannot remove '/proc/self/status': ", 0), 0u) << failure;
}

}  // namespace
}  // namespace myriad
