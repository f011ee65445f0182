// Files concatenated into one stream of token ids, for the text and tokens sources: a
// sequence is a window of the stream, read from the files at its positions (data_file.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/data_file.h"

namespace ulysses {

// Byte-level text: bytes 0..255 are tokens, 256 ends every document (file).
constexpr int kEndOfDocument = 256;
constexpr int kTextVocabSize = 257;

// llm.c token shard: 256 int32 header [magic, version, token count, 0...], then the tokens.
// Version 1 stores uint16 tokens (llm.c's format); version 2 is this project's variant with
// uint32 tokens for vocabularies above 65536. The file is exactly 1024 + width * count bytes.
constexpr int32_t kShardMagic = 20240520;
constexpr int kShardHeaderInts = 256;
constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// What a token shard's header says, checked against the file's size.
struct TokenShardHeader {
  int width = 2;           // bytes per token
  int64_t num_tokens = 0;  // tokens stored
};
// Checks the header (the file's first `available` bytes; at least kShardHeaderBytes are
// needed) of a shard of file_size bytes; throws DataError naming path and the problem.
TokenShardHeader parse_token_shard_header(const uint8_t* bytes, int64_t available,
                                          int64_t file_size, const std::string& path);

// The files a data.path names, sorted: a single file, every file under a folder
// (recursively, hidden entries skipped) or the files a glob matches. `key` ("data.path")
// appears in errors. Throws DataError when nothing is found.
std::vector<std::string> resolve_data_files(const std::string& pattern, const std::string& key);

// Writes a token shard (version 1: uint16, version 2: uint32); throws DataError when a
// token does not fit the version's width.
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens, int version);

class TokenStream {
 public:
  // Every byte of every file, each file followed by kEndOfDocument; empty files are skipped.
  static TokenStream from_text_files(const std::vector<std::string>& files);
  // Token shards, headers and sizes checked; token ids are checked against vocab_size as
  // they are read.
  static TokenStream from_token_shards(const std::vector<std::string>& files, int vocab_size);

  int64_t size() const { return size_; }
  // Tokens [begin, begin + count) of the stream; touches only the bytes they live in.
  void read(int64_t begin, int64_t count, int32_t* out) const;
  // "path" for one file, "first ... last (N files)" for several (empty files included);
  // for messages.
  std::string describe() const;

 private:
  // One file's contribution to the stream.
  struct Piece {
    DataFile file;
    int64_t stream_begin = 0;      // position of the piece's first token in the stream
    int64_t num_tokens = 0;        // tokens stored in the file
    int64_t data_offset = 0;       // bytes before the first token
    int width = 1;                 // bytes per token: 1 (text), 2 or 4 (shards)
    bool end_of_document = false;  // a kEndOfDocument token follows the file's tokens

    int64_t stream_length() const { return num_tokens + (end_of_document ? 1 : 0); }
  };

  void add_piece(Piece piece);
  void read_piece(const Piece& piece, int64_t first, int64_t count, int32_t* out) const;

  std::vector<std::string> files_;  // as given, empty ones included (for messages)
  std::vector<Piece> pieces_;
  int64_t size_ = 0;
  int vocab_size_ = 0;  // 0 = no check (text: every token is below kTextVocabSize)
};

}  // namespace ulysses
