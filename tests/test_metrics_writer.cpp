// The metrics file keeps whole lines only (core/report/metrics.h): a write that fails takes back
// what it wrote, and a resumed run appending to a file that ends in a torn line drops that line
// first, so every line stays one JSON object (docs/failures.md#a-full-disk).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
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

// RLIMIT_FSIZE stops the second line part way, as a full disk would: write(2) takes the bytes
// below the limit, then fails with EFBIG (SIGXFSZ ignored, as ulysses-train does).
TEST(MetricsWriter, AWriteThatFailsPartWayTakesBackWhatItWrote) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  MetricsWriter writer(path, false);
  writer.write({{"step", 1}});
  const std::string first = testing::read_text_file(path);
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit limit = old_limit;
  limit.rlim_cur = first.size() + 8;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string error;
  try {
    writer.write({{"step", 2}, {"loss", 1.5}});
  } catch (const std::exception& problem) {
    error = problem.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_MENTIONS(error, "writing log.metrics_file '" + path + "' failed: File too large");
  EXPECT_EQ(testing::read_text_file(path), first);
}

}  // namespace
}  // namespace ulysses
