// The metrics file keeps whole lines only (core/report/metrics.h): a write that fails takes back
// what it wrote, and a resumed run appending to a file that ends in a torn line drops that line
// first, so every line stays one JSON object (docs/failures.md#a-full-disk).
#include <gtest/gtest.h>

#include <string>

#include "core/report/metrics.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

using testing::TempDir;

TEST(MetricsWriter, AppendingDropsATornLastLine) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  testing::write_text_file(path, "{\"step\":1}\n{\"step\":2,\"lo");
  MetricsWriter(path, true).write({{"step", 2}});
  EXPECT_EQ(testing::read_text_file(path), "{\"step\":1}\n{\"step\":2}\n");
}

TEST(MetricsWriter, AppendingKeepsWholeLinesAndDropsAFileOfOneTornLine) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  testing::write_text_file(path, "{\"step\":1}\n");
  MetricsWriter(path, true).write({{"step", 2}});
  EXPECT_EQ(testing::read_text_file(path), "{\"step\":1}\n{\"step\":2}\n");
  testing::write_text_file(path, "{\"step\":1,");
  MetricsWriter(path, true).write({{"step", 1}});
  EXPECT_EQ(testing::read_text_file(path), "{\"step\":1}\n");
  MetricsWriter(path, false).write({{"step", 9}});
  EXPECT_EQ(testing::read_text_file(path), "{\"step\":9}\n");
}

// A file-size limit stops the second line part way, as a full disk would.
TEST(MetricsWriter, AWriteThatFailsPartWayTakesBackWhatItWrote) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  MetricsWriter writer(path, false);
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
