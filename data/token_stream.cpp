#include "data/token_stream.h"

#include <glob.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <utility>

#include "data/dataset.h"
#include "data/input_file.h"

namespace ulysses {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian and read in place");

namespace fs = std::filesystem;

namespace {

bool is_regular(const std::string& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

bool is_hidden(const fs::path& path) {
  std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

std::vector<std::string> expand_glob(const std::string& pattern, const std::string& key) {
  glob_t matches{};
  int status = glob(pattern.c_str(), 0, nullptr, &matches);
  if (status == GLOB_NOMATCH) {
    globfree(&matches);
    throw DataError(key + ": no files match '" + pattern + "'");
  }
  if (status != 0) {
    globfree(&matches);
    throw DataError(key + ": cannot expand '" + pattern + "' (read error)");
  }
  std::vector<std::string> files;
  for (size_t i = 0; i < matches.gl_pathc; i++) {
    if (is_regular(matches.gl_pathv[i])) files.push_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  if (files.empty()) throw DataError(key + ": '" + pattern + "' matches only folders, no files");
  return files;
}

std::vector<std::string> list_folder(const std::string& folder, const std::string& key) {
  std::vector<std::string> files;
  std::error_code error;
  fs::recursive_directory_iterator it(folder, error), end;
  for (; !error && it != end; it.increment(error)) {
    std::error_code unreadable;  // an entry whose type cannot be read (a link loop) is no file
    if (is_hidden(it->path())) {
      if (it->is_directory(unreadable)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(unreadable)) files.push_back(it->path().string());
  }
  if (error) throw DataError(key + ": cannot list folder '" + folder + "': " + error.message());
  if (files.empty()) throw DataError(key + ": folder '" + folder + "' holds no files");
  return files;
}

}  // namespace

std::vector<std::string> resolve_data_files(const std::string& pattern, const std::string& key) {
  if (pattern.empty()) throw DataError(key + " is empty: give a file, a folder or a glob");
  std::vector<std::string> files;
  if (pattern.find_first_of("*?[") != std::string::npos) {
    files = expand_glob(pattern, key);
  } else if (input_folder_problem(pattern).empty()) {
    files = list_folder(pattern, key);
  } else if (const std::string problem = input_file_problem(pattern); !problem.empty()) {
    throw DataError(key + ": " + problem);
  } else {
    files.push_back(pattern);
  }
  // Byte order, not the locale's collation: every machine sees the same stream.
  std::sort(files.begin(), files.end());
  return files;
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, int version) {
  if (version != 1 && version != 2) {
    throw DataError(path + ": cannot write shard version " + std::to_string(version) +
                    " (1 = uint16 tokens, 2 = uint32 tokens)");
  }
  if (tokens.size() > size_t(std::numeric_limits<int32_t>::max())) {
    throw DataError(path + ": " + std::to_string(tokens.size()) +
                    " tokens do not fit one shard (at most 2^31 - 1)");
  }
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = int32_t(tokens.size());
  std::ofstream out(path, std::ios::binary);
  if (!out) throw DataError(path + ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  for (size_t i = 0; i < tokens.size(); i++) {
    int32_t token = tokens[i];
    if (token < 0 || (version == 1 && token > 65535)) {
      throw DataError(path + ": token " + std::to_string(token) + " at position " +
                      std::to_string(i) + " does not fit shard version " + std::to_string(version));
    }
    if (version == 1) {
      uint16_t narrow = uint16_t(token);
      out.write(reinterpret_cast<const char*>(&narrow), sizeof(narrow));
    } else {
      uint32_t wide = uint32_t(token);
      out.write(reinterpret_cast<const char*>(&wide), sizeof(wide));
    }
  }
  if (!out) throw DataError(path + ": write failed");
}

TokenShardHeader parse_token_shard_header(const uint8_t* bytes, int64_t available,
                                          int64_t file_size, const std::string& path) {
  if (available < kShardHeaderBytes || file_size < kShardHeaderBytes) {
    throw DataError(path + ": truncated token shard: " + std::to_string(file_size) +
                    " bytes, but the header alone is " + std::to_string(kShardHeaderBytes));
  }
  int32_t header[kShardHeaderInts];
  std::memcpy(header, bytes, sizeof(header));
  if (header[0] != kShardMagic) {
    throw DataError(path + ": bad magic " + std::to_string(header[0]) + ", expected " +
                    std::to_string(kShardMagic) + " (an llm.c token shard)");
  }
  if (header[1] != 1 && header[1] != 2) {
    throw DataError(path + ": unknown token shard version " + std::to_string(header[1]) +
                    " (1 = uint16 tokens, 2 = uint32 tokens)");
  }
  if (header[2] < 0) {
    throw DataError(path + ": negative token count " + std::to_string(header[2]));
  }
  TokenShardHeader parsed;
  parsed.width = header[1] == 1 ? 2 : 4;
  parsed.num_tokens = header[2];
  int64_t expected = kShardHeaderBytes + parsed.width * parsed.num_tokens;
  if (file_size != expected) {
    throw DataError(path + ": " + (file_size < expected ? "truncated" : "oversized") +
                    " token shard: the header says " + std::to_string(parsed.num_tokens) +
                    " tokens of " + std::to_string(parsed.width) + " bytes, so " +
                    std::to_string(expected) + " bytes, but the file has " +
                    std::to_string(file_size));
  }
  return parsed;
}

TokenStream TokenStream::from_text_files(const std::vector<std::string>& files) {
  TokenStream stream;
  stream.files_ = files;
  for (const std::string& path : files) {
    Piece piece;
    piece.file = DataFile(path);
    if (piece.file.size() == 0) continue;
    piece.num_tokens = piece.file.size();
    piece.width = 1;
    piece.end_of_document = true;
    stream.add_piece(std::move(piece));
  }
  return stream;
}

TokenStream TokenStream::from_token_shards(const std::vector<std::string>& files, int vocab_size) {
  if (vocab_size <= 0) {
    throw DataError("token shards need model.vocab_size (got " + std::to_string(vocab_size) + ")");
  }
  TokenStream stream;
  stream.files_ = files;
  stream.vocab_size_ = vocab_size;
  for (const std::string& path : files) {
    Piece piece;
    piece.file = DataFile(path);
    uint8_t header[kShardHeaderBytes];
    const int64_t available = std::min<int64_t>(kShardHeaderBytes, piece.file.size());
    piece.file.read(0, available, header);
    const TokenShardHeader parsed =
        parse_token_shard_header(header, available, piece.file.size(), path);
    piece.width = parsed.width;
    piece.num_tokens = parsed.num_tokens;
    piece.data_offset = kShardHeaderBytes;
    if (piece.num_tokens > 0) stream.add_piece(std::move(piece));
  }
  return stream;
}

void TokenStream::add_piece(Piece piece) {
  piece.stream_begin = size_;
  size_ += piece.stream_length();
  pieces_.push_back(std::move(piece));
}

void TokenStream::read(int64_t begin, int64_t count, int32_t* out) const {
  if (begin < 0 || count < 0 || begin + count > size_) {
    throw std::out_of_range("TokenStream::read: tokens [" + std::to_string(begin) + ", " +
                            std::to_string(begin + count) + ") of a stream of " +
                            std::to_string(size_));
  }
  if (count == 0) return;
  auto piece =
      std::upper_bound(pieces_.begin(), pieces_.end(), begin,
                       [](int64_t position, const Piece& p) { return position < p.stream_begin; });
  --piece;
  while (count > 0) {
    int64_t first = begin - piece->stream_begin;
    int64_t n = std::min(count, piece->stream_length() - first);
    read_piece(*piece, first, n, out);
    out += n;
    begin += n;
    count -= n;
    ++piece;
  }
}

void TokenStream::read_piece(const Piece& piece, int64_t first, int64_t count, int32_t* out) const {
  int64_t stored = std::max<int64_t>(0, std::min(first + count, piece.num_tokens) - first);
  std::vector<uint8_t> bytes(size_t(stored * piece.width));
  piece.file.read(piece.data_offset + first * piece.width, int64_t(bytes.size()), bytes.data());
  auto check = [&](int64_t i, uint32_t value) {
    if (vocab_size_ > 0 && value >= uint32_t(vocab_size_)) {
      throw DataError(piece.file.path() + ": token at position " + std::to_string(first + i) +
                      " is " + std::to_string(value) +
                      ", not below model.vocab_size = " + std::to_string(vocab_size_));
    }
  };
  if (piece.width == 1) {
    for (int64_t i = 0; i < stored; i++) out[i] = bytes[size_t(i)];
  } else if (piece.width == 2) {
    for (int64_t i = 0; i < stored; i++) {
      uint16_t value;
      std::memcpy(&value, bytes.data() + 2 * i, 2);
      check(i, value);
      out[i] = value;
    }
  } else {
    for (int64_t i = 0; i < stored; i++) {
      uint32_t value;
      std::memcpy(&value, bytes.data() + 4 * i, 4);
      check(i, value);
      out[i] = int32_t(value);
    }
  }
  if (stored < count) out[stored] = kEndOfDocument;
}

std::string TokenStream::describe() const {
  if (files_.empty()) return "no files";
  if (files_.size() == 1) return files_[0];
  return files_.front() + " ... " + files_.back() + " (" + std::to_string(files_.size()) +
         " files)";
}

}  // namespace ulysses
