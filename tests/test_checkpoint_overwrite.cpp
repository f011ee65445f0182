// train.checkpoint.overwrite's publishing and its recovery (core/checkpoint/checkpoint_overwrite.h,
// docs/checkpoints.md#overwriting): a crash at each point of replacing an earlier run's
// checkpoints leaves them exactly as they were, or the new checkpoint in place with nothing of
// theirs left, once the next run has recovered the folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/checkpoint_overwrite.h"
#include "core/checkpoint/file_util.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

namespace fs = std::filesystem;
using testing::snapshot_files;
using testing::TempDir;

// A step folder that verifies: one file and a manifest with its size and CRC-32.
void make_checkpoint(const std::string& folder, int64_t step, const std::string& content) {
  fs::create_directories(folder);
  testing::write_text_file(folder + "/" + kCheckpointModelFile, content);
  CheckpointManifest manifest;
  manifest.step = step;
  const std::string file = folder + "/" + kCheckpointModelFile;
  manifest.files.push_back(
      {kCheckpointModelFile, uint64_t(fs::file_size(file)), crc32_of_file(file)});
  testing::write_text_file(folder + "/" + kCheckpointManifestFile, manifest_json(manifest));
}

// An earlier run's three checkpoints and `latest`, and the new run's first checkpoint
// written and fsynced under its temporary name (what Checkpointer::save has before it
// publishes).
class Overwrite : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int step = 1; step <= 3; ++step)
      make_checkpoint(folder(step), step, "old weights of step " + std::to_string(step));
    point_latest_at(dir_.path(), checkpoint_folder_name(3));
    before_ = snapshot_files(dir_.path());
    make_checkpoint(dir_.file(".tmp-step_00000002"), 2, "new weights of step 2");
  }
  std::string folder(int step) const { return dir_.file(checkpoint_folder_name(step)); }
  std::vector<std::string> old_folders() const { return {folder(3), folder(2), folder(1)}; }
  // The new folder renamed into place, as publishing does after moving the old ones aside.
  void publish_new() { rename_or_throw(dir_.file(".tmp-step_00000002"), folder(2)); }
  // The earlier run's files, exactly as they were: the new run's temporary folder aside.
  std::map<std::string, std::string> old_files() const {
    std::map<std::string, std::string> files = snapshot_files(dir_.path());
    std::erase_if(files, [](const auto& entry) { return entry.first.rfind(".tmp-", 0) == 0; });
    return files;
  }
  // Only the new checkpoint, named by `latest`.
  void expect_only_the_new_checkpoint() const {
    EXPECT_FALSE(fs::exists(dir_.file(kOverwritePendingFolder)));
    EXPECT_FALSE(fs::exists(dir_.file(kOverwriteDeletingFolder)));
    const auto folders = checkpoint_step_folders(dir_.path());
    ASSERT_EQ(folders.size(), 1u);
    EXPECT_EQ(testing::read_text_file(folder(2) + "/" + kCheckpointModelFile),
              "new weights of step 2");
    EXPECT_EQ(read_latest_name(dir_.path()), checkpoint_folder_name(2));
  }
  TempDir dir_;
  std::map<std::string, std::string> before_;
};

TEST_F(Overwrite, AFolderWithoutAnInterruptedOverwriteIsLeftAlone) {
  EXPECT_EQ(recover_interrupted_overwrite(dir_.path()), "");
  EXPECT_EQ(old_files(), before_);
}

TEST_F(Overwrite, PublishingReplacesEverythingOfTheEarlierRun) {
  move_replaced_aside(dir_.path(), old_folders(), checkpoint_folder_name(2));
  publish_new();
  point_latest_at(dir_.path(), checkpoint_folder_name(2));
  delete_replaced(dir_.path());
  expect_only_the_new_checkpoint();
}

TEST_F(Overwrite, CrashBeforeAnythingMovedLeavesTheOldCheckpoints) {
  fs::create_directory(dir_.file(kOverwritePendingFolder));
  EXPECT_MENTIONS(recover_interrupted_overwrite(dir_.path()), "moved the 0 checkpoint(s)");
  EXPECT_EQ(old_files(), before_);
  EXPECT_FALSE(fs::exists(dir_.file(kOverwritePendingFolder)));
}

// Step 2 of the earlier run is still in place, under the name of the new checkpoint.
TEST_F(Overwrite, CrashWhileMovingAsideMovesEverythingBack) {
  fs::create_directory(dir_.file(kOverwritePendingFolder));
  rename_or_throw(folder(3), dir_.file(std::string(kOverwritePendingFolder) + "/step_00000003"));
  EXPECT_NE(old_files(), before_);
  EXPECT_MENTIONS(recover_interrupted_overwrite(dir_.path()), "moved the 1 checkpoint(s)");
  EXPECT_EQ(old_files(), before_);
  EXPECT_FALSE(fs::exists(dir_.file(kOverwritePendingFolder)));
}

TEST_F(Overwrite, CrashBeforeTheNewCheckpointIsInPlaceMovesEverythingBack) {
  move_replaced_aside(dir_.path(), old_folders(), checkpoint_folder_name(2));
  EXPECT_TRUE(checkpoint_step_folders(dir_.path()).empty());
  EXPECT_FALSE(fs::exists(dir_.file(kCheckpointLatestFile)));
  EXPECT_MENTIONS(recover_interrupted_overwrite(dir_.path()),
                  "moved the 3 checkpoint(s) it had set aside back, as they were");
  EXPECT_EQ(old_files(), before_);
  EXPECT_EQ(find_latest_checkpoint(dir_.path()), folder(3));
}

TEST_F(Overwrite, CrashAfterTheNewCheckpointIsInPlaceFinishesTheOverwrite) {
  move_replaced_aside(dir_.path(), old_folders(), checkpoint_folder_name(2));
  publish_new();  // and no `latest` yet
  EXPECT_MENTIONS(recover_interrupted_overwrite(dir_.path()),
                  "after the new run's first checkpoint (step_00000002) was in place: deleted "
                  "the 3 checkpoint(s)");
  expect_only_the_new_checkpoint();
}

// delete_replaced renames the pending folder, then deletes its contents in whatever order the
// file system lists them: here `replaced-by` and step 1 went first, steps 2 and 3 (step 2 of
// the new run's name) are left. Deleted in place, they would have been moved back beside the
// new checkpoint, or refused as in the way (CheckpointKill.OverwriteSurvivesSigkillAtTwelve-
// Moments, test_checkpoint.cpp, met that once in a few runs).
TEST_F(Overwrite, CrashWhileDeletingTheOldCheckpointsFinishesTheOverwrite) {
  move_replaced_aside(dir_.path(), old_folders(), checkpoint_folder_name(2));
  publish_new();
  point_latest_at(dir_.path(), checkpoint_folder_name(2));
  const std::string deleting = dir_.file(kOverwriteDeletingFolder);
  rename_or_throw(dir_.file(kOverwritePendingFolder), deleting);
  fs::remove(deleting + "/" + kOverwriteReplacementFile);
  fs::remove_all(deleting + "/step_00000001");
  EXPECT_MENTIONS(recover_interrupted_overwrite(dir_.path()),
                  "while it deleted the checkpoints of the earlier run it replaced: deleted the "
                  "rest");
  expect_only_the_new_checkpoint();
  EXPECT_FALSE(fs::exists(deleting));
}

TEST_F(Overwrite, SomethingInTheWayOfMovingBackIsRefusedAndNothingMoves) {
  move_replaced_aside(dir_.path(), old_folders(), checkpoint_folder_name(2));
  fs::create_directory(folder(1));  // not a checkpoint, and in the way
  const auto pending_before = snapshot_files(dir_.file(kOverwritePendingFolder));
  try {
    recover_interrupted_overwrite(dir_.path());
    ADD_FAILURE() << "recovered with a folder in the way";
  } catch (const CheckpointError& error) {
    EXPECT_MENTIONS(error.what(), "'step_00000001' cannot be moved back");
    EXPECT_MENTIONS(error.what(), "in the way");
  }
  EXPECT_EQ(snapshot_files(dir_.file(kOverwritePendingFolder)), pending_before);
  EXPECT_FALSE(fs::exists(folder(3)));
}

}  // namespace
}  // namespace ulysses
