// llm.c token shards: atomic writer and mmap reader.
#include "memtrain/data/token_shard.h"

#include "io/atomic_file.h"
#include "memtrain/core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

namespace memtrain::data {

static_assert(std::endian::native == std::endian::little, "shards store little-endian values as in memory");

namespace {
constexpr const char* kOpen = "TokenShard";
}  // namespace

void write_token_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  MT_CHECK(tokens.size() <= static_cast<std::size_t>(INT32_MAX), "write_token_shard",
           "'{}': {} tokens do not fit the int32 count of the header", path, tokens.size());
  std::array<std::int32_t, 256> header{};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<std::int32_t>(tokens.size());
  detail::AtomicFileWriter out(path, "write_token_shard");
  out.write(header.data(), sizeof(header));
  if (!tokens.empty()) out.write(tokens.data(), tokens.size() * sizeof(std::uint16_t));
  out.commit();
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, kOpen, "'{}': cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    detail::throw_error(kOpen, fmt::format("'{}': stat failed: {}", path, std::strerror(err)));
  }
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size < kTokenShardHeaderBytes) {
    ::close(fd);
    detail::throw_error(kOpen, fmt::format("'{}': truncated: file is {} bytes, shorter than the {}-byte header",
                                           path, file_size, kTokenShardHeaderBytes));
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  MT_CHECK(map != MAP_FAILED, kOpen, "'{}': mmap of {} bytes failed: {}", path, file_size, std::strerror(err));
  map_ = map;
  map_bytes_ = file_size;

  // From here a throw must unmap: the destructor does not run for a constructor that throws.
  try {
    std::int32_t header[3];
    std::memcpy(header, map_, sizeof(header));
    MT_CHECK(header[0] == kTokenShardMagic, kOpen, "'{}': bad magic {} at offset 0, expected {}", path, header[0],
             kTokenShardMagic);
    MT_CHECK(header[1] == kTokenShardVersion, kOpen, "'{}': unsupported version {} at offset 4, expected {}", path,
             header[1], kTokenShardVersion);
    MT_CHECK(header[2] >= 0, kOpen, "'{}': negative token count {} at offset 8", path, header[2]);
    const std::uint64_t want = kTokenShardHeaderBytes + 2 * static_cast<std::uint64_t>(header[2]);
    MT_CHECK(file_size == want, kOpen,
             "'{}': {}: token count {} at offset 8 needs a file of {} bytes (1024 + 2 x {}), but it is {} bytes",
             path, file_size < want ? "truncated" : "trailing bytes", header[2], want, header[2], file_size);
    count_ = static_cast<std::size_t>(header[2]);
    tokens_ = reinterpret_cast<const std::uint16_t*>(static_cast<const char*>(map_) + kTokenShardHeaderBytes);
  } catch (...) {
    release();
    throw;
  }
}

TokenShard::~TokenShard() { release(); }

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void TokenShard::release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

void TokenShard::check_vocab(std::int64_t vocab_size) const {
  MT_CHECK(vocab_size > 0, "TokenShard::check_vocab", "'{}': vocab size {} must be positive", path_, vocab_size);
  for (std::size_t i = 0; i < count_; ++i) {
    MT_CHECK(static_cast<std::int64_t>(tokens_[i]) < vocab_size, "TokenShard::check_vocab",
             "'{}': token {} at index {} (offset {}) is >= vocab size {}", path_, tokens_[i], i,
             kTokenShardHeaderBytes + 2 * i, vocab_size);
  }
}

}  // namespace memtrain::data
