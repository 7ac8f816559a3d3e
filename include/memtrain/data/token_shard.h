// llm.c token shards: a header of 256 little-endian int32 (magic 20240520, version 1, token count,
// the rest zero), then `count` uint16 token ids. TokenShard maps a shard read-only, so opening one costs
// no copy and the page cache is shared between processes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace memtrain::data {

inline constexpr std::int32_t kTokenShardMagic = 20240520;
inline constexpr std::int32_t kTokenShardVersion = 1;
inline constexpr std::size_t kTokenShardHeaderBytes = 256 * sizeof(std::int32_t);

// Writes a shard atomically (temp file + fsync + rename); at most INT32_MAX tokens.
void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens);

class TokenShard {
 public:
  // Maps `path` and validates magic, version and size (file size == 1024 + 2 * count); throws
  // memtrain::Error naming the file, the offset and the values found.
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  std::size_t size() const { return count_; }
  const std::uint16_t* tokens() const { return tokens_; }
  std::uint16_t operator[](std::size_t i) const { return tokens_[i]; }
  const std::string& path() const { return path_; }

  // Throws if any token id is >= vocab_size, naming the first one, its index and its byte offset.
  void check_vocab(std::int64_t vocab_size) const;

 private:
  void release();

  std::string path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const std::uint16_t* tokens_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace memtrain::data
