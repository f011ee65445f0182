// libFuzzer target: the token-shard reader (data/token_stream.h). The input is a whole shard
// file: parse_token_shard_header checks it from the bytes, then the bytes are written to a
// scratch file and opened twice in a row as one stream with TokenStream::from_token_shards
// (and, for the piece logic, as text with from_text_files), and a few windows are read:
// both ends, the middle, across the boundary between the two files, and all of it when small.
// The vocabulary is the header's last int when it is positive (seeds use it to put tokens
// out of range), else 50304. Only DataError is an expected outcome.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/token_stream.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr int kDefaultVocab = 50304;
constexpr int64_t kWindow = 16;
constexpr int64_t kWholeStreamLimit = 1 << 16;

void read_window(const ulysses::TokenStream& stream, int64_t begin, int64_t count, int vocab,
                 bool text) {
  std::vector<int32_t> out(size_t(count), -1);
  try {
    stream.read(begin, count, out.data());
  } catch (const ulysses::DataError&) {
    return;  // a token at or above the vocabulary
  }
  for (int32_t token : out) {
    const bool valid =
        text ? token >= 0 && token <= ulysses::kEndOfDocument : token >= 0 && token < vocab;
    if (!valid)
      ulysses::fuzz::invariant_failed("TokenStream::read returned an invalid token",
                                      std::to_string(token) + " at window " +
                                          std::to_string(begin) + "+" + std::to_string(count));
  }
}

void read_windows(const ulysses::TokenStream& stream, int vocab, bool text) {
  const int64_t size = stream.size();
  if (size == 0) return;
  const int64_t window = std::min(size, kWindow);
  read_window(stream, 0, window, vocab, text);
  read_window(stream, size - window, window, vocab, text);
  read_window(stream, std::max<int64_t>(0, size / 2 - window / 2), window, vocab, text);
  if (size <= kWholeStreamLimit) read_window(stream, 0, size, vocab, text);
  int32_t token = 0;
  try {
    stream.read(size, 1, &token);
    ulysses::fuzz::invariant_failed("TokenStream::read past the end does not throw",
                                    std::to_string(size));
  } catch (const std::out_of_range&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ulysses;
  static const fuzz::ScratchFile file("token-shard");

  try {
    const TokenShardHeader header =
        parse_token_shard_header(data, int64_t(size), int64_t(size), "fuzz.bin");
    if ((header.width != 2 && header.width != 4) || header.num_tokens < 0 ||
        kShardHeaderBytes + header.width * header.num_tokens != int64_t(size))
      fuzz::invariant_failed(
          "parse_token_shard_header accepts a header that does not fit",
          std::to_string(header.width) + " x " + std::to_string(header.num_tokens));
  } catch (const DataError&) {
  }

  int vocab = kDefaultVocab;
  if (size >= size_t(kShardHeaderBytes)) {
    int32_t last = 0;
    std::memcpy(&last, data + kShardHeaderBytes - 4, sizeof(last));
    if (last > 0) vocab = last;
  }

  file.write(data, size);
  const std::vector<std::string> files = {file.path(), file.path()};
  try {
    const TokenStream shards = TokenStream::from_token_shards(files, vocab);
    read_windows(shards, vocab, false);
  } catch (const DataError&) {
  }
  try {
    const TokenStream text = TokenStream::from_text_files(files);
    if (text.size() != (size == 0 ? 0 : 2 * (int64_t(size) + 1)))
      fuzz::invariant_failed("text stream has the wrong length", std::to_string(text.size()));
    read_windows(text, kTextVocabSize, true);
  } catch (const DataError&) {
  }
  return 0;
}
