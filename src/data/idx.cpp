// IDX reader. zlib's gzread reads gzip and plain files alike, so one path serves both; offsets in errors
// are positions in the decompressed stream.
#include "memtrain/data/idx.h"

#include "memtrain/core/allocator.h"

#include <zlib.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace memtrain::data {

namespace {

constexpr const char* kWhere = "read_idx";
constexpr int kTypeU8 = 0x08;
constexpr std::uint64_t kMaxDeflateRatio = 1032;  // zlib's technical report: deflate's largest expansion

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    MT_CHECK(f_ != nullptr, kWhere, "'{}': cannot open: {}", path, errno ? std::strerror(errno) : "out of memory");
  }
  ~GzFile() { gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; returns how many arrived (fewer only at the end of the stream).
  std::size_t read(void* data, std::size_t n) {
    auto* p = static_cast<unsigned char*>(data);
    std::size_t got = 0;
    while (got < n) {
      unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, INT_MAX / 2));
      int r = gzread(f_, p + got, chunk);
      if (r < 0) {
        int err = 0;
        const char* msg = gzerror(f_, &err);
        detail::throw_error(kWhere, fmt::format("'{}': read failed at offset {}: {}", path_, offset_ + got, msg));
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    offset_ += got;
    return got;
  }
  std::size_t offset() const { return offset_; }
  bool is_plain() { return gzdirect(f_) == 1; }

 private:
  std::string path_;
  gzFile f_;
  std::size_t offset_ = 0;
};

}  // namespace

Tensor read_idx(const std::string& path) {
  GzFile f(path);
  unsigned char magic[4];
  std::size_t got = f.read(magic, 4);
  MT_CHECK(got == 4, kWhere, "'{}': truncated: file ends at offset {} inside the 4-byte magic", path, got);
  const std::uint32_t magic_value = (std::uint32_t{magic[0]} << 24) | (std::uint32_t{magic[1]} << 16) |
                                    (std::uint32_t{magic[2]} << 8) | magic[3];
  MT_CHECK(magic[0] == 0 && magic[1] == 0, kWhere,
           "'{}': bad magic 0x{:08X} at offset 0: an IDX file starts with two zero bytes (0x0000TTDD)", path,
           magic_value);
  MT_CHECK(magic[2] == kTypeU8, kWhere,
           "'{}': unsupported element type code 0x{:02X} at offset 2 (magic 0x{:08X}); only 0x08 (unsigned byte) "
           "is read",
           path, magic[2], magic_value);
  const int ndim = magic[3];
  MT_CHECK(ndim >= 1, kWhere, "'{}': magic 0x{:08X} at offset 0 gives 0 dimensions", path, magic_value);

  Shape shape;
  std::uint64_t numel = 1;
  // The product with each 0 counted as 1, which the tensor's strides reach: bounded like numel, or
  // [0, 2^31, 2^31, 2^31] (numel 0) overflows Tensor::empty's strides (found by tests/fuzz/fuzz_idx.cpp).
  std::uint64_t span = 1;
  for (int d = 0; d < ndim; ++d) {
    unsigned char b[4];
    const std::size_t at = f.offset();
    got = f.read(b, 4);
    MT_CHECK(got == 4, kWhere, "'{}': truncated: file ends at offset {} inside dimension {} of {} (at offset {})",
             path, at + got, d, ndim, at);
    std::uint64_t v = (std::uint64_t{b[0]} << 24) | (std::uint64_t{b[1]} << 16) | (std::uint64_t{b[2]} << 8) | b[3];
    MT_CHECK(!__builtin_mul_overflow(span, std::max<std::uint64_t>(v, 1), &span) && span <= (std::uint64_t{1} << 40),
             kWhere,
             "'{}': dimensions {} x {} (at offset {}) give an implausible element count", path, shape_str(shape), v,
             at);
    numel *= v;  // <= span
    shape.push_back(static_cast<std::int64_t>(v));
  }
  const std::size_t data_at = f.offset();
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (f.is_plain()) {
      // A plain file's size is known, so a truncated one fails before the tensor is allocated.
      MT_CHECK(size >= data_at + numel, kWhere,
               "'{}': truncated: shape {} needs {} data bytes from offset {}, but the file ends at offset {}", path,
               shape_str(shape), numel, data_at, size);
    } else {
      // Deflate expands at most 1032:1, so a gzip file cannot hold more than that: a header that claims more
      // is refused before its tensor is allocated (a 100-byte file must not allocate a terabyte).
      const std::uint64_t most = kMaxDeflateRatio * size + 4096;
      MT_CHECK(data_at + numel <= most, kWhere,
               "'{}': shape {} needs {} bytes after decompression, more than a {}-byte gzip file can hold ({})", path,
               shape_str(shape), data_at + numel, size, most);
    }
  }

  Tensor t;
  {
    CategoryGuard guard(MemoryCategory::data);
    t = Tensor::empty(shape, DType::u8);
  }
  got = f.read(t.data_ptr(), numel);
  MT_CHECK(got == numel, kWhere,
           "'{}': truncated: shape {} needs {} data bytes from offset {}, but the data ends at offset {}", path,
           shape_str(shape), numel, data_at, data_at + got);
  unsigned char extra;
  MT_CHECK(f.read(&extra, 1) == 0, kWhere, "'{}': unexpected bytes after the data, from offset {}", path,
           data_at + numel);
  return t;
}

}  // namespace memtrain::data
