// The metrics file keeps whole lines only, one per step (core/report/metrics.h): a write that
// fails takes back what it wrote, and a resumed run keeps the lines through its checkpoint's step,
// dropping those of the steps it trains again and a torn last line, so every line stays one JSON
// object and no step appears twice (docs/checkpoints.md#resuming, docs/failures.md#a-full-disk).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "core/report/metrics.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::TempDir;

std::string step_line(int step) {
  return "{\"step\":" + std::to_string(step) + "}\n";
}

TEST(MetricsWriter, AResumedRunDropsATornLastLine) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  testing::write_text_file(path, step_line(1) + "{\"step\":2,\"lo");
  MetricsWriter(path, 1).write({{"step", 2}});
  EXPECT_EQ(testing::read_text_file(path), step_line(1) + step_line(2));
  // A file of one torn line keeps nothing; a fresh run starts the file anew.
  testing::write_text_file(path, "{\"step\":1,");
  MetricsWriter(path, 0).write({{"step", 1}});
  EXPECT_EQ(testing::read_text_file(path), step_line(1));
  MetricsWriter(path, std::nullopt).write({{"step", 9}});
  EXPECT_EQ(testing::read_text_file(path), step_line(9));
}

// Two runs naming one file (docs/configuration.md, `log`): the second is refused before it cuts
// or writes anything, fresh or resumed; once the first has closed it, the file is free.
TEST(MetricsWriter, ASecondWriterOfTheSameFileIsRefusedAndCutsNothing) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  {
    MetricsWriter first(path, std::nullopt);
    for (int step = 1; step <= 3; ++step) first.write({{"step", step}});
    for (const std::optional<int64_t> resumed :
         {std::optional<int64_t>(), std::optional<int64_t>(1)}) {
      try {
        MetricsWriter second(path, resumed);
        ADD_FAILURE() << "a second writer was let in";
      } catch (const MetricsFileInUse& error) {
        EXPECT_MENTIONS(error.what(),
                        "log.metrics_file '" + path + "' is being written by another run");
      }
    }
    first.write({{"step", 4}});
    EXPECT_EQ(testing::read_text_file(path),
              step_line(1) + step_line(2) + step_line(3) + step_line(4));
  }
  MetricsWriter(path, 2).write({{"step", 3}});
  EXPECT_EQ(testing::read_text_file(path), step_line(1) + step_line(2) + step_line(3));
}

// Killed at step 6 after a checkpoint at step 4, with an evaluation at step 4: the run resumed
// from step 4 trains steps 5 and 6 again and logs them once.
TEST(MetricsWriter, AResumedRunDropsTheLinesOfTheStepsItTrainsAgain) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  const std::string through_4 = step_line(1) + step_line(2) + step_line(3) + step_line(4) +
                                "{\"eval_loss\":1.5,\"step\":4}\n";
  testing::write_text_file(path, through_4 + step_line(5) + step_line(6));
  MetricsWriter(path, 4).write({{"step", 5}});
  EXPECT_EQ(testing::read_text_file(path), through_4 + step_line(5));
  // Nothing after the resumed step: nothing goes.
  MetricsWriter(path, 5);
  EXPECT_EQ(testing::read_text_file(path), through_4 + step_line(5));
}

// Lines longer than the 64 KiB the file is read back by, and many of them to drop.
TEST(MetricsWriter, ResumingFindsItsStepAcrossManyChunks) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  const std::string padding(70 * 1024, 'x');
  std::string text;
  for (int step = 1; step <= 3000; ++step)
    text += "{\"pad\":\"" + (step % 1000 == 0 ? padding : std::string()) +
            "\",\"step\":" + std::to_string(step) + "}\n";
  testing::write_text_file(path, text);
  MetricsWriter(path, 1000);
  const std::string kept = testing::read_text_file(path);
  const size_t step_1001 = text.find("{\"pad\":\"\",\"step\":1001}");
  EXPECT_EQ(kept.size(), step_1001);
  EXPECT_TRUE(kept == text.substr(0, step_1001)) << "the kept lines differ from steps 1-1000";
}

// A file-size limit stops the second line part way, as a full disk would.
TEST(MetricsWriter, AWriteThatFailsPartWayTakesBackWhatItWrote) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  MetricsWriter writer(path, std::nullopt);
  writer.write({{"step", 1}});
  const std::string first = testing::read_text_file(path);
  const std::string error = testing::error_under_file_size_limit(first.size() + 8, [&] {
    writer.write({{"step", 2}, {"loss", 1.5}});
  });
  EXPECT_MENTIONS(error, "writing log.metrics_file '" + path + "' failed: File too large");
  EXPECT_EQ(testing::read_text_file(path), first);
}

}  // namespace
}  // namespace ulysses
