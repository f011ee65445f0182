#include "core/config/seq_len_schedule.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <stdexcept>

namespace ulysses {

namespace {

std::string trimmed(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

constexpr int64_t kNotANumber = -1, kTooLarge = -2;

// A whole non-negative decimal number, kNotANumber, or kTooLarge beyond int64.
int64_t whole_number(const std::string& text) {
  if (text.empty()) return kNotANumber;
  int64_t value = 0;
  for (char digit : text) {
    if (!std::isdigit(static_cast<unsigned char>(digit))) return kNotANumber;
    if (value > (std::numeric_limits<int64_t>::max() - (digit - '0')) / 10) return kTooLarge;
    value = value * 10 + (digit - '0');
  }
  return value;
}

}  // namespace

std::vector<SeqLenStage> parse_seq_len_schedule(const std::string& text) {
  std::vector<SeqLenStage> stages;
  if (trimmed(text).empty()) return stages;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t comma = text.find(',', begin);
    if (comma == std::string::npos) comma = text.size();
    const std::string entry = trimmed(text.substr(begin, comma - begin));
    const size_t at = entry.find('@');
    const std::string shape = at == std::string::npos ? "" : trimmed(entry.substr(0, at));
    const size_t times = shape.find('x');
    const int64_t length = whole_number(trimmed(shape.substr(0, times)));
    const int64_t batch =
        times == std::string::npos ? 0 : whole_number(trimmed(shape.substr(times + 1)));
    const int64_t step = at == std::string::npos ? -1 : whole_number(trimmed(entry.substr(at + 1)));
    if (length == kTooLarge || batch == kTooLarge || step == kTooLarge)
      throw std::invalid_argument("entry '" + entry + "' holds a number above " +
                                  std::to_string(std::numeric_limits<int64_t>::max()));
    if (length < 0 || batch < 0 || step < 0 || (times != std::string::npos && batch == 0))
      throw std::invalid_argument(
          "entry '" + entry +
          "' is not LENGTH@STEP or LENGTHxBATCH@STEP (e.g. \"256@0, 4096x4@500\")");
    stages.push_back({length, step, batch});
    begin = comma + 1;
  }
  return stages;
}

std::string seq_len_schedule_problem(const std::vector<SeqLenStage>& stages, int64_t seq_len,
                                     int64_t steps) {
  if (stages.empty()) return "";
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string stage =
        "stage " + std::to_string(i + 1) + " (\"" + std::to_string(stages[i].seq_len) +
        (stages[i].batch_size > 0 ? "x" + std::to_string(stages[i].batch_size) : std::string()) +
        "@" + std::to_string(stages[i].first_step) + "\")";
    if (stages[i].seq_len < 2)
      return stage + " has length " + std::to_string(stages[i].seq_len) +
             "; a length is at least 2 tokens, as train.seq_len";
    if (stages[i].batch_size > std::numeric_limits<int>::max())
      return stage + " has batch " + std::to_string(stages[i].batch_size) + ", above " +
             std::to_string(std::numeric_limits<int>::max()) + ", the largest train.batch_size";
  }
  if (stages.front().first_step != 0)
    return "the first stage starts at step " + std::to_string(stages.front().first_step) +
           "; it must start at step 0";
  for (size_t i = 1; i < stages.size(); ++i) {
    if (stages[i].first_step <= stages[i - 1].first_step)
      return "stage " + std::to_string(i + 1) + " starts at step " +
             std::to_string(stages[i].first_step) + ", not after stage " + std::to_string(i) +
             " (step " + std::to_string(stages[i - 1].first_step) + ")";
    if (stages[i].seq_len <= stages[i - 1].seq_len)
      return "stage " + std::to_string(i + 1) + " has length " + std::to_string(stages[i].seq_len) +
             ", not longer than stage " + std::to_string(i) + " (" +
             std::to_string(stages[i - 1].seq_len) + ")";
  }
  if (stages.back().seq_len != seq_len)
    return "the last stage's length " + std::to_string(stages.back().seq_len) +
           " is not train.seq_len = " + std::to_string(seq_len) +
           "; the curriculum ends at the length the run is for";
  if (stages.back().first_step >= steps)
    return "the last stage starts at step " + std::to_string(stages.back().first_step) +
           ", but train.steps is " + std::to_string(steps) + ": it would never train";
  return "";
}

SeqLenStage stage_at(const std::vector<SeqLenStage>& stages, int64_t seq_len, int64_t batch_size,
                     int64_t step) {
  SeqLenStage current{seq_len, 0, batch_size};
  for (const SeqLenStage& stage : stages)
    if (step >= stage.first_step) current = stage;
  if (current.batch_size == 0) current.batch_size = batch_size;
  return current;
}

double remaining_seconds(const std::vector<SeqLenStage>& stages, int64_t seq_len,
                         int64_t batch_size, int64_t from, int64_t steps, const SeqLenStage& now,
                         double now_seconds) {
  const double now_tokens = double(now.seq_len) * double(now.batch_size);
  double seconds = 0.0;
  for (int64_t step = from; step < steps;) {
    const SeqLenStage stage = stage_at(stages, seq_len, batch_size, step);
    int64_t end = steps;  // where this stage's steps end
    for (const SeqLenStage& next : stages)
      if (next.first_step > step) end = std::min(end, next.first_step);
    seconds += double(end - step) * now_seconds * double(stage.seq_len) * double(stage.batch_size) /
               now_tokens;
    step = end;
  }
  return seconds;
}

}  // namespace ulysses
